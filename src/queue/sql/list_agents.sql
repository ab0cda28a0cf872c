-- list_agents: agents in registration order, one page (docs/design.md §5 GET /agents).
-- $1 cursor: created_at of the previous page's last row (timestamptz, NULL = first page)
-- $2 cursor: id of the previous page's last row (uuid)
-- $3 page size (bigint)
SELECT a.id, a.name, a.labels, a.annotations, a.work_types, a.tenant, a.max_concurrency,
       a.lease_seconds, a.created_at, a.last_seen_at, a.retired_at, now() AS now,
       (SELECT count(*) FROM work_order_claims c WHERE c.agent_id = a.id) AS active_claims
FROM agents a
WHERE ($1::timestamptz IS NULL OR (a.created_at, a.id) > ($1, $2))
ORDER BY a.created_at, a.id
LIMIT $3
