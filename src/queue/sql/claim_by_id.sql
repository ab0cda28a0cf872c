-- claim_by_id: claims one order (docs/design.md §5 POST /work-orders/{id}/claim), inside the
-- transaction in which lock_claimer.sql locked the agent and claim_candidate.sql locked the
-- order and the Rust side of eligibility (queue::eligibility) admitted it.
-- $1 agent id (uuid)
-- $2 the new claim id (uuid)
-- $3 lease seconds (int, NULL = no lease)
-- $4 order id (uuid)
-- Returns the claimed order with yaml_content and its claim.
WITH target AS (SELECT $4::uuid AS id),
-- take_claim (sql/take_claim.sql, verbatim)
claim AS (
  INSERT INTO work_order_claims (work_order_id, claim_id, agent_id, claimed_at, deadline,
                                 lease_seconds, lease_expires_at)
  SELECT w.id, $2, $1, now(), now() + make_interval(secs => w.claim_timeout_seconds),
         $3::int,
         CASE WHEN $3::int IS NULL THEN NULL
              ELSE LEAST(now() + make_interval(secs => $3::int),
                         now() + make_interval(secs => w.claim_timeout_seconds)) END
  FROM target JOIN work_orders w ON w.id = target.id
  RETURNING *
),
upd AS (
  UPDATE work_orders w SET status = 'CLAIMED', last_claimed_by = claim.agent_id,
         last_claim_id = claim.claim_id, next_retry_after = NULL, updated_at = now()
  FROM claim WHERE w.id = claim.work_order_id
  RETURNING w.*
)
-- end take_claim
-- claimed_order (sql/claimed_order.sql, verbatim)
SELECT w.id, w.work_type, w.yaml_content, w.status, w.max_retries, w.backoff_seconds,
       w.claim_timeout_seconds, w.max_reclaims, w.tenant, w.target_agent_ids,
       w.target_agent_names, w.target_labels, w.target_annotations, w.retry_count,
       w.reclaim_count, w.last_error, w.last_error_at, w.next_retry_after,
       c.agent_id AS claimed_by, c.claimed_at, c.claim_id, c.lease_seconds, c.lease_expires_at,
       w.rerun_of, w.created_at, w.updated_at
FROM upd w JOIN claim c ON c.work_order_id = w.id
