-- group_agents (a fragment, not a statement): the `untargeted`, `g`, `lead`, `members` and `a`
-- CTEs of claim_next_group.sql and claim_next_group_fair.sql (group claims, queue::claims::group):
-- the agents of $1 locked FOR KEY SHARE, which of them may be members of the group (its
-- eligibility is their shared profile), and `a`, what the hand-out walk reads as the claiming
-- agent: the members' shared profile, at most one order a member (`most`).
-- $1 the agents' ids (uuid[]), $2 their new claims' ids (uuid[]), $4 requested work types (text[])
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
