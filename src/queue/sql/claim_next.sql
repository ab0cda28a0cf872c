-- claim_next: claims the oldest order eligible for an agent (docs/design.md §3) in one statement, one
-- round trip and one commit (issue #7), for an agent without max_concurrency; a capped agent's
-- claim is the transaction of claim_next_capped.sql (see queue::claims). Records the agent's
-- contact at most once a second (or when its lease changes).
-- $1 agent id (uuid)
-- $2 the new claim id (uuid)
-- $3 lease seconds (int, NULL = no lease)
-- $4 requested work types (text[], empty = any)
-- Returns one row when the agent exists: the agent's columns (a_*) and the claimed order's
-- (all NULL when nothing was claimed: none eligible, agent retired, or agent capped).
-- Lock order agent → order → claim (queue docs): each CTE that locks later reads the earlier
-- one through a sub-query, so the earlier one has run first. The agent row is locked FOR NO KEY
-- UPDATE (which waits for a retirement in flight) rather than rewritten.
WITH a AS (
  SELECT id, name, labels, annotations, annotation_pairs, work_types, tenant, max_concurrency,
         retired_at, $4::text[] AS requested_types
  FROM agents WHERE id = $1
  FOR NO KEY UPDATE
),
contact AS (
  UPDATE agents SET last_seen_at = now(), lease_seconds = COALESCE($3::int, lease_seconds)
  WHERE id = (SELECT id FROM a)
    AND (last_seen_at IS NULL OR last_seen_at < now() - interval '1 second'
         OR lease_seconds IS DISTINCT FROM COALESCE($3::int, lease_seconds))
),
target AS (
  SELECT w.id FROM work_orders w
  WHERE (SELECT max_concurrency IS NULL FROM a)
    -- eligible (queue::eligibility::ELIGIBLE_SQL, verbatim)
    AND w.status IN ('PENDING', 'RETRY_PENDING')
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
SELECT a.id AS a_id, a.name AS a_name, a.labels AS a_labels, a.annotations AS a_annotations,
       a.work_types AS a_work_types,
       a.tenant AS a_tenant, a.max_concurrency AS a_max_concurrency,
       a.retired_at AS a_retired_at, o.*
FROM a LEFT JOIN (
  -- claimed_order (sql/claimed_order.sql, verbatim)
  SELECT w.id, w.work_type, w.yaml_content, w.status, w.max_retries, w.backoff_seconds,
         w.claim_timeout_seconds, w.max_reclaims, w.tenant, w.target_agent_ids,
         w.target_agent_names, w.target_labels, w.target_annotations, w.retry_count,
         w.reclaim_count, w.last_error, w.last_error_at, w.next_retry_after,
         c.agent_id AS claimed_by, c.claimed_at, c.claim_id, c.lease_seconds, c.lease_expires_at,
         w.rerun_of, w.created_at, w.updated_at
  FROM upd w JOIN claim c ON c.work_order_id = w.id
) o ON true
