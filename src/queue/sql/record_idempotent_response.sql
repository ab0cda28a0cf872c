-- record_idempotent_response: the answer a repeat of the create with this key gets.
-- $1 key (text)
-- $2 the created order (jsonb)
UPDATE idempotency_keys SET response = $2 WHERE key = $1
