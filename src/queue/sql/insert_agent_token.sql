-- insert_agent_token: stores a newly minted agent token, only as the hash of its secret.
-- $1 token id (uuid), $2 agent id (uuid), $3 SHA-256 of the secret (bytea)
INSERT INTO agent_tokens (id, agent_id, secret_hash) VALUES ($1, $2, $3)
