-- insert_idempotency_key: claims an Idempotency-Key for a create (docs/design.md §5 "Retry safety");
-- a concurrent create with the same key waits on this row.
-- $1 key (text)
-- $2 SHA-256 of the request (bytea)
-- $3 the id the new order will get (uuid)
-- Returns the id when the key is new, no row when it was used before.
INSERT INTO idempotency_keys (key, request_sha256, work_order_id) VALUES ($1, $2, $3)
ON CONFLICT (key) DO NOTHING
RETURNING work_order_id
