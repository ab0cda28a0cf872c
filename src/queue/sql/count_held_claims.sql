-- count_held_claims: how many claims an agent holds now (docs/design.md §3 rule 4, max_concurrency).
-- $1 agent id (uuid)
SELECT count(*) FROM work_order_claims WHERE agent_id = $1
