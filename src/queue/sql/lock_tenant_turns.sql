-- lock_tenant_turns: the lock drop_idle_turns.sql runs under. SHARE ROW EXCLUSIVE waits for
-- every transaction that has inserted orders (the work_orders_tenant_turns trigger writes
-- tenant_turns) or claimed (take_claim.sql) to end, and holds new ones off until this commits,
-- so the drop sees every committed order and no order is created without its tenant's turn.
LOCK TABLE tenant_turns IN SHARE ROW EXCLUSIVE MODE
