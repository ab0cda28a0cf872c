-- find_expired_claims: claims the reaper releases (docs/design.md §2): past their deadline or their
-- lease, i.e. not live. Takes the orders and claims with SKIP LOCKED, so replicas never wait on
-- each other or count twice.
-- $1 batch size (bigint)
SELECT c.work_order_id, c.agent_id, c.claim_id, c.claimed_at, w.reclaim_count, w.max_reclaims
FROM work_order_claims c JOIN work_orders w ON w.id = c.work_order_id
WHERE NOT (
  -- @include live_claim.sql
)
LIMIT $1
FOR UPDATE OF w, c SKIP LOCKED
