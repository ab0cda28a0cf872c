//! The queue as the queue-level tests drive it (no HTTP): the completion they report.

use pullman::queue::Completion;
use sqlx::PgPool;

/// A plain completion: `success` or not, no message, retryable, not a disruption. The report
/// every queue-level test makes when only the end of the claim matters.
pub fn done(success: bool) -> Completion {
    Completion {
        success,
        message: None,
        retryable: true,
        disrupted: false,
    }
}

/// The tenants whose turns are parked (docs/design.md §3 "Parked turns"), sorted.
pub async fn parked(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT tenant FROM tenant_turns WHERE served_at = 'infinity' ORDER BY tenant",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Claim rows whose order is gone: what no way of ending an order may leave, as no foreign key
/// removes them with it (the migration claims_without_cascade). One would hold its concurrency
/// slot for good.
pub async fn orphan_claims(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM work_order_claims c \
         WHERE NOT EXISTS (SELECT 1 FROM work_orders o WHERE o.id = c.work_order_id)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}
