-- key_full: docs/design.md §3 concurrency keys as a condition on order w: it has a key, and the
-- key holds as many claims as the order's max now (concurrency_slots, in the statement's
-- snapshot). Included (`-- @include key_full.sql`, build.rs), negated, by handout_walk.sql and
-- turn_walk.sql (the claim-next walks), pending_for_agent.sql, backlog.sql and
-- queue_position.sql, which pass over such orders; and as the `limited` column (docs/design.md §10
-- `concurrency_limited`) by waiting_order.sql, waiting_orders.sql and waiting_by_profile.sql.
-- The decision itself is the migration's trigger on the claim's insert, under the slot row's
-- lock; this keeps walks from picking orders it would refuse.
(w.concurrency_slot IS NOT NULL
 AND EXISTS (SELECT 1 FROM concurrency_slots s
             WHERE s.slot = w.concurrency_slot AND s.held >= w.concurrency_max))
