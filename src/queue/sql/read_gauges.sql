-- read_gauges: the last stored gauge figures (store_gauges.sql) and their age in seconds, for a
-- scrape. No row while none has been computed.
-- Returns figures (jsonb), age_seconds (float8).
SELECT figures, EXTRACT(EPOCH FROM (now() - computed_at))::float8 AS age_seconds
FROM gauge_snapshot
WHERE figures IS NOT NULL
