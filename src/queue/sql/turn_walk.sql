-- turn_walk (a fragment, not a statement): the `turns`, `target` and `served` CTEs of
-- claim_next_fair.sql and claim_next_capped_fair.sql (which say WITH RECURSIVE for `turns`), the
-- claims while tenants compete (queue::turns). `target` is the orders agent `a` is handed, in
-- hand-out order (docs/design.md §3): the tenants in the order they were last served (`turns`:
-- tenant_turns, least recently first; an agent bound to a tenant reads its own turn only), and
-- in each tenant work_orders_turn walked by priority (higher first), then age, stopping at the
-- first rows eligible for `a`, at most as many as $2 has claim ids. A multi-claim takes from
-- one tenant before the next, as single claims would that all came before that tenant's next
-- turn. Empty when a.walks is false. The rule is a per-row sub-select for the reason
-- handout_walk.sql gives. `turns` steps through tenant_turns_served one turn at a time, each
-- step one index probe, and only as far as `target` reads it: written as one ordered scan, the
-- planner sorted every turn at every claim.
turns AS (
  (SELECT t.served_at, t.tenant_key FROM tenant_turns t
   WHERE (SELECT walks FROM a) AND (SELECT tenant FROM a) IS NULL
   ORDER BY t.served_at, t.tenant_key
   LIMIT 1)
  UNION ALL
  (SELECT t.served_at, t.tenant_key FROM tenant_turns t
   WHERE (SELECT walks FROM a) AND t.tenant_key = md5((SELECT tenant FROM a))::uuid)
  UNION ALL
  SELECT next.served_at, next.tenant_key
  FROM turns cur
  CROSS JOIN LATERAL (
    SELECT t.served_at, t.tenant_key FROM tenant_turns t
    WHERE (SELECT tenant FROM a) IS NULL
      AND (t.served_at, t.tenant_key) > (cur.served_at, cur.tenant_key)
    ORDER BY t.served_at, t.tenant_key
    LIMIT 1
  ) next
),
target AS (
  SELECT pick.id, turns.tenant_key
  FROM turns
  CROSS JOIN LATERAL (
    SELECT w.id FROM work_orders w
    WHERE w.tenant_key = turns.tenant_key
      AND w.status IN ('PENDING', 'RETRY_PENDING')
      AND (SELECT
      -- @include eligible.sql
      AND NOT
      -- @include key_full.sql
      )
    ORDER BY w.priority DESC, w.created_at, w.id
    LIMIT cardinality($2::uuid[])
    FOR UPDATE SKIP LOCKED
  ) pick
  LIMIT cardinality($2::uuid[])
),
-- @include serve_turns.sql
