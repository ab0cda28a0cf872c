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
