-- complete_success: a successful complete in one statement, one round trip and one commit
-- (issue #7): ends the agent's live claim and moves the order to the log as succeeded
-- (docs/design.md §2). Lock order agent → order → claim (queue docs): each CTE that locks later reads
-- the earlier one through a sub-query, so the earlier one has run first. The agent row is
-- locked FOR KEY SHARE (it waits only for the second step of a retirement, so the agent's other
-- claims and completes go on beside it); its contact is recorded at most once a
-- second and never waited for (SKIP LOCKED, as claiming_agent.sql says why).
-- $1 order id (uuid)
-- $2 agent id (uuid)
-- $3 claim id (uuid, NULL = the agent's live claim, whichever it is)
-- $4 message (text, NULL = none)
-- Returns the log entry without yaml_content, or no row when the agent holds no live claim on
-- the order (the caller explains the 409 or replays an earlier answer).
WITH ag AS (SELECT id FROM agents WHERE id = $2 FOR KEY SHARE),
contact AS (
  UPDATE agents SET last_seen_at = now()
  WHERE id = (SELECT id FROM agents WHERE id = (SELECT id FROM ag) FOR NO KEY UPDATE SKIP LOCKED)
    AND (last_seen_at IS NULL OR last_seen_at < now() - interval '1 second')
),
held AS (SELECT id FROM work_orders WHERE id = $1 AND EXISTS (SELECT 1 FROM ag) FOR UPDATE),
claim AS (
  DELETE FROM work_order_claims c
  WHERE c.work_order_id = (SELECT id FROM held) AND c.agent_id = $2
    AND ($3::uuid IS NULL OR c.claim_id = $3)
    AND
    -- @include live_claim.sql
  RETURNING c.agent_id, c.claim_id, c.claimed_at
),
w AS (DELETE FROM work_orders WHERE id = $1 AND EXISTS (SELECT 1 FROM claim) RETURNING *),
ending AS (
  SELECT w.id, 'succeeded'::text AS outcome, $4::text AS message, w.last_error, w.last_error_at,
         claim.agent_id AS claimed_by, claim.claim_id, claim.claimed_at, 'agent'::text AS ended_by
  FROM w CROSS JOIN claim
)
-- @include log_insert.sql
