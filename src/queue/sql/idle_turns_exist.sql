-- idle_turns_exist: whether a tenant has a turn (tenant_turns) but no active order, so
-- drop_idle_turns.sql has work (docs/design.md §3). Read without a lock: a cheap look that
-- spares the table lock when, as usually, there is nothing to drop.
SELECT EXISTS (
  SELECT 1 FROM tenant_turns t
  WHERE NOT EXISTS (SELECT 1 FROM work_orders w WHERE w.tenant_key = t.tenant_key)
)
