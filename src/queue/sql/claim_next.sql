-- claim_next: claims the first orders in hand-out order (priority, then age: docs/design.md §3,
-- §11) eligible for an agent (as many as $2 has
-- claim ids, one for a plain claim-next) in one statement, one
-- round trip and one commit (issue #7), for an agent without max_concurrency; a capped agent's
-- claim is the transaction of claim_next_capped.sql (see queue::claims). Records the agent's
-- contact at most once a second (or when its lease changes).
-- $1 agent id (uuid)
-- $2 the new claims' ids (uuid[]): one per order it may claim (multi-claim, `max_orders`)
-- $3 lease seconds (int, NULL = no lease)
-- $4 requested work types (text[], empty = any)
-- Returns a row per claimed order: the agent's columns (a_*) and the order's; or, when nothing
-- was claimed (none eligible, agent retired, or agent capped), one row with the agent's columns
-- and the order's all NULL; no row for an unknown agent.
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
-- The walk: work_orders_handout in hand-out order (priority, then age), stopping at the first eligible row. The rule
-- is a per-row sub-select on purpose: written as top-level conditions, the planner (which cannot
-- estimate the agent's targeting, read from `a`) turned its disjuncts into a BitmapOr over the
-- work_orders_target_* GIN indexes and sorted every eligible order to hand out one, a cost that
-- grows with the backlog (10 ms per claim at 10k pending). A sub-select cannot be an index
-- condition, so the only path is the ordered walk; the rule's text stays the fragment's.
target AS (
  SELECT w.id FROM work_orders w
  WHERE w.status IN ('PENDING', 'RETRY_PENDING')
    AND (SELECT max_concurrency IS NULL FROM a)
    AND (SELECT
    -- @include eligible.sql
    )
  ORDER BY w.priority DESC, w.created_at, w.id
  LIMIT cardinality($2::uuid[])
  FOR UPDATE SKIP LOCKED
),
-- @include take_claim.sql
SELECT a.id AS a_id, a.name AS a_name, a.labels AS a_labels, a.annotations AS a_annotations,
       a.work_types AS a_work_types,
       a.tenant AS a_tenant, a.max_concurrency AS a_max_concurrency,
       a.retired_at AS a_retired_at, o.*
FROM a LEFT JOIN (
  -- @include claimed_order.sql
) o ON true
