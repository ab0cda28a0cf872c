-- claimed_order (a fragment, not a statement): the order just claimed (claim_rows.sql), with
-- yaml_content and its claim, as queue::OrderRow reads it. Included (`-- @include claimed_order.sql`,
-- build.rs) by claim_next_result.sql (claim_next.sql, claim_next_fair.sql),
-- claim_next_capped.sql, claim_next_capped_fair.sql, claim_by_id.sql and group_claim_rows.sql
-- (claim_next_group.sql, claim_next_group_fair.sql).
SELECT w.yaml_content,
       -- @include order_columns.sql
FROM upd w JOIN claim c ON c.work_order_id = w.id
