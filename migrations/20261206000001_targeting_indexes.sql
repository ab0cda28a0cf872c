-- Indexes for counting what an agent profile may take (docs/design.md §10 backlog, issue #25):
-- sql/backlog.sql counts every eligible order, and without these a count at 1M pending orders
-- was a parallel sequential scan (360 ms). Each disjunct of the targeting rule (sql/eligible.sql)
-- is in a form a GIN index serves (`@>`, `&&`), so the count is a BitmapOr of these four (30 ms
-- for 10k of 1M, bench/README.md). Partial, like work_orders_claimable: a claimed order leaves
-- them, so a claim adds no entry. The claim statements keep walking work_orders_claimable in
-- hand-out order (their LIMIT 1 makes that the cheaper plan).
-- Built without CONCURRENTLY (migrations run in a transaction): about 2 s per million waiting
-- orders, during which orders cannot be created.
CREATE INDEX work_orders_target_agent_ids ON work_orders USING gin (target_agent_ids)
  WHERE status IN ('PENDING', 'RETRY_PENDING');
CREATE INDEX work_orders_target_agent_names ON work_orders USING gin (target_agent_names)
  WHERE status IN ('PENDING', 'RETRY_PENDING');
CREATE INDEX work_orders_target_labels ON work_orders USING gin (target_labels)
  WHERE status IN ('PENDING', 'RETRY_PENDING');
CREATE INDEX work_orders_target_annotation_pairs ON work_orders USING gin (target_annotation_pairs)
  WHERE status IN ('PENDING', 'RETRY_PENDING');
