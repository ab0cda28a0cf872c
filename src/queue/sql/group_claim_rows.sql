-- group_claim_rows (a fragment, not a statement): what claim_next_group.sql and
-- claim_next_group_fair.sql do after their walk (`target`, `idle`): each agent's contact, the
-- n-th order of `target` claimed for the n-th member (claim_rows.sql), and a row per agent of $1
-- as claim_next_group.sql describes, with `idle_turns`, the turns queue::turns parks after the
-- commit (turn_walk.sql's `idle`; empty in the plain walk).
-- $3 lease seconds (int, NULL = no lease)
-- Each agent's contact, as claiming_agent.sql records one agent's: at most once a second (or
-- when its lease changes), never waiting for a row another statement writes.
contact AS (
  UPDATE agents SET last_seen_at = now(), lease_seconds = COALESCE($3::int, lease_seconds)
  WHERE id IN (SELECT id FROM agents WHERE id IN (SELECT id FROM g)
               FOR NO KEY UPDATE SKIP LOCKED)
    AND (last_seen_at IS NULL OR last_seen_at < now() - interval '1 second'
         OR lease_seconds IS DISTINCT FROM COALESCE($3::int, lease_seconds))
),
claimants AS (
  SELECT t.id AS work_order_id, m.claim_id, m.id AS agent_id
  FROM (SELECT id, row_number() OVER () AS n FROM target) t
  JOIN members m ON m.n = t.n
),
-- @include claim_rows.sql
SELECT g.id AS a_id, g.name AS a_name, g.labels AS a_labels, g.annotations AS a_annotations,
       g.work_types AS a_work_types, g.tenant AS a_tenant,
       g.max_concurrency AS a_max_concurrency, g.retired_at AS a_retired_at,
       g.id IN (SELECT id FROM members) AS member,
       (SELECT count(*) FROM target) < (SELECT count(*) FROM members) AS short,
       g.id IN (SELECT agent_id FROM claimants)
         AND g.id NOT IN (SELECT agent_id FROM claim) AS contended,
       ARRAY(SELECT tenant_key FROM idle) AS idle_turns, o.*
FROM g LEFT JOIN (
  -- @include claimed_order.sql
) o ON o.claimed_by = g.id
ORDER BY g.n
