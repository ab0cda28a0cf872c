-- claim_rows (a fragment, not a statement): records the claims the statement's `claimants` CTE
-- pairs (work_order_id, claim_id, agent_id: the orders its walk chose, each with its claim's id
-- and the agent that takes it) and marks those orders CLAIMED. Included (`-- @include
-- claim_rows.sql`, build.rs) by take_claim.sql (one agent's claims) and group_claim_rows.sql
-- (one claim each for several agents: claim_next_group.sql and claim_next_group_fair.sql).
-- $3 lease seconds (int, NULL = no lease)
-- Each claim lasts claim_timeout_seconds from now (its deadline); the lease, when given, ends at
-- the earlier of now + lease and the deadline (docs/design.md §2). An order with a concurrency
-- key is claimed only if the key has a free slot, which the insert takes (the migration's
-- trigger, docs/design.md §3): an order whose slot was taken meanwhile gets no claim row, so
-- `upd` leaves it waiting.
claim AS (
  INSERT INTO work_order_claims (work_order_id, claim_id, agent_id, claimed_at, deadline,
                                 lease_seconds, lease_expires_at, concurrency_slot,
                                 concurrency_max)
  SELECT w.id, c.claim_id, c.agent_id, now(),
         now() + make_interval(secs => w.claim_timeout_seconds),
         $3::int,
         CASE WHEN $3::int IS NULL THEN NULL
              ELSE LEAST(now() + make_interval(secs => $3::int),
                         now() + make_interval(secs => w.claim_timeout_seconds)) END,
         w.concurrency_slot, w.concurrency_max
  FROM claimants c JOIN work_orders w ON w.id = c.work_order_id
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
