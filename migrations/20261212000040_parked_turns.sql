-- Parked turns (docs/design.md §3 "Parked turns", issue #40). A tenant whose orders are all
-- claimed (or gone) has nothing to hand out, yet its turn stayed in the claims' walk: never
-- served again, it rose to the front and every claim stepped past it, one index probe each, until
-- maintenance dropped it (once a minute, and only when the tenant had no order at all, so never
-- while a long build ran). With 10,000 tenants a claim walked thousands of such turns. A parked
-- turn has served_at = 'infinity': last in walk order, so claims reach it only when nothing before
-- it is eligible (it stays in the walk: an order stranded behind it is late, never lost). When it
-- was last served is kept in last_served_at, and an unparked turn takes its place by it: a tenant
-- whose orders come one at a time, each claimed at once, is not sent to the back each time.
--
-- Parking and unparking must not miss each other. A claim's snapshot cannot see an order created
-- after it, so claims never park: they name the turns that look idle (turn_walk.sql), and after
-- their commit queue::turns calls pullman_park_turns, which takes the tenant's lock before it
-- looks. Every statement that makes an order claimable (insert; a claimed order back to PENDING or
-- RETRY_PENDING) takes the same lock shared before it unparks, and holds it to its commit. So a
-- park either sees the order (the creation committed before the park's look), or fails to take
-- the lock (the creation is in flight), or makes the creation wait for its commit and then be seen.
-- Requeues, many rows a statement, unpark without the lock (pullman_order_requeued, below).

ALTER TABLE tenant_turns ADD COLUMN last_served_at timestamptz;
-- The latest service of a parked turn: where the back of the walk is (serve_turns.sql).
CREATE INDEX tenant_turns_parked ON tenant_turns (last_served_at)
  WHERE served_at = 'infinity';

-- The transaction lock of a tenant's turn: (class, the first 32 bits of tenant_key). Two tenants
-- sharing the bits only make a park give up or a creation wait a moment.
CREATE FUNCTION pullman_turn_lock_key(tenant_key uuid) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ('x' || left(replace(tenant_key::text, '-', ''), 8))::bit(32)::integer;

-- Parks the turns of `keys` whose tenants have no PENDING or RETRY_PENDING order; returns how
-- many it parked. A turn whose lock is held (an order of it being created) or whose row is held
-- (a claim serving it) is left live: whoever holds it makes it live anyway, or a later claim names
-- it again. In READ COMMITTED each statement of a volatile function reads a fresh snapshot, so
-- the look below sees every order committed before the locks were taken; in a stricter level the
-- look would read the transaction's first snapshot, so nothing is parked there. It waits for
-- nothing: the table lock its update needs is taken first, NOWAIT (queued behind maintenance's
-- LOCK TABLE, it would hold creations of these tenants waiting on its locks meanwhile).
CREATE FUNCTION pullman_park_turns(keys uuid[]) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    k uuid;
    locked uuid[] := '{}';
    parked integer;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN 0;
    END IF;
    BEGIN
        LOCK TABLE tenant_turns IN ROW EXCLUSIVE MODE NOWAIT;
    EXCEPTION WHEN lock_not_available THEN
        RETURN 0;
    END;
    FOREACH k IN ARRAY keys LOOP
        IF pg_try_advisory_xact_lock(1953396078, pullman_turn_lock_key(k)) THEN
            locked := locked || k;
        END IF;
    END LOOP;
    UPDATE tenant_turns t SET served_at = 'infinity', last_served_at = t.served_at
    FROM (SELECT x.tenant_key FROM tenant_turns x
          WHERE x.tenant_key = ANY (locked) AND x.served_at < 'infinity'
          FOR NO KEY UPDATE SKIP LOCKED) p
    WHERE t.tenant_key = p.tenant_key
      AND NOT EXISTS (SELECT 1 FROM work_orders w
                      WHERE w.tenant_key = t.tenant_key
                        AND w.status IN ('PENDING', 'RETRY_PENDING'));
    GET DIAGNOSTICS parked = ROW_COUNT;
    RETURN parked;
END
$$;

-- Unparks the turns of `keys`, each back at the time it was last served (now, for a turn parked
-- some other way); returns how many. Called where orders become claimable, in their transaction.
-- The shared lock waits for a park in flight and holds new ones off until this commits; taken for
-- at most 64 tenants, as each lock is an entry of the shared lock table until the commit: a
-- statement creating orders of more tenants unparks them without it, and a park that misses one
-- of them is caught by maintenance (pullman_unpark_stranded_turns). A turn another transaction
-- holds (a claim serving it, another unpark) is awaited, then looked at again: skipping it would
-- let this order commit while its turn is still parked. In key order, so unparks of the same
-- tenants cannot deadlock; parks and claims never wait for a turn.
CREATE FUNCTION pullman_unpark_turns(keys uuid[]) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    unparked integer;
BEGIN
    IF cardinality(keys) <= 64 THEN
        PERFORM pg_advisory_xact_lock_shared(1953396078, l)
        FROM (SELECT DISTINCT pullman_turn_lock_key(k) AS l FROM unnest(keys) k ORDER BY 1) s;
    END IF;
    UPDATE tenant_turns t SET served_at = COALESCE(t.last_served_at, now()), last_served_at = NULL
    FROM (SELECT x.tenant_key FROM tenant_turns x
          WHERE x.tenant_key = ANY (keys) AND x.served_at = 'infinity'
          ORDER BY x.tenant_key
          FOR NO KEY UPDATE) p
    WHERE t.tenant_key = p.tenant_key AND t.served_at = 'infinity';
    GET DIAGNOSTICS unparked = ROW_COUNT;
    RETURN unparked;
END
$$;

-- Maintenance's repair: unparks up to `most` parked turns whose tenants have orders to hand out
-- (the creations of many tenants at once that a park missed, above); returns how many.
CREATE FUNCTION pullman_unpark_stranded_turns(most integer) RETURNS integer LANGUAGE sql AS $$
SELECT pullman_unpark_turns(ARRAY(
    SELECT t.tenant_key FROM tenant_turns t
    WHERE t.served_at = 'infinity'
      AND EXISTS (SELECT 1 FROM work_orders w
                  WHERE w.tenant_key = t.tenant_key
                    AND w.status IN ('PENDING', 'RETRY_PENDING'))
    LIMIT most))
$$;

-- Insert of orders: a turn for each new tenant (as before), and the parked turns of the others
-- unparked.
CREATE OR REPLACE FUNCTION pullman_tenant_turns() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Only tenants without a turn: ON CONFLICT alone would wait for every claim in flight that
    -- moved the tenant's turn. In key order, so two statements adding the same new tenants
    -- cannot deadlock.
    INSERT INTO tenant_turns (tenant_key, tenant, served_at)
    SELECT DISTINCT n.tenant_key, n.tenant, now() FROM new_orders n
    WHERE NOT EXISTS (SELECT 1 FROM tenant_turns t WHERE t.tenant_key = n.tenant_key)
    ORDER BY n.tenant_key
    ON CONFLICT (tenant_key) DO NOTHING;
    PERFORM pullman_unpark_turns(ARRAY(
        SELECT DISTINCT n.tenant_key FROM new_orders n
        WHERE n.status IN ('PENDING', 'RETRY_PENDING')));
    RETURN NULL;
END
$$;

-- A claimed order back in the queue (reaped, failed with retries left, released): its tenant's
-- turn unparked. The WHEN keeps every other update (claims above all) from calling anything. Row
-- by row, so unlike pullman_unpark_turns it neither waits nor takes the tenant's lock: one
-- statement requeues up to a thousand orders of as many tenants in no set order, and two such
-- statements waiting for each other's turns would deadlock (and a thousand transaction locks
-- could fill the shared lock table). A turn another transaction holds is skipped; one a park
-- in flight parks anyway is left to maintenance's repair, and its orders are late, not lost.
CREATE FUNCTION pullman_order_requeued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tenant_turns t
    SET served_at = COALESCE(t.last_served_at, now()), last_served_at = NULL
    FROM (SELECT x.tenant_key FROM tenant_turns x
          WHERE x.tenant_key = NEW.tenant_key AND x.served_at = 'infinity'
          FOR NO KEY UPDATE SKIP LOCKED) p
    WHERE t.tenant_key = p.tenant_key;
    RETURN NULL;
END
$$;
CREATE TRIGGER work_orders_requeued AFTER UPDATE OF status ON work_orders
    FOR EACH ROW
    WHEN (NEW.status IN ('PENDING', 'RETRY_PENDING')
          AND OLD.status NOT IN ('PENDING', 'RETRY_PENDING'))
    EXECUTE FUNCTION pullman_order_requeued();
