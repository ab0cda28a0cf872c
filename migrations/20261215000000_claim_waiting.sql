-- What the holder of a claim says holds its order up (docs/design.md §12, issue #39): a pod of the
-- order may still run on a node that does not report. Each heartbeat sets it (NULL when nothing
-- does); GET /work-orders/{id} and explain answer it while the claim lives. It ends with the claim
-- (the row is deleted), so a new claim starts with none.
ALTER TABLE work_order_claims ADD COLUMN waiting jsonb;
