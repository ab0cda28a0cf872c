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
-- $16 priority (int, docs/design.md §3)
-- $17 concurrency key (text, NULL = none), $18 its max (int), $19 on conflict (text: queue or
--     supersede) (docs/design.md §3 "Concurrency keys"; supersede.sql runs after it)
-- $20 retry_on_disruption (text: never or safe, docs/design.md §12)
-- A tenant's first active order gives it a turn (tenant_turns, the migration's trigger).
WITH w AS (
  INSERT INTO work_orders (id, work_type, yaml_content, max_retries, backoff_seconds,
                           claim_timeout_seconds, max_reclaims, tenant, target_agent_ids,
                           target_agent_names, target_labels, target_annotations,
                           target_annotation_pairs, status, source, rerun_of, priority,
                           concurrency_key, concurrency_max, concurrency_on_conflict,
                           retry_on_disruption)
  SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, 'PENDING', $14, $15, $16,
         $17, $18, $19, $20
  WHERE NOT EXISTS (SELECT 1 FROM work_order_log WHERE id = $1)
  ON CONFLICT (id) DO NOTHING
  RETURNING *
),
-- The key's slot row, for its claims to lock (the migration's pullman_take_slot).
slot AS (
  INSERT INTO concurrency_slots (slot, held)
  SELECT w.concurrency_slot, 0 FROM w WHERE w.concurrency_slot IS NOT NULL
  ON CONFLICT (slot) DO NOTHING
)
SELECT w.yaml_content,
       -- @include order_columns.sql
FROM w LEFT JOIN work_order_claims c ON false
