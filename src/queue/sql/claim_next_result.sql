-- claim_next_result (a fragment, not a statement): what the claim-next statements (claim_next.sql,
-- claim_next_fair.sql and their _capped twins) return, a row per claimed order with the agent's
-- columns (a_*), or one row with the agent's columns and the order's all NULL when nothing was
-- claimed. `contended`: the walk picked an order that got no claim, because another transaction
-- took its key's last slot after this statement's snapshot (take_claim.sql); queue::claims then
-- tries again rather than answer "nothing" while other orders wait. `idle_turns`: the tenant
-- turns queue::turns parks after the commit (turn_walk.sql's `idle`; empty in the plain walk).
SELECT a.id AS a_id, a.name AS a_name, a.labels AS a_labels, a.annotations AS a_annotations,
       a.work_types AS a_work_types,
       a.tenant AS a_tenant, a.max_concurrency AS a_max_concurrency,
       a.retired_at AS a_retired_at,
       (SELECT count(*) FROM target) > (SELECT count(*) FROM claim) AS contended,
       ARRAY(SELECT tenant_key FROM idle) AS idle_turns, o.*
FROM a LEFT JOIN (
  -- @include claimed_order.sql
) o ON true
