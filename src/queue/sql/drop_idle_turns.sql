-- drop_idle_turns: deletes the turns of tenants without an active order (docs/design.md §3),
-- so the claim's walk over tenant_turns (turn_walk.sql) does not grow with every tenant that
-- ever had an order. Runs after lock_tenant_turns.sql, in its transaction. A tenant whose
-- orders come back later gets a new turn, waiting since then.
DELETE FROM tenant_turns t
WHERE NOT EXISTS (SELECT 1 FROM work_orders w WHERE w.tenant_key = t.tenant_key)
