-- insert_order: a new PENDING order (docs/design.md §2), returned as written (no claim). Inserts
-- nothing, and returns no row, when the id is active already or finished (in the log).
-- $1 id (uuid)
-- $2 work type (text)
-- $3 yaml_content (text)
-- $4 max_retries, $5 backoff_seconds, $6 claim_timeout_seconds, $7 max_reclaims (int)
-- $8 tenant (text, NULL = none)
-- $9 target agent ids (uuid[]), $10 target agent names (text[]), $11 target labels (text[]),
-- $12 target annotations (jsonb), $13 the annotations as key=value pairs (text[],
--     queue::eligibility::annotation_pairs)
-- $14 source (text: api or kubernetes)
-- $15 the finished order this one re-runs (uuid, NULL = none)
WITH w AS (
  INSERT INTO work_orders (id, work_type, yaml_content, max_retries, backoff_seconds,
                           claim_timeout_seconds, max_reclaims, tenant, target_agent_ids,
                           target_agent_names, target_labels, target_annotations,
                           target_annotation_pairs, status, source, rerun_of)
  SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, 'PENDING', $14, $15
  WHERE NOT EXISTS (SELECT 1 FROM work_order_log WHERE id = $1)
  ON CONFLICT (id) DO NOTHING
  RETURNING *
)
SELECT w.id, w.work_type, w.yaml_content, w.status, w.max_retries, w.backoff_seconds,
       w.claim_timeout_seconds, w.max_reclaims, w.tenant, w.target_agent_ids,
       w.target_agent_names, w.target_labels, w.target_annotations, w.retry_count,
       w.reclaim_count, w.last_error, w.last_error_at, w.next_retry_after,
       c.agent_id AS claimed_by, c.claimed_at, c.claim_id, c.lease_seconds, c.lease_expires_at,
       w.rerun_of, w.created_at, w.updated_at
FROM w LEFT JOIN work_order_claims c ON false
