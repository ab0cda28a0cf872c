-- Notifications that cost less and say more, and vacuuming that keeps up (issue #7, benchmarks).
--
-- * pullman_claimable now carries the order's eligibility facts as JSON ({id, work_type, tenant,
--   agent_ids, agent_names, labels, annotations}) so a server wakes one long-polling claimer that
--   may take the order instead of all of them. A payload that would pass PostgreSQL's 8000-byte
--   limit is cut to {id, work_type}; servers then wake every waiter, as before.
-- * pullman_work_order_changed is sent only for orders created from a WorkOrder resource
--   (source = 'kubernetes'): only the controller listens to it. A transaction that notifies takes
--   a cluster-wide lock through its commit, so notifying on every claim and completion of API
--   orders serialized their commits (no group commit).

CREATE OR REPLACE FUNCTION pullman_notify_work_order() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    payload text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF OLD.source = 'kubernetes' THEN
            PERFORM pg_notify('pullman_work_order_changed', OLD.id::text);
        END IF;
        RETURN OLD;
    END IF;
    IF NEW.status = 'PENDING' AND (TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM 'PENDING') THEN
        payload := json_build_object(
            'id', NEW.id, 'work_type', NEW.work_type, 'tenant', NEW.tenant,
            'agent_ids', NEW.target_agent_ids, 'agent_names', NEW.target_agent_names,
            'labels', NEW.target_labels, 'annotations', NEW.target_annotations)::text;
        IF octet_length(payload) > 7900 THEN
            payload := json_build_object('id', NEW.id, 'work_type', NEW.work_type)::text;
        END IF;
        PERFORM pg_notify('pullman_claimable', payload);
    END IF;
    IF NEW.source = 'kubernetes' AND (TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM NEW.status
       OR OLD.retry_count IS DISTINCT FROM NEW.retry_count
       OR OLD.reclaim_count IS DISTINCT FROM NEW.reclaim_count) THEN
        PERFORM pg_notify('pullman_work_order_changed', NEW.id::text);
    END IF;
    RETURN NEW;
END
$$;

-- The hot tables churn: every order is inserted, claimed and deleted, every claim row lives for
-- one claim and every claim or completion rewrites its agent's row. Vacuum them after a fixed
-- number of dead rows rather than a fifth of the table, so scans (the foreign-key cascade on
-- work_order_claims, the claim path's index walk) do not wade through dead versions.
ALTER TABLE work_orders SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000);
ALTER TABLE work_order_claims SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
ALTER TABLE agents SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
