-- release_expired_claims: releases the claims find_expired_claims.sql locked on orders that have
-- reclaims left. Each is remembered (a late heartbeat is told `reclaimed`) and kept as an
-- attempt saying which limit ran out.
-- $1 order ids (uuid[])
WITH released AS (
  DELETE FROM work_order_claims WHERE work_order_id = ANY ($1)
  RETURNING claim_id, work_order_id, agent_id, claimed_at, deadline
),
attempt AS (
  INSERT INTO work_order_attempts (claim_id, work_order_id, agent_id, started_at, ended, message)
  SELECT claim_id, work_order_id, agent_id, claimed_at, 'reclaimed',
         CASE WHEN deadline <= now() THEN 'the claim timeout ran out'
              ELSE 'the lease expired: no heartbeat in time' END
  FROM released
)
INSERT INTO released_claims (claim_id, work_order_id, agent_id)
SELECT claim_id, work_order_id, agent_id FROM released
