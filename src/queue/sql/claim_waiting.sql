-- claim_waiting: what the holder of an order's live claim says holds the order up (docs/design.md
-- §12, set by heartbeat.sql), or no row when the order has no live claim or its holder says
-- nothing holds it up.
-- $1 order id (uuid)
-- Returns the holder's words (jsonb ClaimWaiting).
SELECT c.waiting
FROM work_order_claims c
WHERE c.work_order_id = $1 AND c.waiting IS NOT NULL
  AND
  -- @include live_claim.sql
