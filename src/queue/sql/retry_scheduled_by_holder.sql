-- retry_scheduled_by_holder: when the agent's own complete of claim $3 scheduled a retry and the
-- order has not been claimed since, the retry time that complete answered (docs/design.md §5 "Retry
-- safety"). Active again after a retry means: the claim is the order's last, no claim is live,
-- the reaper did not release it (no reclaimed/released attempt), and the retry time is set (a
-- claim clears it).
-- $1 order id (uuid)
-- $2 agent id (uuid)
-- $3 claim id (uuid)
SELECT w.next_retry_after FROM work_orders w
WHERE w.id = $1 AND w.last_claimed_by = $2 AND w.last_claim_id = $3
  AND w.status IN ('RETRY_PENDING', 'PENDING') AND w.next_retry_after IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM work_order_claims c WHERE c.work_order_id = w.id)
  AND NOT EXISTS (SELECT 1 FROM work_order_attempts r
                  WHERE r.claim_id = w.last_claim_id AND r.ended IN ('reclaimed', 'released'))
