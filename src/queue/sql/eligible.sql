-- eligible: docs/design.md §3 as SQL, a condition on order w and the one-row agent relation a
-- (id, name, labels, annotation_pairs, work_types, tenant, retired_at, requested_types). Included
-- (`-- @include eligible.sql`, build.rs) by pending_for_agent.sql, handout_walk.sql and
-- turn_walk.sql (the claim-next statements), queue_position.sql and backlog.sql; its Rust side
-- and the tests that keep them together are in queue::eligibility. The first conjunct repeats
-- the partial index predicate of work_orders_claimable, work_orders_handout and
-- work_orders_turn, so the planner walks those (the claims walk work_orders_handout, or
-- work_orders_turn while tenants compete, in hand-out order). Each targeting disjunct uses `@>` or
-- `&&` (`name = ANY (names)` would mean the same) so that the work_orders_target_* GIN indexes
-- serve a count over all eligible orders (backlog.sql) as a BitmapOr.
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
