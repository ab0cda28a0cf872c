-- Attempt history and re-runs (docs/design.md §5 `GET /work-orders/{id}/attempts`, `POST …/rerun`).
--
-- Every claim of an order is an attempt. Where each one is recorded:
--   * the live claim: its work_order_claims row (as before);
--   * a claim that ended without finishing the order (a failure with a retry scheduled, a release
--     by the reaper, a release when its agent was retired): a row here, written by the statement
--     that ended it;
--   * the claim that finished the order: the log entry's own claimed_by, claim_id, claimed_at,
--     completed_at, outcome and ended_by (set only when a claim was live at the end).
-- So claiming and completing with success write nothing more than before.
CREATE TABLE work_order_attempts (
    claim_id       uuid PRIMARY KEY,
    -- no foreign key: the order moves from work_orders to work_order_log and keeps its history;
    -- rows go with the log entry when the retention sweep deletes it
    work_order_id  uuid NOT NULL,
    agent_id       uuid NOT NULL,
    started_at     timestamptz NOT NULL,
    ended_at       timestamptz NOT NULL DEFAULT now(),
    ended          text NOT NULL CHECK (ended IN ('retry_scheduled', 'reclaimed', 'released')),
    message        text
);
CREATE INDEX work_order_attempts_order ON work_order_attempts (work_order_id, started_at);

-- A re-run is a new order made from a finished one; it names its original.
ALTER TABLE work_orders ADD COLUMN rerun_of uuid;
ALTER TABLE work_order_log ADD COLUMN rerun_of uuid;
