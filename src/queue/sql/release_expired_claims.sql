-- release_expired_claims: releases the claims find_expired_claims.sql locked on orders that have
-- reclaims left. Each is kept as a `reclaimed` attempt saying which limit ran out, which is also
-- how a late heartbeat or complete from its holder is told `reclaimed` (refusal_active.sql).
-- $1 order ids (uuid[])
WITH released AS (
  DELETE FROM work_order_claims WHERE work_order_id = ANY ($1)
  RETURNING claim_id, work_order_id, agent_id, claimed_at, deadline
)
INSERT INTO work_order_attempts (claim_id, work_order_id, agent_id, started_at, ended, message)
SELECT claim_id, work_order_id, agent_id, claimed_at, 'reclaimed',
       CASE WHEN deadline <= now() THEN 'the claim timeout ran out'
            ELSE 'the lease expired: no heartbeat in time' END
FROM released
