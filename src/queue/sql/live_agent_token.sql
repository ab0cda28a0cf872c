-- live_agent_token: a token's agent and secret hash, when the token is not revoked and its agent
-- not retired (docs/design.md §5). crate::auth compares the secret.
-- $1 token id (uuid)
SELECT t.agent_id, t.secret_hash
FROM agent_tokens t JOIN agents a ON a.id = t.agent_id
WHERE t.id = $1 AND t.revoked_at IS NULL AND a.retired_at IS NULL
