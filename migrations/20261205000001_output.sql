-- Output of running orders (docs/design.md §9): what the agent holding a claim sends while it works.
--
-- Stored in chunks, one row per chunk as the agent sent it (its lines as three parallel arrays),
-- never a row per line: a busy worker sends a chunk a second with hundreds of lines.
--
-- No foreign key to work_orders: an order moves from work_orders to work_order_log under the
-- same id when it finishes, and its output stays; the retention sweep (expire_log.sql) deletes
-- it with the log entry.
CREATE TABLE work_order_output (
    -- the read cursor: within one order, ids grow in commit order, because every writer of an
    -- order first locks its work_order_output_totals row and takes the id after that
    id             bigserial PRIMARY KEY,
    work_order_id  uuid NOT NULL,
    claim_id       uuid NOT NULL,
    -- the agent's sequence number within its claim; a resent seq is stored once
    seq            bigint NOT NULL,
    -- 1 for the order's first claim, 2 for the second, …
    attempt        integer NOT NULL,
    -- bytes of output the agent reported lost just before this chunk (a gap marker)
    gap_bytes      bigint NOT NULL DEFAULT 0,
    -- sum of the UTF-8 lengths of texts (what the per-order cap counts)
    bytes          bigint NOT NULL,
    line_count     integer NOT NULL,
    streams        text[] NOT NULL,
    texts          text[] NOT NULL,
    ats            timestamptz[] NOT NULL,
    received_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (work_order_id, claim_id, seq)
);
CREATE INDEX work_order_output_order ON work_order_output (work_order_id, id);

-- One row per order with output: the per-order lock every writer takes first, what is stored,
-- and what the cap dropped (readers see a marker where the dropped part was).
CREATE TABLE work_order_output_totals (
    work_order_id  uuid PRIMARY KEY,
    stored_bytes   bigint NOT NULL DEFAULT 0,
    dropped_bytes  bigint NOT NULL DEFAULT 0
);
