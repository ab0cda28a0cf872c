-- output_follow: marks an order as followed (docs/design.md §9), so its move to the log notifies
-- pullman_output (trigger work_orders_followed_finish). Before the follower's first read.
-- $1 order id (uuid)
-- $2 follower (uuid, one per stream)
INSERT INTO output_followers (work_order_id, follower) VALUES ($1, $2)
ON CONFLICT DO NOTHING
