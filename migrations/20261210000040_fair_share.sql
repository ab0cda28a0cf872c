-- Fair share between tenants (docs/design.md §3, issue #40): of the orders an agent may take, the
-- tenant served least recently goes first, then priority, then age.

-- One key per tenant, orders without a tenant being one tenant ('' is no valid tenant name).
-- A digest rather than the name: a tenant may be 4096 characters, past what a btree entry holds.
ALTER TABLE work_orders ADD COLUMN tenant_key uuid
  GENERATED ALWAYS AS (md5(COALESCE(tenant, ''))::uuid) STORED;

-- The walk inside one tenant, in hand-out order: only rows that are or will become claimable.
CREATE INDEX work_orders_turn ON work_orders (tenant_key, priority DESC, created_at, id)
  WHERE status IN ('PENDING', 'RETRY_PENDING');
-- Whether a tenant still has any order, claimed ones included: a claimed order may come back
-- (reaped, failed with retries left) without an insert (queue::turns drops a turn when not).
CREATE INDEX work_orders_tenant ON work_orders (tenant_key);

-- A row per tenant with orders, and when a claim last served it. Claims walk these in served
-- order and each tenant's orders through work_orders_turn, so the decision reads a few rows,
-- never the whole backlog. Written by the trigger below (a new tenant waits from its first
-- order's creation), by claims while tenants compete (serve_turns.sql) and by queue::turns,
-- which deletes the turns of tenants without orders under a table lock that waits for creations
-- in flight (so an order never exists without its tenant's turn).
CREATE TABLE tenant_turns (
    tenant_key uuid PRIMARY KEY,
    -- NULL: the orders without a tenant
    tenant     text,
    served_at  timestamptz NOT NULL
);
CREATE INDEX tenant_turns_served ON tenant_turns (served_at, tenant_key);

INSERT INTO tenant_turns (tenant_key, tenant, served_at)
SELECT tenant_key, min(tenant), min(created_at) FROM work_orders GROUP BY tenant_key;

-- Every insert of orders, whatever statement makes it, gives their tenants a turn. Statement
-- level: one insert into tenant_turns per statement, not per order.
CREATE FUNCTION pullman_tenant_turns() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Only tenants without a turn: ON CONFLICT alone would wait for every claim in flight that
    -- moved the tenant's turn. In key order, so two statements adding the same new tenants
    -- cannot deadlock.
    INSERT INTO tenant_turns (tenant_key, tenant, served_at)
    SELECT DISTINCT n.tenant_key, n.tenant, now() FROM new_orders n
    WHERE NOT EXISTS (SELECT 1 FROM tenant_turns t WHERE t.tenant_key = n.tenant_key)
    ORDER BY n.tenant_key
    ON CONFLICT (tenant_key) DO NOTHING;
    RETURN NULL;
END
$$;
CREATE TRIGGER work_orders_tenant_turns AFTER INSERT ON work_orders
    REFERENCING NEW TABLE AS new_orders
    FOR EACH STATEMENT EXECUTE FUNCTION pullman_tenant_turns();
