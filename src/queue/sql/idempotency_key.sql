-- idempotency_key: what a key recorded: the request's SHA-256 and the answer.
-- $1 key (text)
SELECT request_sha256, response FROM idempotency_keys WHERE key = $1
