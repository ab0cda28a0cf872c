-- completed_by_holder: the log entry of an order finished by the agent's own complete of claim
-- $3, without yaml_content (docs/design.md §5 "Retry safety": a repeated complete gets it again).
-- 'disruption' is the holder's own complete too: of a disrupted attempt (docs/design.md §12).
-- $1 order id (uuid)
-- $2 agent id (uuid)
-- $3 claim id (uuid)
SELECT NULL::text AS yaml_content,
       -- @include log_columns.sql
FROM work_order_log
WHERE id = $1 AND ended_by IN ('agent', 'disruption') AND claimed_by = $2 AND claim_id = $3
