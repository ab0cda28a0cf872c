-- queue_position: how many orders go before a queued one (docs/design.md §10 `queued`): orders
-- earlier in hand-out order (priority, then created_at, id: docs/design.md §11) that are eligible now for at least one of the agents
-- that could take it (queue::waiting::Verdict::takers). The agent relation a of the eligibility
-- rule is built per agent inside a LATERAL sub-query, so each agent's orders are found with one
-- walk of the claimable rows (a per-order EXISTS was several times slower at 1M orders).
-- The count stops at $3 (queue::limits::MAX_POSITION_COUNTED + 1): each agent's walk stops
-- there, and so does the count, so $3 in the answer means "$3 or more".
-- $1 order id (uuid)
-- $2 the agents that could claim it now (uuid[])
-- $3 most orders counted (bigint)
SELECT count(*) FROM (
SELECT DISTINCT ahead.id
FROM agents ag
CROSS JOIN LATERAL (
  WITH a AS (
    SELECT ag.id, ag.name, ag.labels, ag.annotation_pairs, ag.work_types, ag.tenant,
           ag.retired_at, '{}'::text[] AS requested_types
  )
  SELECT w.id FROM work_orders w
  WHERE
    -- @include eligible.sql
    AND (w.priority > (SELECT o.priority FROM work_orders o WHERE o.id = $1)
         OR (w.priority = (SELECT o.priority FROM work_orders o WHERE o.id = $1)
             AND (w.created_at, w.id)
                 < (SELECT o.created_at, o.id FROM work_orders o WHERE o.id = $1)))
  LIMIT $3
) ahead
WHERE ag.id = ANY ($2::uuid[])
LIMIT $3
) counted
