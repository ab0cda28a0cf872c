-- lock_tenant_turns: the lock drop_idle_turns.sql runs under. SHARE ROW EXCLUSIVE waits for
-- every transaction that has inserted orders (the work_orders_tenant_turns trigger takes ROW
-- EXCLUSIVE on tenant_turns even when the tenant has its turn) or moved a turn (serve_turns.sql),
-- and holds new ones off until this commits, so the drop sees every committed order and no
-- order is created without its tenant's turn. Claims that keep no turn (one tenant) do not wait.
LOCK TABLE tenant_turns IN SHARE ROW EXCLUSIVE MODE
