-- take_gauge_turn: one replica per period computes the database gauges (gauge_snapshot,
-- queue::gauges). The turn is free once the last one is older than the period, and a turn whose
-- replica died mid-computation (taken, never computed) is free again after four periods.
-- $1 the period, seconds (float8)
-- Returns one row when this caller took the turn, none otherwise.
UPDATE gauge_snapshot
SET taken_at = now()
WHERE taken_at <= now() - make_interval(secs => $1)
  AND (computed_at >= taken_at OR taken_at <= now() - make_interval(secs => 4 * $1))
RETURNING true
