-- schedule_retry: a failed attempt with retries left (docs/design.md §2): the order becomes
-- RETRY_PENDING until now + the backoff, and the ended claim is kept as an attempt. Runs after
-- end_live_claim.sql in its transaction.
-- $1 order id (uuid)
-- $2 the new retry_count (int)
-- $3 backoff in seconds (float8, queue::rules::decide_failure)
-- $4 the error reported (text)
-- $5 the ended claim's id (uuid), $6 its agent (uuid), $7 its claimed_at (timestamptz)
-- Returns next_retry_after.
WITH attempt AS (
  INSERT INTO work_order_attempts (claim_id, work_order_id, agent_id, started_at, ended, message)
  VALUES ($5, $1, $6, $7, 'retry_scheduled', $4)
)
UPDATE work_orders SET status = 'RETRY_PENDING', retry_count = $2,
       next_retry_after = now() + make_interval(secs => $3), last_error = $4,
       last_error_at = now(), updated_at = now()
WHERE id = $1
RETURNING next_retry_after
