-- The database gauges of /metrics, computed off the scrape path (docs/design.md §10, issue #35).
-- Orders by status, waiting orders by reason and orders per tenant read every active order
-- (seconds of database time at a million pending), while Prometheus scrapes every replica every
-- few seconds. One replica per period takes the turn (taken_at older than the period), computes
-- them in one snapshot and writes them here; every replica's scrape reads this one row.
-- figures is queue::gauges::GaugeFigures as JSON; NULL until the first computation.
CREATE TABLE gauge_snapshot (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    taken_at timestamptz NOT NULL DEFAULT '-infinity',
    computed_at timestamptz,
    figures jsonb
);

INSERT INTO gauge_snapshot DEFAULT VALUES;
