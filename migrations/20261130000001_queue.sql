-- Pullman queue schema (docs/design.md §1–§5).
--
-- Layout chosen so the claim path stays flat as history grows:
--   * work_orders holds only active orders (PENDING, CLAIMED, RETRY_PENDING); finished ones move to
--     work_order_log in the same transaction that finishes them.
--   * claimable rows are found through a partial index that covers nothing else.
--   * the live claim (fencing token + lease) sits in the narrow work_order_claims table, so a
--     heartbeat rewrites a ~100-byte row instead of the order with its YAML.

CREATE TABLE agents (
    id               uuid PRIMARY KEY,
    name             text NOT NULL,
    labels           text[] NOT NULL DEFAULT '{}',
    annotations      jsonb NOT NULL DEFAULT '{}',
    -- annotations flattened to 'key=value' strings so "any annotation matches" is an array overlap
    annotation_pairs text[] NOT NULL DEFAULT '{}',
    work_types       text[] NOT NULL DEFAULT '{}',
    tenant           text,
    max_concurrency  integer CHECK (max_concurrency IS NULL OR max_concurrency >= 1),
    lease_seconds    integer,
    created_at       timestamptz NOT NULL DEFAULT now(),
    last_seen_at     timestamptz,
    retired_at       timestamptz
);
-- a name identifies one live agent; retired agents keep theirs for the record
CREATE UNIQUE INDEX agents_live_name ON agents (name) WHERE retired_at IS NULL;
CREATE INDEX agents_created ON agents (created_at, id);

CREATE TABLE agent_tokens (
    id           uuid PRIMARY KEY,
    agent_id     uuid NOT NULL REFERENCES agents (id),
    secret_hash  bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz
);
CREATE INDEX agent_tokens_agent ON agent_tokens (agent_id) WHERE revoked_at IS NULL;

CREATE TABLE work_orders (
    id                     uuid PRIMARY KEY,
    work_type              text NOT NULL CHECK (work_type IN ('build', 'custom')),
    yaml_content           text NOT NULL,
    max_retries            integer NOT NULL,
    backoff_seconds        integer NOT NULL,
    claim_timeout_seconds  integer NOT NULL,
    max_reclaims           integer NOT NULL,
    tenant                 text,
    target_agent_ids       uuid[] NOT NULL DEFAULT '{}',
    target_agent_names     text[] NOT NULL DEFAULT '{}',
    target_labels          text[] NOT NULL DEFAULT '{}',
    target_annotations     jsonb NOT NULL DEFAULT '{}',
    target_annotation_pairs text[] NOT NULL DEFAULT '{}',
    status                 text NOT NULL CHECK (status IN ('PENDING', 'CLAIMED', 'RETRY_PENDING')),
    retry_count            integer NOT NULL DEFAULT 0,
    reclaim_count          integer NOT NULL DEFAULT 0,
    last_error             text,
    last_error_at          timestamptz,
    next_retry_after       timestamptz,
    -- the agent and fencing token of the most recent claim; kept after a release so a late
    -- heartbeat can be told "reclaimed" rather than "not the holder"
    last_claimed_by        uuid,
    last_claim_id          uuid,
    source                 text NOT NULL DEFAULT 'api',
    created_at             timestamptz NOT NULL DEFAULT now(),
    updated_at             timestamptz NOT NULL DEFAULT now()
);
-- the claim path: only rows that are or will become claimable, in hand-out order
CREATE INDEX work_orders_claimable ON work_orders (created_at, id)
    WHERE status IN ('PENDING', 'RETRY_PENDING');
-- the retry promoter: only orders backing off
CREATE INDEX work_orders_retry_due ON work_orders (next_retry_after)
    WHERE status = 'RETRY_PENDING';
-- admin listing
CREATE INDEX work_orders_listing ON work_orders (created_at, id);

-- one row per live claim; deleted when the claim ends (complete, reap, cancel, retire)
CREATE TABLE work_order_claims (
    work_order_id     uuid PRIMARY KEY REFERENCES work_orders (id) ON DELETE CASCADE,
    claim_id          uuid NOT NULL,
    agent_id          uuid NOT NULL,
    claimed_at        timestamptz NOT NULL,
    -- claimed_at + claim_timeout_seconds: no lease extends a claim past it
    deadline          timestamptz NOT NULL,
    lease_seconds     integer,
    lease_expires_at  timestamptz
);
CREATE INDEX work_order_claims_agent ON work_order_claims (agent_id);

CREATE TABLE work_order_log (
    id                     uuid PRIMARY KEY,
    work_type              text NOT NULL,
    yaml_content           text NOT NULL,
    max_retries            integer NOT NULL,
    backoff_seconds        integer NOT NULL,
    claim_timeout_seconds  integer NOT NULL,
    max_reclaims           integer NOT NULL,
    tenant                 text,
    targeting              jsonb NOT NULL,
    outcome                text NOT NULL CHECK (outcome IN ('succeeded', 'failed', 'cancelled')),
    message                text,
    retry_count            integer NOT NULL,
    reclaim_count          integer NOT NULL,
    last_error             text,
    last_error_at          timestamptz,
    claimed_by             uuid,
    claim_id               uuid,
    claimed_at             timestamptz,
    source                 text NOT NULL,
    -- who ended it: 'agent' (complete), 'reaper' (reclaims exhausted) or 'cancel'
    ended_by               text NOT NULL CHECK (ended_by IN ('agent', 'reaper', 'cancel')),
    created_at             timestamptz NOT NULL,
    completed_at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX work_order_log_newest ON work_order_log (completed_at DESC, id DESC);
CREATE INDEX work_order_log_agent ON work_order_log (claimed_by, completed_at DESC, id DESC);

-- Wake long-polling claimers when an order becomes claimable, and tell the controller about every
-- state change. Payload: the work order id.
CREATE FUNCTION pullman_notify_work_order() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('pullman_work_order_changed', OLD.id::text);
        RETURN OLD;
    END IF;
    IF NEW.status = 'PENDING' AND (TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM 'PENDING') THEN
        PERFORM pg_notify('pullman_claimable', NEW.work_type);
    END IF;
    IF TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM NEW.status
       OR OLD.retry_count IS DISTINCT FROM NEW.retry_count
       OR OLD.reclaim_count IS DISTINCT FROM NEW.reclaim_count THEN
        PERFORM pg_notify('pullman_work_order_changed', NEW.id::text);
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER work_orders_notify
    AFTER INSERT OR UPDATE OR DELETE ON work_orders
    FOR EACH ROW EXECUTE FUNCTION pullman_notify_work_order();

-- Claims released by the reaper or by retirement, so a late heartbeat or complete from their
-- holder can be told "reclaimed". Gone with the order when it finishes.
CREATE TABLE released_claims (
    claim_id       uuid PRIMARY KEY,
    work_order_id  uuid NOT NULL REFERENCES work_orders (id) ON DELETE CASCADE,
    agent_id       uuid NOT NULL,
    released_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX released_claims_order_agent ON released_claims (work_order_id, agent_id);
