-- claim_next_capped: claims the first orders in hand-out order (priority, then age; as many as $2 has claim ids) eligible for an agent (docs/design.md §3, §11), inside the
-- transaction of an agent with max_concurrency, after lock_claimer.sql locked its row and
-- count_held_claims.sql found it under its cap (a later statement than the lock, so it sees
-- claims committed while the lock was awaited).
-- $1 agent id (uuid)
-- $2 the new claims' ids (uuid[]): one per order it may claim (multi-claim, `max_orders`)
-- $3 lease seconds (int, NULL = no lease)
-- $4 requested work types (text[], empty = any)
-- Returns the claimed orders with yaml_content and their claims (no row when none).
WITH a AS (
  SELECT id, name, labels, annotation_pairs, work_types, tenant, retired_at,
         $4::text[] AS requested_types
  FROM agents WHERE id = $1
),
-- The ordered walk, the rule as a per-row sub-select: see claim_next.sql.
target AS (
  SELECT w.id FROM work_orders w
  WHERE w.status IN ('PENDING', 'RETRY_PENDING')
    AND (SELECT
    -- @include eligible.sql
    )
  ORDER BY w.priority DESC, w.created_at, w.id
  LIMIT cardinality($2::uuid[])
  FOR UPDATE SKIP LOCKED
),
-- @include take_claim.sql
-- @include claimed_order.sql
