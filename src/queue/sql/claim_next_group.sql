-- claim_next_group: one order each for several agents whose claims arrived together (group
-- claims, queue::claims::group; issue #34), in one statement and one commit, while at most one
-- tenant has orders (the plain walk, handout_walk.sql).
-- $1 the agents' ids (uuid[], distinct, in the order their claims arrived)
-- $2 their new claims' ids (uuid[], one per agent, in the same order)
-- $3 lease seconds (int, NULL = no lease), the same for all of them
-- $4 requested work types (text[], empty = any), the same for all of them
-- Returns a row per agent of $1 that exists: its columns (a_*), whether it was a member of the
-- group (`member`), whether the walk ran short of members (`short`), whether it lost its order to
-- a concurrency key filled after the snapshot (`contended`), and its claimed order, or the
-- order's columns all NULL.
--
-- One walk serves every member: the orders eligible for the lead (the first agent that may be a
-- member) by its profile alone, not its id or name, in hand-out order (docs/design.md §3), the
-- n-th to the n-th member. That is right only for agents that may take exactly what the lead may,
-- so a member has the lead's labels, annotations, work types and tenant, no max_concurrency, is
-- not retired, and no PENDING or RETRY_PENDING order targets it (or the lead) by id or name
-- (checked through the targeting GIN indexes): for them eligibility does not depend on who they
-- are. Every other agent of $1 is
-- claimed for alone afterwards (queue::claims::group), as are members that got an order the walk
-- chose but no claim (`contended`). A member that got nothing while the walk ran `short` has
-- nothing it may take (but what other claims hold): it is answered so.
-- Lock order agent → order → claim, as claim_next.sql: the agents are locked FOR KEY SHARE in
-- `g`, which the walk reads (through `a`) first.
WITH
-- The agents of $1 that no PENDING or RETRY_PENDING order targets by id or name. An anti-join,
-- one GIN index probe an agent and target: as a sub-select per row, the planner expected a match
-- early in a scan of every order (13 ms for four agents over 10,000 orders).
untargeted AS (
  SELECT ag.id FROM agents ag
  WHERE ag.id = ANY ($1::uuid[])
    AND NOT EXISTS (SELECT 1 FROM work_orders w
                    WHERE w.status IN ('PENDING', 'RETRY_PENDING')
                      AND w.target_agent_ids @> ARRAY[ag.id])
    AND NOT EXISTS (SELECT 1 FROM work_orders w
                    WHERE w.status IN ('PENDING', 'RETRY_PENDING')
                      AND w.target_agent_names @> ARRAY[ag.name])
),
g AS (
  SELECT ag.id, ag.name, ag.labels, ag.annotations, ag.annotation_pairs, ag.work_types,
         ag.tenant, ag.max_concurrency, ag.retired_at, r.claim_id, r.n,
         ag.retired_at IS NULL AND ag.max_concurrency IS NULL
         AND ag.id IN (SELECT id FROM untargeted) AS may_join
  FROM unnest($1::uuid[], $2::uuid[]) WITH ORDINALITY AS r (agent_id, claim_id, n)
  JOIN agents ag ON ag.id = r.agent_id
  FOR KEY SHARE OF ag
),
lead AS (
  SELECT * FROM g WHERE may_join ORDER BY n LIMIT 1
),
members AS (
  SELECT g.id, g.claim_id, row_number() OVER (ORDER BY g.n) AS n
  FROM g, lead
  WHERE g.may_join
    AND (g.labels, g.annotation_pairs, g.work_types, g.tenant)
        IS NOT DISTINCT FROM (lead.labels, lead.annotation_pairs, lead.work_types, lead.tenant)
),
-- What eligible.sql and handout_walk.sql read as the claiming agent: the members' shared
-- profile, the lead's, without an id or a name (`@> ARRAY[NULL]` holds for no order), so the walk
-- takes only what every member may take even if an agent was renamed after `untargeted` looked;
-- at most one order a member. Empty (so the walk is too) when no agent may be a member.
a AS (
  SELECT NULL::uuid AS id, NULL::text AS name, labels, annotations, annotation_pairs,
         work_types, tenant, max_concurrency, retired_at, $4::text[] AS requested_types,
         true AS walks, (SELECT count(*) FROM members) AS most
  FROM lead
),
-- @include handout_walk.sql
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
       o.*
FROM g LEFT JOIN (
  -- @include claimed_order.sql
) o ON o.claimed_by = g.id
ORDER BY g.n
