-- Priority (docs/design.md §11, issue #40): of the orders an agent may take, the higher priority
-- is handed out first, then the oldest. Fair share between tenants, which §11 puts before
-- priority, is not built yet.

-- Higher first, default 0; bounds in queue::limits::PRIORITY.
ALTER TABLE work_orders ADD COLUMN priority integer NOT NULL DEFAULT 0;
ALTER TABLE work_order_log ADD COLUMN priority integer NOT NULL DEFAULT 0;

-- The claim's walk, in hand-out order: only rows that are or will become claimable, like
-- work_orders_claimable (which the counts and the oldest-claimable gauge keep walking).
CREATE INDEX work_orders_handout ON work_orders (priority DESC, created_at, id)
  WHERE status IN ('PENDING', 'RETRY_PENDING');
