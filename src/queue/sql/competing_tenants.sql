-- competing_tenants: up to two tenants with a turn (tenant_turns, docs/design.md §3), which is
-- all queue::turns needs to know whether tenants compete for agents (two) or claims may walk
-- priority and age alone (one or none: the tenant, NULL for the orders without one).
SELECT tenant FROM tenant_turns LIMIT 2
