-- drop_idle_slots: deletes the slot rows of concurrency keys that hold no claim and have no
-- waiting order (queue maintenance, docs/design.md §3 "Concurrency keys"). A key's order created
-- meanwhile and committed after finds no row; its first claim makes one (pullman_take_slot).
-- Returns nothing; the count is the statement's.
DELETE FROM concurrency_slots s
WHERE s.held = 0
  AND NOT EXISTS (SELECT 1 FROM work_orders w
                  WHERE w.concurrency_slot = s.slot AND w.status IN ('PENDING', 'RETRY_PENDING'))
