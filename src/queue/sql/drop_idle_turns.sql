-- drop_idle_turns: deletes the turns of the tenants idle_turns.sql found without an order
-- (docs/design.md §3), so the claim's walk over tenant_turns (turn_walk.sql) does not grow with
-- every tenant that ever had an order; each is checked again, as an order may have been created
-- since. Runs after lock_tenant_turns.sql, in its transaction. A tenant whose orders come back
-- later gets a new turn, waiting since then.
-- $1 the tenants' keys (uuid[])
DELETE FROM tenant_turns t
WHERE t.tenant_key = ANY ($1::uuid[])
  AND NOT EXISTS (SELECT 1 FROM work_orders w WHERE w.tenant_key = t.tenant_key)
