-- claim_next_capped: claims the oldest order eligible for an agent (docs/design.md §3), inside the
-- transaction of an agent with max_concurrency, after lock_claimer.sql locked its row and
-- count_held_claims.sql found it under its cap (a later statement than the lock, so it sees
-- claims committed while the lock was awaited).
-- $1 agent id (uuid)
-- $2 the new claim id (uuid)
-- $3 lease seconds (int, NULL = no lease)
-- $4 requested work types (text[], empty = any)
-- Returns the claimed order with yaml_content and its claim, or no row.
WITH a AS (
  SELECT id, name, labels, annotation_pairs, work_types, tenant, retired_at,
         $4::text[] AS requested_types
  FROM agents WHERE id = $1
),
target AS (
  SELECT w.id FROM work_orders w
  WHERE
    -- eligible (queue::eligibility::ELIGIBLE_SQL, verbatim)
    w.status IN ('PENDING', 'RETRY_PENDING')
    AND (w.status = 'PENDING' OR w.next_retry_after <= now())
    AND (SELECT retired_at IS NULL FROM a)
    AND (w.target_agent_ids @> ARRAY[(SELECT id FROM a)]
         OR w.target_agent_names @> ARRAY[(SELECT name FROM a)]
         OR w.target_labels && (SELECT labels FROM a)
         OR w.target_annotation_pairs && (SELECT annotation_pairs FROM a))
    AND (cardinality((SELECT work_types FROM a)) = 0
         OR w.work_type = ANY ((SELECT work_types FROM a)::text[]))
    AND (cardinality((SELECT requested_types FROM a)) = 0
         OR w.work_type = ANY ((SELECT requested_types FROM a)::text[]))
    AND ((SELECT tenant FROM a) IS NULL OR w.tenant = (SELECT tenant FROM a))
    -- end eligible
  ORDER BY w.created_at, w.id
  LIMIT 1
  FOR UPDATE SKIP LOCKED
),
-- take_claim (sql/take_claim.sql, verbatim)
claim AS (
  INSERT INTO work_order_claims (work_order_id, claim_id, agent_id, claimed_at, deadline,
                                 lease_seconds, lease_expires_at)
  SELECT w.id, $2, $1, now(), now() + make_interval(secs => w.claim_timeout_seconds),
         $3::int,
         CASE WHEN $3::int IS NULL THEN NULL
              ELSE LEAST(now() + make_interval(secs => $3::int),
                         now() + make_interval(secs => w.claim_timeout_seconds)) END
  FROM target JOIN work_orders w ON w.id = target.id
  RETURNING *
),
upd AS (
  UPDATE work_orders w SET status = 'CLAIMED', last_claimed_by = claim.agent_id,
         last_claim_id = claim.claim_id, next_retry_after = NULL, updated_at = now()
  FROM claim WHERE w.id = claim.work_order_id
  RETURNING w.*
)
-- end take_claim
-- claimed_order (sql/claimed_order.sql, verbatim)
SELECT w.id, w.work_type, w.yaml_content, w.status, w.max_retries, w.backoff_seconds,
       w.claim_timeout_seconds, w.max_reclaims, w.tenant, w.target_agent_ids,
       w.target_agent_names, w.target_labels, w.target_annotations, w.retry_count,
       w.reclaim_count, w.last_error, w.last_error_at, w.next_retry_after,
       c.agent_id AS claimed_by, c.claimed_at, c.claim_id, c.lease_seconds, c.lease_expires_at,
       w.rerun_of, w.created_at, w.updated_at
FROM upd w JOIN claim c ON c.work_order_id = w.id
