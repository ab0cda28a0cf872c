-- output_unfollow: a follower's stream ended (docs/design.md §9).
-- $1 order id (uuid)
-- $2 follower (uuid)
DELETE FROM output_followers WHERE work_order_id = $1 AND follower = $2
