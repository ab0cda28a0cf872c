-- claiming_agent (a fragment, not a statement): the `a` and `contact` CTEs of claim_next.sql and
-- claim_next_fair.sql. `a` is the claiming agent, locked FOR NO KEY UPDATE (which waits for a
-- retirement in flight) rather than rewritten; `walks` is false for an agent with
-- max_concurrency, whose claim is the transaction of claim_next_capped(_fair).sql. `contact`
-- records the agent's contact at most once a second (or when its lease changes).
-- $1 agent id (uuid), $3 lease seconds (int, NULL = no lease), $4 requested work types (text[])
a AS (
  SELECT id, name, labels, annotations, annotation_pairs, work_types, tenant, max_concurrency,
         retired_at, $4::text[] AS requested_types, max_concurrency IS NULL AS walks
  FROM agents WHERE id = $1
  FOR NO KEY UPDATE
),
contact AS (
  UPDATE agents SET last_seen_at = now(), lease_seconds = COALESCE($3::int, lease_seconds)
  WHERE id = (SELECT id FROM a)
    AND (last_seen_at IS NULL OR last_seen_at < now() - interval '1 second'
         OR lease_seconds IS DISTINCT FROM COALESCE($3::int, lease_seconds))
),
