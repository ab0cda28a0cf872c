-- agent_contacts: each live agent's last contact and lease, and the database's now(), for the
-- pullman_agents{health} gauge (queue::rules::agent_health).
SELECT last_seen_at, lease_seconds, now() FROM agents WHERE retired_at IS NULL
