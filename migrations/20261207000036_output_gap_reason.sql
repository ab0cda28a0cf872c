-- Why an agent lost the output a gap marker stands for (docs/design.md §9): its buffer was full
-- while the server was unreachable or refusing (429, 503), or the server refused a chunk. NULL:
-- not said (agents before this column).
ALTER TABLE work_order_output ADD COLUMN gap_reason text;
