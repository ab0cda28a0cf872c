-- queue_position: how many orders go before a queued one (docs/design.md §10 `queued`) in §3's
-- hand-out order, among the orders eligible now for at least one of the agents that could take
-- it (queue::waiting::Verdict::takers), were they to claim one order at a time with nothing new
-- arriving. Tenants take turns in the order they were last served, and a turn hands out its
-- tenant's first order (priority, then age). So first go the k orders of its own tenant that
-- come before it, and from every other tenant one order in each of those k turns, plus one
-- when that tenant's turn comes before the order's own: min(its eligible orders, k or k + 1).
-- A taker bound to a tenant sees no other tenant's orders, so it adds none of theirs. Orders
-- whose concurrency key is full now are passed over, as the claims pass over them; orders of a
-- key with free slots all count, so several of one key ahead may overstate the position.
-- Each count stops at $3 (queue::limits::MAX_POSITION_COUNTED + 1), and so does the sum, so $3
-- in the answer means "$3 or more".
-- $1 order id (uuid)
-- $2 the agents that could claim it now (uuid[])
-- $3 most orders counted (bigint)
WITH me AS (
  SELECT o.id, o.tenant_key, o.priority, o.created_at,
         COALESCE(t.served_at, '-infinity') AS served_at
  FROM work_orders o LEFT JOIN tenant_turns t ON t.tenant_key = o.tenant_key
  WHERE o.id = $1
),
-- Each taker as the eligibility rule's agent relation a, which the walks below rebuild per taker.
takers AS (
  SELECT ag.id, ag.name, ag.labels, ag.annotation_pairs, ag.work_types, ag.tenant, ag.retired_at,
         '{}'::text[] AS requested_types
  FROM agents ag WHERE ag.id = ANY ($2::uuid[])
),
own AS (
  SELECT count(*) AS k FROM (
    SELECT DISTINCT ahead.id
    FROM takers ag CROSS JOIN me
    CROSS JOIN LATERAL (
      WITH a AS (SELECT ag.*)
      SELECT w.id FROM work_orders w
      WHERE w.tenant_key = me.tenant_key
        AND (w.priority > me.priority
             OR (w.priority = me.priority AND (w.created_at, w.id) < (me.created_at, me.id)))
        AND
        -- @include eligible.sql
        AND NOT
        -- @include key_full.sql
      LIMIT $3
    ) ahead
  ) mine
),
others AS (
  SELECT t.tenant_key,
         least($3, (SELECT k FROM own)
                   + CASE WHEN (t.served_at, t.tenant_key) < (me.served_at, me.tenant_key)
                          THEN 1 ELSE 0 END) AS turns
  FROM tenant_turns t CROSS JOIN me
  WHERE t.tenant_key <> me.tenant_key
),
taken AS (
  SELECT o.tenant_key, least(count(DISTINCT x.id), min(o.turns)) AS n
  FROM others o
  CROSS JOIN takers ag
  CROSS JOIN LATERAL (
    WITH a AS (SELECT ag.*)
    SELECT w.id FROM work_orders w
    WHERE w.tenant_key = o.tenant_key
      AND
      -- @include eligible.sql
      AND NOT
      -- @include key_full.sql
    LIMIT o.turns
  ) x
  -- Once its own tenant alone reaches the bound, no other tenant is read.
  WHERE ag.tenant IS NULL AND o.turns > 0 AND (SELECT k FROM own) < $3
  GROUP BY o.tenant_key
)
SELECT least($3, (SELECT k FROM own) + COALESCE((SELECT sum(n) FROM taken), 0))::bigint
