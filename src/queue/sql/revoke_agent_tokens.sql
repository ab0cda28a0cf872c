-- revoke_agent_tokens: revokes every live token of an agent (rotate, retire).
-- $1 agent id (uuid)
UPDATE agent_tokens SET revoked_at = now() WHERE agent_id = $1 AND revoked_at IS NULL
