-- complete_success_many: the successful completes of several claims, of any agents, in one
-- statement and one commit (group commit, queue::group_commit): each ends its agent's live claim
-- and moves its order to the log as succeeded, exactly as complete_success.sql does for one.
-- $1 order ids (uuid[]; each at most once)
-- $2 agent ids (uuid[])
-- $3 claim ids (uuid[]; a NULL entry = that agent's live claim, whichever it is)
-- $4 messages (text[]; a NULL entry = none)
-- The n-th entries of the four arrays are one complete.
-- Returns a log entry (without yaml_content) for each complete whose agent held the live claim;
-- the others change nothing and return no row (the caller answers them one by one, as for
-- complete_success.sql: a 409, or the answer to an earlier identical complete).
-- Lock order agent → order → claim, as in complete_success.sql, and within each kind by id, so
-- two of these statements, or one and a single complete, never wait on each other in a cycle;
-- the agents FOR KEY SHARE and their contact never waited for (SKIP LOCKED), as there.
WITH input AS (
  SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[])
    AS i (order_id, agent_id, claim_id, message)
),
ag AS (
  SELECT id FROM agents WHERE id IN (SELECT agent_id FROM input)
  ORDER BY id
  FOR KEY SHARE
),
contact AS (
  UPDATE agents SET last_seen_at = now()
  WHERE id IN (SELECT id FROM agents WHERE id IN (SELECT id FROM ag) FOR NO KEY UPDATE SKIP LOCKED)
    AND (last_seen_at IS NULL OR last_seen_at < now() - interval '1 second')
),
held AS (
  SELECT o.id FROM work_orders o
  WHERE o.id IN (SELECT i.order_id FROM input i WHERE i.agent_id IN (SELECT id FROM ag))
  ORDER BY o.id
  FOR UPDATE
),
claim AS (
  DELETE FROM work_order_claims c
  USING input i
  WHERE c.work_order_id = i.order_id AND c.work_order_id IN (SELECT id FROM held)
    AND c.agent_id = i.agent_id
    AND (i.claim_id IS NULL OR c.claim_id = i.claim_id)
    AND
    -- @include live_claim.sql
  RETURNING c.work_order_id, c.agent_id, c.claim_id, c.claimed_at, i.message
),
w AS (
  DELETE FROM work_orders WHERE id IN (SELECT work_order_id FROM claim) RETURNING *
),
ending AS (
  SELECT w.id, 'succeeded'::text AS outcome, claim.message, w.last_error, w.last_error_at,
         claim.agent_id AS claimed_by, claim.claim_id, claim.claimed_at, 'agent'::text AS ended_by
  FROM w JOIN claim ON claim.work_order_id = w.id
)
-- @include log_insert.sql
