-- output_follow: marks an order as followed (docs/design.md §9), so its move to the log notifies
-- pullman_output (trigger work_orders_followed_finish). Before the follower's first read. The
-- order's row is locked FOR KEY SHARE while the mark is written: a move to the log in flight makes
-- this wait for its commit and then mark nothing (the first read sees the order finished); one
-- that comes after waits for this mark, and its trigger, reading after it, sees it. Without the
-- lock a finish whose trigger looked just before the mark committed would notify nobody, and the
-- follower would wait for its safety re-read.
-- $1 order id (uuid)
-- $2 follower (uuid, one per stream)
WITH followed AS (SELECT id FROM work_orders WHERE id = $1 FOR KEY SHARE)
INSERT INTO output_followers (work_order_id, follower)
SELECT id, $2 FROM followed
ON CONFLICT DO NOTHING
