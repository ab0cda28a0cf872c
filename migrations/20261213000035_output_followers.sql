-- Followed orders (docs/design.md §9, issue #35). A follower of an order's output (GET
-- …/output?follow=true) is woken by NOTIFY pullman_output when a chunk is stored; to end its
-- stream when the order finishes it re-read the order every 500 ms, two statements a follower, so
-- 1,000 idle followers cost 4,000 statements a second. Now the move of an order to the log
-- notifies the same channel, but only for an order someone follows: a completion nobody watches
-- (nearly all of them) pays one probe of this small table, no NOTIFY (a NOTIFY serializes commits
-- on the notification queue's lock). A follower inserts its row before its first read and
-- deletes it when its stream ends; a row left by a killed server costs at most one NOTIFY and is
-- deleted by maintenance after a day. UNLOGGED: after a crash there is no follower to wake.
CREATE UNLOGGED TABLE output_followers (
    work_order_id uuid NOT NULL,
    follower uuid NOT NULL,
    since timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (work_order_id, follower)
);

CREATE FUNCTION pullman_notify_followed_finish() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM output_followers WHERE work_order_id = OLD.id) THEN
        PERFORM pg_notify('pullman_output', OLD.id::text);
    END IF;
    RETURN OLD;
END
$$;

CREATE TRIGGER work_orders_followed_finish AFTER DELETE ON work_orders
    FOR EACH ROW EXECUTE FUNCTION pullman_notify_followed_finish();
