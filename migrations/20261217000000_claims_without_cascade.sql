-- A claim row leaves with its order through the statement that ends the order, not through a
-- foreign-key cascade (issue #34; bench/README.md "2026-12-08 (later)").
--
-- The cascade ran one query per finished order, `DELETE FROM ONLY work_order_claims WHERE $1 =
-- work_order_id`, whose plan each backend keeps from its first executions. A server starts with
-- this table nearly empty, where a sequential scan is the cheaper plan, and kept that plan while
-- claims churned through the table between vacuums: with 100,000 orders worked, every complete
-- read a few hundred pages, and one agent of 16 slots worked 3,460-4,058 orders/s against 5,333
-- without the cascade (River, the peer, 6,100 jobs/s on the same database). Every statement that
-- deletes an order now deletes its claim row too, in the same statement (complete_success.sql,
-- complete_success_many.sql, finish_order.sql, supersede.sql), so a concurrency slot is still
-- freed in the transaction that ends the claim (pullman_free_slot, docs/design.md §11).
ALTER TABLE work_order_claims DROP CONSTRAINT work_order_claims_work_order_id_fkey;

-- Those statements' own look-ups by work_order_id face the same choice when planned. Vacuum no
-- longer gives back the table's empty tail, so once the table has grown under load a replanned
-- statement (every vacuum and analyze of the table replans) sees its real size and takes an
-- index, rather than a plan made for a table just truncated to a few pages. The tail is
-- reused by the next claims; truncating it also took an ACCESS EXCLUSIVE lock on the claims'
-- table at every vacuum that found one.
ALTER TABLE work_order_claims SET (vacuum_truncate = false);
