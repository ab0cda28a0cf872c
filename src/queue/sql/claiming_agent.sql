-- claiming_agent (a fragment, not a statement): the `a` and `contact` CTEs of claim_next.sql and
-- claim_next_fair.sql. `a` is the claiming agent, locked FOR KEY SHARE: that waits only for
-- what locks the row FOR UPDATE (the second step of a retirement, await_agent_statements.sql, and
-- maintenance's lock_retired_agent.sql), so an agent's claims and completes run side by side (FOR NO KEY UPDATE here made one agent of
-- 16 slots wait on its own row, each statement until the last one's commit: issue #34).
-- `walks` is false for an agent with max_concurrency, whose claim is the transaction of
-- claim_next_capped(_fair).sql; `most` is how many orders the walk may take (handout_walk.sql). `contact` records the agent's contact at most once a second (or
-- when its lease changes) and never waits: its row lock is SKIP LOCKED, so while another
-- statement writes the row (which records the contact too) this one leaves it. Not waiting is
-- what rules out a deadlock: `contact` runs at the end of the statement, after the orders'
-- locks, where a heartbeat takes the agent's row first.
-- $1 agent id (uuid), $3 lease seconds (int, NULL = no lease), $4 requested work types (text[])
a AS (
  SELECT id, name, labels, annotations, annotation_pairs, work_types, tenant, max_concurrency,
         retired_at, $4::text[] AS requested_types, max_concurrency IS NULL AS walks,
         cardinality($2::uuid[]) AS most
  FROM agents WHERE id = $1
  FOR KEY SHARE
),
contact AS (
  UPDATE agents SET last_seen_at = now(), lease_seconds = COALESCE($3::int, lease_seconds)
  WHERE id = (SELECT id FROM agents WHERE id = (SELECT id FROM a)
              FOR NO KEY UPDATE SKIP LOCKED)
    AND (last_seen_at IS NULL OR last_seen_at < now() - interval '1 second'
         OR lease_seconds IS DISTINCT FROM COALESCE($3::int, lease_seconds))
),
