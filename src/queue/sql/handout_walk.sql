-- handout_walk (a fragment, not a statement): the `target` CTE of claim_next.sql,
-- claim_next_capped.sql and claim_next_group.sql, the claims while at most one tenant has orders
-- (queue::turns): the orders agent `a` is handed, work_orders_handout walked in hand-out order
-- (priority, then age: docs/design.md §3), stopping at the first rows eligible for `a`, at most
-- a.most (as many as $2 has claim ids; in a group claim, as many as the group has members, so the
-- walk locks no order it will not claim). Empty when a.walks is false. The rule is a per-row sub-select on purpose: written
-- as top-level conditions, the planner (which cannot estimate the agent's targeting, read from
-- `a`) turned its disjuncts into a BitmapOr over the work_orders_target_* GIN indexes and sorted
-- every eligible order to hand out one, a cost that grows with the backlog (10 ms per claim at
-- 10k pending). A sub-select cannot be an index condition, so the only path is the ordered walk;
-- the rule's text stays the fragment's. The concurrency-key check (key_full.sql) sits in the same
-- sub-select: as a second one, the planner halved its estimate of the matching rows again and
-- chose a sort over a bitmap scan.
target AS (
  SELECT w.id FROM work_orders w
  WHERE w.status IN ('PENDING', 'RETRY_PENDING')
    AND (SELECT walks FROM a)
    AND (SELECT
    -- @include eligible.sql
    AND NOT
    -- @include key_full.sql
    )
  ORDER BY w.priority DESC, w.created_at, w.id
  LIMIT (SELECT most FROM a)
  FOR UPDATE SKIP LOCKED
),
-- No turn is served in this walk, so none is named idle (turn_walk.sql's `idle`).
idle AS (SELECT NULL::uuid AS tenant_key WHERE false),
