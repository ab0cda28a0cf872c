-- get_agent: one agent with what its derived health needs (queue::rules::agent_health).
-- $1 agent id (uuid)
SELECT a.id, a.name, a.labels, a.annotations, a.work_types, a.tenant, a.max_concurrency,
       a.lease_seconds, a.created_at, a.last_seen_at, a.retired_at, now() AS now,
       (SELECT count(*) FROM work_order_claims c WHERE c.agent_id = a.id) AS active_claims
FROM agents a WHERE a.id = $1
