-- expire_followers: deletes one batch of output_followers rows past their retention (docs/design.md
-- §9): rows a killed server never deleted. A live follower older than that only loses the prompt
-- end of its stream (its safety re-read ends it).
-- $1 retention (float8 seconds)
-- $2 batch size (bigint)
DELETE FROM output_followers
WHERE (work_order_id, follower) IN (
  SELECT work_order_id, follower FROM output_followers
  WHERE since < now() - make_interval(secs => $1)
  LIMIT $2 FOR UPDATE SKIP LOCKED)
