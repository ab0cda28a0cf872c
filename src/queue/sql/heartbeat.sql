-- heartbeat: extends the lease of the agent's live claim (docs/design.md §2, §5), never past the
-- claim's deadline (claimed_at + claim_timeout_seconds). Runs after record_contact.sql in one
-- transaction.
-- $1 order id (uuid)
-- $2 agent id (uuid)
-- $3 claim id (uuid, NULL = the agent's live claim, whichever it is)
-- $4 what holds the order up (jsonb ClaimWaiting, docs/design.md §12; NULL: nothing)
-- Returns the new lease end (NULL for a claim without a lease) and the deadline, or no row
-- when the agent holds no live claim on the order (the caller explains the 409).
UPDATE work_order_claims c
SET lease_expires_at = CASE WHEN c.lease_seconds IS NULL THEN NULL
                            ELSE LEAST(now() + make_interval(secs => c.lease_seconds), c.deadline) END,
    waiting = $4
WHERE c.work_order_id = $1 AND c.agent_id = $2 AND ($3::uuid IS NULL OR c.claim_id = $3)
  AND
  -- @include live_claim.sql
RETURNING c.lease_expires_at, c.deadline
