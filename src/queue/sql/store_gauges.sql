-- store_gauges: the figures of a gauge turn (take_gauge_turn.sql), as of the snapshot that
-- computed them; never over figures of a later snapshot (a slow turn that another replica
-- took over after four periods).
-- $1 the figures (jsonb, queue::gauges::GaugeFigures)
-- $2 when their snapshot began (timestamptz)
UPDATE gauge_snapshot SET figures = $1, computed_at = $2
WHERE computed_at IS NULL OR computed_at < $2
