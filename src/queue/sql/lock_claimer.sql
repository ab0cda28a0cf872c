-- lock_claimer: locks the claiming agent's row for the rest of the transaction (serializing this
-- agent's claims, so max_concurrency holds) and records its contact and lease. FOR UPDATE
-- first: that also waits for the agent's claim-next statements in flight (FOR KEY SHARE,
-- claiming_agent.sql), one of which may have begun while the agent had no max_concurrency, so
-- the count of its claims that follows sees theirs. The wait is bounded: the agent's completes
-- in flight end, and while this waits, no claim of the agent adds more.
-- $1 agent id (uuid)
-- $2 lease seconds (int, NULL = keep the recorded one)
-- Returns the agent's side of eligibility (a_* columns, as claim_next.sql), or no row.
UPDATE agents SET last_seen_at = now(), lease_seconds = COALESCE($2, lease_seconds)
WHERE id = (SELECT id FROM agents WHERE id = $1 FOR UPDATE)
RETURNING id AS a_id, name AS a_name, labels AS a_labels, annotations AS a_annotations,
          work_types AS a_work_types,
          tenant AS a_tenant, max_concurrency AS a_max_concurrency, retired_at AS a_retired_at
