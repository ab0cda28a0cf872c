-- Retry-safe creates (docs/design.md §5 "Retry safety"): a POST /work-orders carrying an
-- Idempotency-Key records the answer it got under that key, so a client that lost the answer can
-- send the same request again and get the same order instead of a second one.
--
-- The key row is inserted first in the creating transaction; a concurrent request with the same
-- key waits on it (unique index) and then reads the recorded answer. Rows older than a day are
-- deleted by the maintenance loop.
CREATE TABLE idempotency_keys (
    key             text PRIMARY KEY,
    -- SHA-256 of the request as parsed: the same key with another request is refused
    request_sha256  bytea NOT NULL,
    work_order_id   uuid NOT NULL,
    -- the 201 body as first answered; set in the transaction that inserted the row
    response        jsonb,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);
