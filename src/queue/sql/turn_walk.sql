-- turn_walk (a fragment, not a statement): the `turns`, `target` and `served` CTEs of
-- claim_next_fair.sql, claim_next_capped_fair.sql and claim_next_group_fair.sql (which say WITH
-- RECURSIVE for `turns`), the claims while tenants compete (queue::turns). `target` is the
-- orders agent `a` is handed, in hand-out order (docs/design.md §3): the tenants in the order
-- they were last served (`turns`: tenant_turns, least recently first; an agent bound to a tenant
-- reads its own turn only), and in each tenant work_orders_turn walked by priority (higher
-- first), then age, stopping at the first rows eligible for `a`, at most a.most (as many as $2
-- has claim ids; in a group claim, as many as the group has members). A multi-claim (and a
-- group) takes from one tenant before the next, as single claims would that all came before that
-- tenant's next turn. Empty when a.walks is false. The rule is a per-row sub-select for the
-- reason handout_walk.sql gives. `turns` steps through tenant_turns_served one turn at a time,
-- each step one index probe, and only as far as `target` reads it: written as one ordered scan,
-- the planner sorted every turn at every claim.
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
  SELECT pick.id, turns.tenant_key, turns.served_at, pick.priority, pick.created_at
  FROM turns
  CROSS JOIN LATERAL (
    SELECT w.id, w.priority, w.created_at FROM work_orders w
    WHERE w.tenant_key = turns.tenant_key
      AND w.status IN ('PENDING', 'RETRY_PENDING')
      AND (SELECT
      -- @include eligible.sql
      AND NOT
      -- @include key_full.sql
      )
    ORDER BY w.priority DESC, w.created_at, w.id
    LIMIT (SELECT most FROM a)
    FOR UPDATE SKIP LOCKED
  ) pick
  LIMIT (SELECT most FROM a)
),
-- @include serve_turns.sql
-- The turns that look idle in this statement's snapshot: the tenants served now that have no
-- PENDING or RETRY_PENDING order after the last one `target` takes from them (in hand-out order:
-- the index range past it, not the orders before it, whose completed rows the range would step
-- over one by one), and the live turns this walk stepped past before its first pick (the first
-- ones when it picked nothing), up to 8, that have none at all: claims that took a tenant's last
-- orders together each saw the other's as pending. queue::turns parks them after the commit (the
-- migration parked_turns: it looks again, under a lock, at all of the tenant's orders), so the
-- next claims do not step past them.
last_picks AS (
  SELECT DISTINCT ON (tenant_key) tenant_key, priority, created_at, id FROM target
  ORDER BY tenant_key, priority, created_at DESC, id DESC
),
idle AS (
  SELECT l.tenant_key FROM last_picks l
  WHERE NOT EXISTS (SELECT 1 FROM work_orders w
                    WHERE w.tenant_key = l.tenant_key
                      AND w.status IN ('PENDING', 'RETRY_PENDING')
                      AND w.priority = l.priority
                      AND (w.created_at, w.id) > (l.created_at, l.id))
    AND NOT EXISTS (SELECT 1 FROM work_orders w
                    WHERE w.tenant_key = l.tenant_key
                      AND w.status IN ('PENDING', 'RETRY_PENDING')
                      AND w.priority < l.priority)
  UNION
  SELECT x.tenant_key FROM (
    SELECT t.tenant_key FROM tenant_turns t
    WHERE (SELECT walks FROM a) AND (SELECT tenant FROM a) IS NULL
      AND t.served_at < 'infinity'
      -- One bound, an index condition: the first pick's turn, or past every live turn when
      -- there is none. Written as "no pick OR before the first pick", the OR kept it out of the
      -- index scan, which then read every live turn to keep none (10,000 turns: 3.4 of a
      -- claim's 4.1 ms, bench/README.md "Fair share").
      AND (t.served_at, t.tenant_key)
          < (SELECT f.served_at, f.tenant_key
             FROM (SELECT served_at, tenant_key FROM target
                   UNION ALL
                   SELECT 'infinity'::timestamptz, 'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid) f
             ORDER BY f.served_at, f.tenant_key LIMIT 1)
    ORDER BY t.served_at, t.tenant_key
    LIMIT 8
  ) x
  WHERE NOT EXISTS (SELECT 1 FROM work_orders w
                    WHERE w.tenant_key = x.tenant_key
                      AND w.status IN ('PENDING', 'RETRY_PENDING'))
),
