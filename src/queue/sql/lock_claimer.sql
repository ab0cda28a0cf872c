-- lock_claimer: locks the claiming agent's row for the rest of the transaction (serializing this
-- agent's claims, so max_concurrency holds) and records its contact and lease. It does not wait
-- for the agent's claim-next statements (FOR KEY SHARE, claiming_agent.sql), so a change of
-- max_concurrency from none to some applies to claims that start after it: a claim-next begun
-- before it may commit its orders past the new cap once. Waiting for them (FOR UPDATE) would
-- make every capped claim wait for the agent's completes in flight, the serialization
-- issue #34 removed.
-- $1 agent id (uuid)
-- $2 lease seconds (int, NULL = keep the recorded one)
-- Returns the agent's side of eligibility (a_* columns, as claim_next.sql), or no row.
UPDATE agents SET last_seen_at = now(), lease_seconds = COALESCE($2, lease_seconds)
WHERE id = $1
RETURNING id AS a_id, name AS a_name, labels AS a_labels, annotations AS a_annotations,
          work_types AS a_work_types,
          tenant AS a_tenant, max_concurrency AS a_max_concurrency, retired_at AS a_retired_at
