-- backlog: how many unclaimed orders an agent, or an agent profile not yet registered, may take
-- now, and the longest wait among them (docs/design.md §10 GET /agents/{id}/backlog): eligible and due,
-- whether or not the agent has room. The agent relation a is built from the parameters, so one
-- statement answers both; the eligibility conjuncts walk the work_orders_claimable index.
-- $1 agent id (uuid; a fresh one for a profile, which no order targets)
-- $2 agent name (text; NULL for a profile)
-- $3 labels (text[])
-- $4 annotation pairs (text[], queue::eligibility::annotation_pairs)
-- $5 work types (text[], empty = all)
-- $6 tenant (text, NULL = instance-wide)
-- $7 retired at (timestamptz, NULL = live)
-- Returns the count, the seconds since the longest-waiting one last became unclaimed (0 when
-- none), as waiting_order.sql counts them, and the claims the agent holds now (in flight; 0 for a
-- profile, whose fresh id holds none), as count_held_claims.sql counts them.
WITH a AS (
  SELECT $1::uuid AS id, $2::text AS name, $3::text[] AS labels, $4::text[] AS annotation_pairs,
         $5::text[] AS work_types, $6::text AS tenant, $7::timestamptz AS retired_at,
         '{}'::text[] AS requested_types
)
SELECT count(*) AS count,
       COALESCE(floor(EXTRACT(EPOCH FROM (now() - min(w.updated_at)))), 0)::bigint
         AS oldest_seconds,
       (SELECT count(*) FROM work_order_claims WHERE agent_id = $1) AS claimed
FROM work_orders w
WHERE
  -- @include eligible.sql
  AND NOT
  -- @include key_full.sql
