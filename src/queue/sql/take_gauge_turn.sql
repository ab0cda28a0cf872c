-- take_gauge_turn: one replica per period computes the database gauges (gauge_snapshot,
-- queue::gauges). The turn is free once the last one is older than the period; a turn whose
-- replica died mid-computation (taken, never computed) is free again after four periods, and
-- never sooner than a minute, so a computation slower than a short period is not run twice at
-- once. A replica whose computation fails gives its turn back (release_gauge_turn.sql).
-- $1 the period, seconds (float8)
-- Returns when this caller took the turn (taken_at), or no row.
UPDATE gauge_snapshot
SET taken_at = now()
WHERE taken_at <= now() - make_interval(secs => $1)
  AND (computed_at >= taken_at
       OR taken_at <= now() - make_interval(secs => greatest(4 * $1, 60)))
RETURNING taken_at
