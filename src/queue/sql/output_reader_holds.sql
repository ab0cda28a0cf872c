-- output_reader_holds: whether an agent holds the live claim on an order (an agent may read the
-- output of the order it works on, to resume after a restart; docs/design.md §9).
-- $1 order id (uuid)
-- $2 agent id (uuid)
SELECT EXISTS (
  SELECT 1 FROM work_order_claims c
  WHERE c.work_order_id = $1 AND c.agent_id = $2
    AND
    -- @include live_claim.sql
)
