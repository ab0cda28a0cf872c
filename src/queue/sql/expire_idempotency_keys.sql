-- expire_idempotency_keys: deletes one batch of Idempotency-Key records past their retention,
-- oldest first.
-- $1 retention (float8 seconds)
-- $2 batch size (bigint)
DELETE FROM idempotency_keys
WHERE key IN (SELECT key FROM idempotency_keys
              WHERE created_at < now() - make_interval(secs => $1)
              ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED)
