-- complete_success: a successful complete in one statement, one round trip and one commit
-- (issue #7): ends the agent's live claim and moves the order to the log as succeeded
-- (docs/design.md §2). Lock order agent → order → claim (queue docs): each CTE that locks later reads
-- the earlier one through a sub-query, so the earlier one has run first. The agent row is
-- locked FOR NO KEY UPDATE rather than rewritten; its contact is recorded at most once a second
-- (as record_contact.sql).
-- $1 order id (uuid)
-- $2 agent id (uuid)
-- $3 claim id (uuid, NULL = the agent's live claim, whichever it is)
-- $4 message (text, NULL = none)
-- Returns the log entry without yaml_content, or no row when the agent holds no live claim on
-- the order (the caller explains the 409 or replays an earlier answer).
WITH ag AS (SELECT id FROM agents WHERE id = $2 FOR NO KEY UPDATE),
contact AS (
  UPDATE agents SET last_seen_at = now()
  WHERE id = (SELECT id FROM ag)
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
w AS (DELETE FROM work_orders WHERE id = $1 AND EXISTS (SELECT 1 FROM claim) RETURNING *)
INSERT INTO work_order_log (id, work_type, yaml_content, max_retries, backoff_seconds,
                            claim_timeout_seconds, max_reclaims, tenant, targeting, outcome,
                            message, retry_count, reclaim_count, last_error, last_error_at,
                            claimed_by, claim_id, claimed_at, source, ended_by, rerun_of,
                            created_at, completed_at)
SELECT w.id, w.work_type, w.yaml_content, w.max_retries, w.backoff_seconds,
       w.claim_timeout_seconds, w.max_reclaims, w.tenant,
       jsonb_build_object('agent_ids', to_jsonb(w.target_agent_ids),
                          'agent_names', to_jsonb(w.target_agent_names),
                          'labels', to_jsonb(w.target_labels),
                          'annotations', w.target_annotations),
       'succeeded', $4, w.retry_count, w.reclaim_count, w.last_error, w.last_error_at,
       claim.agent_id, claim.claim_id, claim.claimed_at, w.source, 'agent', w.rerun_of,
       w.created_at, now()
FROM w CROSS JOIN claim
RETURNING id, work_type, NULL::text AS yaml_content, outcome, message, max_retries,
          backoff_seconds, claim_timeout_seconds, max_reclaims, tenant, targeting, retry_count,
          reclaim_count, last_error, last_error_at, claimed_by, claim_id, claimed_at, rerun_of,
          created_at, completed_at
