-- Concurrency keys (docs/design.md §3 "Concurrency keys", issue #40): an order may carry
-- concurrency {key, max, on_conflict}; at most `max` orders of one key (per tenant) hold a claim
-- at once. The slot is the claim row: taken by the trigger that admits the claim's insert, freed
-- by the trigger on its delete. Every way a claim ends (complete, cancel, reaper, retirement,
-- the cascade when an order leaves for the log) deletes its row, so a slot is freed exactly once
-- and a stale holder, whose row is already gone, frees nothing.

ALTER TABLE work_orders
  ADD COLUMN concurrency_key text,
  ADD COLUMN concurrency_max integer CHECK (concurrency_max IS NULL OR concurrency_max >= 1),
  ADD COLUMN concurrency_on_conflict text
    CHECK (concurrency_on_conflict IS NULL OR concurrency_on_conflict IN ('queue', 'supersede'));
-- The key's identity: the tenant and the key. A digest, as tenant_key, because both may be long;
-- md5 of the tenant is fixed-length, so no two (tenant, key) pairs share the digested text.
ALTER TABLE work_orders ADD COLUMN concurrency_slot uuid GENERATED ALWAYS AS (
  CASE WHEN concurrency_key IS NULL THEN NULL
       ELSE md5(md5(COALESCE(tenant, '')) || concurrency_key)::uuid END) STORED;
-- A key's waiting orders in hand-out order: the one a freed slot wakes, and what supersede cancels.
CREATE INDEX work_orders_slot ON work_orders (concurrency_slot, priority DESC, created_at, id)
  WHERE concurrency_slot IS NOT NULL AND status IN ('PENDING', 'RETRY_PENDING');

ALTER TABLE work_order_log
  ADD COLUMN concurrency_key text,
  ADD COLUMN concurrency_max integer,
  ADD COLUMN concurrency_on_conflict text;

-- The claim carries its order's slot and max (take_claim.sql), so the triggers below cost nothing
-- for an order without a key (their WHEN is false) and read nothing else for one with a key.
ALTER TABLE work_order_claims
  ADD COLUMN concurrency_slot uuid,
  ADD COLUMN concurrency_max integer;
CREATE INDEX work_order_claims_slot ON work_order_claims (concurrency_slot)
  WHERE concurrency_slot IS NOT NULL;

-- How many claims hold each key's slots. A row is made with the key's first order
-- (insert_order.sql) and kept while the key has orders (queue maintenance drops idle ones), so
-- a claim finds it and never has to insert one, which would wait on another claim inserting it.
CREATE TABLE concurrency_slots (
    slot uuid PRIMARY KEY,
    held integer NOT NULL CHECK (held >= 0),
    -- The key was full (a claim filled it, or found it full) since it last had no order waiting:
    -- claimers may be asleep on its orders, so each freed slot wakes one (pullman_free_slot).
    saturated boolean NOT NULL DEFAULT false
);

-- What a pullman_claimable notice says of an order (docs/design.md §3 wake-ups): its eligibility
-- facts, or only {id, work_type} past PostgreSQL's payload limit.
CREATE FUNCTION pullman_claimable_payload(o work_orders) RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    payload text;
BEGIN
    payload := json_build_object(
        'id', o.id, 'work_type', o.work_type, 'tenant', o.tenant,
        'agent_ids', o.target_agent_ids, 'agent_names', o.target_agent_names,
        'labels', o.target_labels, 'annotations', o.target_annotations)::text;
    IF octet_length(payload) > 7900 THEN
        payload := json_build_object('id', o.id, 'work_type', o.work_type)::text;
    END IF;
    RETURN payload;
END
$$;

CREATE OR REPLACE FUNCTION pullman_notify_work_order() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF OLD.source = 'kubernetes' THEN
            PERFORM pg_notify('pullman_work_order_changed', OLD.id::text);
        END IF;
        RETURN OLD;
    END IF;
    IF NEW.status = 'PENDING' AND (TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM 'PENDING') THEN
        PERFORM pg_notify('pullman_claimable', pullman_claimable_payload(NEW));
    END IF;
    IF NEW.source = 'kubernetes' AND (TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM NEW.status
       OR OLD.retry_count IS DISTINCT FROM NEW.retry_count
       OR OLD.reclaim_count IS DISTINCT FROM NEW.reclaim_count) THEN
        PERFORM pg_notify('pullman_work_order_changed', NEW.id::text);
    END IF;
    RETURN NEW;
END
$$;

-- Admits a claim of an order with a key only while the key has a free slot, and takes it. The
-- claim's walk already passed over full keys (key_full.sql, its own snapshot); this is the
-- decision, under the slot row's lock. A claim refused here is not inserted, so the order stays
-- waiting, and the claim statement reports the contention (claim_next_result.sql): queue::claims
-- tries again with a fresh snapshot. A slot row another transaction holds is not waited for: a
-- claim may hold another key's row already (a multi-claim) or its agent's, and a complete locks
-- its agent's row before its key's, so waiting here closed cycles (tests/concurrency_keys.rs
-- deadlocked in every run when this waited).
CREATE FUNCTION pullman_take_slot() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    now_held integer;
BEGIN
    SELECT held INTO now_held FROM concurrency_slots
    WHERE slot = NEW.concurrency_slot FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        -- Locked by another transaction (a claim or a claim's end of the same key): contended.
        -- Or no row, when maintenance dropped it while the key's order was being created: make
        -- it; this may wait on another claim making it too (a deadlock then is retried too).
        IF EXISTS (SELECT 1 FROM concurrency_slots WHERE slot = NEW.concurrency_slot) THEN
            RETURN NULL;
        END IF;
        INSERT INTO concurrency_slots (slot, held, saturated)
        VALUES (NEW.concurrency_slot, 1, 1 >= NEW.concurrency_max)
        ON CONFLICT (slot) DO NOTHING;
        IF FOUND THEN
            RETURN NEW;
        END IF;
        RETURN NULL;
    END IF;
    IF now_held >= NEW.concurrency_max THEN
        UPDATE concurrency_slots SET saturated = true WHERE slot = NEW.concurrency_slot;
        RETURN NULL;
    END IF;
    UPDATE concurrency_slots
    SET held = held + 1, saturated = saturated OR held + 1 >= NEW.concurrency_max
    WHERE slot = NEW.concurrency_slot;
    RETURN NEW;
END
$$;
CREATE TRIGGER work_order_claims_take_slot BEFORE INSERT ON work_order_claims
    FOR EACH ROW WHEN (NEW.concurrency_slot IS NOT NULL)
    EXECUTE FUNCTION pullman_take_slot();

-- Frees the slot of an ended claim, and wakes a claimer for the key's next waiting order, which
-- no insert or requeue would announce: one notice per freed slot while the key has been full
-- since it last had nothing waiting (`saturated`). Not otherwise: a notice costs the commit a
-- cluster-wide lock, and while the key had room its orders were claimable, so nobody slept on them.
CREATE FUNCTION pullman_free_slot() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    now_held integer;
    was_full boolean;
    waiting work_orders;
BEGIN
    UPDATE concurrency_slots SET held = held - 1 WHERE slot = OLD.concurrency_slot
    RETURNING held, saturated INTO now_held, was_full;
    IF NOT FOUND OR NOT was_full THEN
        RETURN NULL;
    END IF;
    -- The n-th free slot announces the n-th waiting order: slots freed one after another before
    -- any is taken again (or in one transaction, where PostgreSQL folds equal notices into one)
    -- each wake a claimer for another order.
    SELECT * INTO waiting FROM work_orders
    WHERE concurrency_slot = OLD.concurrency_slot AND status = 'PENDING'
    ORDER BY priority DESC, created_at, id
    LIMIT 1 OFFSET greatest(OLD.concurrency_max - now_held - 1, 0);
    IF FOUND THEN
        IF now_held < waiting.concurrency_max THEN
            PERFORM pg_notify('pullman_claimable', pullman_claimable_payload(waiting));
        END IF;
    ELSIF NOT EXISTS (SELECT 1 FROM work_orders WHERE concurrency_slot = OLD.concurrency_slot
                      AND status IN ('PENDING', 'RETRY_PENDING')) THEN
        UPDATE concurrency_slots SET saturated = false WHERE slot = OLD.concurrency_slot;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER work_order_claims_free_slot AFTER DELETE ON work_order_claims
    FOR EACH ROW WHEN (OLD.concurrency_slot IS NOT NULL)
    EXECUTE FUNCTION pullman_free_slot();
