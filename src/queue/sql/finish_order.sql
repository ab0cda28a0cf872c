-- finish_order: moves an active order to the log (docs/design.md §2: a finished order leaves
-- work_orders in the transaction that finishes it); any live claim row goes with it, in this
-- statement (no foreign key cascades it: the migration claims_without_cascade).
-- The caller holds the order's row lock. Used by a failed complete, cancel and the reaper; a
-- successful complete is complete_success.sql.
-- $1 order id (uuid)
-- $2 outcome (text: succeeded, failed, cancelled)
-- $3 message (text, NULL = none)
-- $4 last_error (text, NULL = keep the order's; when set, last_error_at becomes now())
-- $5, $6, $7 the claim live at the end: agent id, claim id (uuid, NULL = the order's last
--     claim), claimed_at (timestamptz, NULL = none)
-- $8 ended_by (text: agent, disruption (the agent's complete of a disrupted attempt), reaper,
--    cancel), so a late heartbeat can be told why
-- Returns the log entry without yaml_content.
WITH w AS (DELETE FROM work_orders WHERE id = $1 RETURNING *),
claim AS (DELETE FROM work_order_claims WHERE work_order_id = $1),
ending AS (
  SELECT w.id, $2::text AS outcome, $3::text AS message, COALESCE($4, w.last_error) AS last_error,
         CASE WHEN $4::text IS NULL THEN w.last_error_at ELSE now() END AS last_error_at,
         COALESCE($5, w.last_claimed_by) AS claimed_by, COALESCE($6, w.last_claim_id) AS claim_id,
         $7::timestamptz AS claimed_at, $8::text AS ended_by
  FROM w
)
-- @include log_insert.sql
