-- release_gauge_turn: gives back a gauge turn whose computation failed, so the next replica to
-- ask computes at once instead of after four periods (take_gauge_turn.sql).
-- $1 when the turn was taken (timestamptz, as take_gauge_turn.sql returned it)
UPDATE gauge_snapshot SET taken_at = '-infinity' WHERE taken_at = $1
