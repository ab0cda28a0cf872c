-- What the holder of a claim says holds its order up (docs/design.md §12, issue #39): a pod of the
-- order may still run on a node that does not report. Each heartbeat sets it (NULL when nothing
-- does); GET /work-orders/{id} and explain answer it while the claim lives. It ends with the claim
-- (the row is deleted), so a new claim starts with none.
ALTER TABLE work_order_claims ADD COLUMN waiting jsonb;

-- A WorkOrder resource's Schedulable condition says it too: the controller hears of a change on
-- pullman_work_order_changed, as of any state change of an order from a WorkOrder. Only a change
-- notifies (the WHEN clause, evaluated without calling the function), and only for such orders,
-- so heartbeats that repeat what they said cost nothing more (a notifying commit takes a
-- cluster-wide lock, migration 20261201000001).
CREATE FUNCTION pullman_notify_claim_waiting() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM work_orders w WHERE w.id = NEW.work_order_id AND w.source = 'kubernetes') THEN
        PERFORM pg_notify('pullman_work_order_changed', NEW.work_order_id::text);
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER work_order_claims_waiting_changed
    AFTER UPDATE OF waiting ON work_order_claims
    FOR EACH ROW WHEN (OLD.waiting IS DISTINCT FROM NEW.waiting)
    EXECUTE FUNCTION pullman_notify_claim_waiting();
