-- idle_turns: the tenants that have a turn (tenant_turns) but no order left, claimed ones
-- included (docs/design.md §3), at most $1 of them: what drop_idle_turns.sql may delete. Read
-- without a lock, before it is taken, so the lock is held only for drop_idle_turns.sql's few
-- index probes; usually nothing, and then no lock is taken at all.
-- $1 most turns returned (bigint)
SELECT t.tenant_key FROM tenant_turns t
WHERE NOT EXISTS (SELECT 1 FROM work_orders w WHERE w.tenant_key = t.tenant_key)
LIMIT $1
