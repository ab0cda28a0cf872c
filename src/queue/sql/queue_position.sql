-- queue_position: how many orders go before a queued one (docs/design.md §10 `queued`): orders
-- earlier in hand-out order (created_at, id) that are eligible now for at least one of the agents
-- that could take it (queue::waiting::Verdict::takers). The agent relation a of the eligibility
-- rule is built per agent inside a LATERAL sub-query, so each agent's orders are found with one
-- walk of the claimable rows (a per-order EXISTS was several times slower at 1M orders).
-- $1 order id (uuid)
-- $2 the agents that could claim it now (uuid[])
SELECT count(DISTINCT ahead.id)
FROM agents ag
CROSS JOIN LATERAL (
  WITH a AS (
    SELECT ag.id, ag.name, ag.labels, ag.annotation_pairs, ag.work_types, ag.tenant,
           ag.retired_at, '{}'::text[] AS requested_types
  )
  SELECT w.id FROM work_orders w
  WHERE
    -- eligible (queue::eligibility::ELIGIBLE_SQL, verbatim)
    w.status IN ('PENDING', 'RETRY_PENDING')
    AND (w.status = 'PENDING' OR w.next_retry_after <= now())
    AND (SELECT retired_at IS NULL FROM a)
    AND (w.target_agent_ids @> ARRAY[(SELECT id FROM a)]
         OR w.target_agent_names @> ARRAY[(SELECT name FROM a)]
         OR w.target_labels && (SELECT labels FROM a)
         OR w.target_annotation_pairs && (SELECT annotation_pairs FROM a))
    AND (cardinality((SELECT work_types FROM a)) = 0
         OR w.work_type = ANY ((SELECT work_types FROM a)::text[]))
    AND (cardinality((SELECT requested_types FROM a)) = 0
         OR w.work_type = ANY ((SELECT requested_types FROM a)::text[]))
    AND ((SELECT tenant FROM a) IS NULL OR w.tenant = (SELECT tenant FROM a))
    -- end eligible
    AND (w.created_at, w.id) < (SELECT o.created_at, o.id FROM work_orders o WHERE o.id = $1)
) ahead
WHERE ag.id = ANY ($2::uuid[])
