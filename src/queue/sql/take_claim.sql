-- take_claim (a fragment, not a statement): records the claims of one agent on the orders chosen
-- by the statement's `target` CTE and marks the orders CLAIMED. Included (`-- @include
-- take_claim.sql`, build.rs) by claim_next.sql, claim_next_capped.sql, their _fair twins and
-- claim_by_id.sql, which number their parameters alike for it.
-- $1 agent id (uuid), $2 the new claims' ids (uuid[], one per order the statement may claim:
-- its length is the most it claims), $3 lease seconds (int, NULL = no lease)
-- The n-th order of `target` gets the n-th claim id (claim_rows.sql does the rest).
claimants AS (
  SELECT t.id AS work_order_id, ids.claim_id, $1::uuid AS agent_id
  FROM (SELECT id, row_number() OVER () AS n FROM target) t
  JOIN unnest($2::uuid[]) WITH ORDINALITY AS ids (claim_id, n) ON ids.n = t.n
),
-- @include claim_rows.sql
