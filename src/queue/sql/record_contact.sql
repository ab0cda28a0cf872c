-- record_contact: records contact with an agent (last_seen_at, docs/design.md §5 agent health) when
-- it is due: at most once a second. Each record rewrites the agent's row; done on every claim
-- and completion, the 16-row agents heap grew to 1.3 MiB in a 10-minute soak (bench/README.md),
-- and health thresholds are minutes, so a second is fine-grained enough. When it is due the
-- agent row is locked first, as the lock order says; when not, no agent lock is taken at all.
-- $1 agent id (uuid)
UPDATE agents SET last_seen_at = now()
WHERE id = $1 AND (last_seen_at IS NULL OR last_seen_at < now() - interval '1 second')
