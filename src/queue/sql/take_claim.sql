-- take_claim (a fragment, not a statement): records the claim on the order chosen by the
-- statement's `target` CTE and marks the order CLAIMED. Included (`-- @include take_claim.sql`,
-- build.rs) by claim_next.sql, claim_next_capped.sql, their _fair twins and claim_by_id.sql,
-- which number their parameters alike for it.
-- $1 agent id (uuid), $2 the new claims' ids (uuid[], one per order the statement may claim:
-- its length is the most it claims), $3 lease seconds (int, NULL = no lease)
-- The n-th order of `target` gets the n-th claim id. Each claim lasts claim_timeout_seconds from
-- now (its deadline); the lease, when given, ends at the earlier of now + lease and the
-- deadline (docs/design.md §2). An order with a concurrency key is claimed only if the key has a
-- free slot, which the insert takes (the migration's trigger, docs/design.md §3): an order whose
-- slot was taken meanwhile gets no claim row, so `upd` leaves it waiting.
claim AS (
  INSERT INTO work_order_claims (work_order_id, claim_id, agent_id, claimed_at, deadline,
                                 lease_seconds, lease_expires_at, concurrency_slot,
                                 concurrency_max)
  SELECT w.id, ids.claim_id, $1, now(), now() + make_interval(secs => w.claim_timeout_seconds),
         $3::int,
         CASE WHEN $3::int IS NULL THEN NULL
              ELSE LEAST(now() + make_interval(secs => $3::int),
                         now() + make_interval(secs => w.claim_timeout_seconds)) END,
         w.concurrency_slot, w.concurrency_max
  FROM (SELECT id, row_number() OVER () AS n FROM target) t
  JOIN unnest($2::uuid[]) WITH ORDINALITY AS ids (claim_id, n) ON ids.n = t.n
  JOIN work_orders w ON w.id = t.id
  RETURNING *
),
upd AS (
  UPDATE work_orders w SET status = 'CLAIMED', last_claimed_by = claim.agent_id,
         last_claim_id = claim.claim_id, next_retry_after = NULL, updated_at = now()
  FROM claim WHERE w.id = claim.work_order_id
    -- The same rows again, as an index condition: a generic plan cannot tell how many orders
    -- `claim` holds (up to cardinality($2)), and with two tenants it guessed enough to hash
    -- them against a sequential scan of work_orders at every claim (queue::claims::plan).
    AND w.id = ANY (ARRAY(SELECT work_order_id FROM claim))
  RETURNING w.*
)
