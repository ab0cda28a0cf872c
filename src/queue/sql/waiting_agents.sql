-- waiting_agents: every live agent with what docs/design.md §10's reasons need (queue::waiting): its
-- side of eligibility, its contact (queue::rules::agent_health, at the database's now()) and how
-- many claims it holds (max_concurrency).
SELECT a.id, a.name, a.labels, a.annotations, a.work_types, a.tenant, a.max_concurrency,
       a.lease_seconds, a.last_seen_at, now() AS now,
       (SELECT count(*) FROM work_order_claims c WHERE c.agent_id = a.id) AS held
FROM agents a
WHERE a.retired_at IS NULL
ORDER BY a.name
