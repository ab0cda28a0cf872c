-- log_cutoff: the time before which log entries are past their retention (docs/design.md §7), by
-- the database's clock, fixed once for a maintenance pass's batches of expire_log.sql.
-- $1 retention (float8 seconds)
SELECT now() - make_interval(secs => $1)
