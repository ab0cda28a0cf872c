//! Agents and orders made straight on a [`Queue`], from the same JSON bodies `POST /agents` and
//! `POST /work-orders` take and through the same validation, for tests and benches that need
//! the queue without the HTTP server.

use serde_json::Value;
use uuid::Uuid;

use crate::queue::validate::{validate_agent, validate_work_order};
use crate::queue::{ClaimRequest, Queue};

/// Registers an agent from a registration body (`NewAgent` as JSON); its id.
///
/// # Panics
/// On a body that does not parse or validate, or a failed insert: a test's own mistake.
pub async fn register_agent(queue: &Queue, body: Value) -> Uuid {
    let spec = validate_agent(serde_json::from_value(body).unwrap()).unwrap();
    queue.register_agent(&spec, None).await.unwrap().agent.id
}

/// Creates a work order from a create body (`NewWorkOrder` as JSON); its id.
///
/// # Panics
/// On a body that does not parse or validate, or a failed insert: a test's own mistake.
pub async fn create_order(queue: &Queue, body: Value) -> Uuid {
    let spec = validate_work_order(serde_json::from_value(body).unwrap()).unwrap();
    queue
        .create_new_work_order(&spec, None)
        .await
        .unwrap()
        .order
        .id
}

/// Claim-next as `agent` for any work type and the default lease; the id of the order it got.
///
/// # Panics
/// On a failed claim (a database error).
pub async fn claim_next_id(queue: &Queue, agent: Uuid) -> Option<Uuid> {
    let req = ClaimRequest {
        agent_id: agent,
        lease_seconds: None,
    };
    queue.claim_next(&req, &[]).await.unwrap().map(|o| o.id)
}

/// Makes an order `RETRY_PENDING` (retry count 1) with its retry `hours` from now: due when
/// negative, and with no `next_retry_after` at all for `None`, which no statement writes but
/// every path must read as not due.
///
/// # Panics
/// On a failed update (a database error).
pub async fn retry_pending(queue: &Queue, order: Uuid, hours: Option<i32>) {
    sqlx::query(
        "UPDATE work_orders SET status = 'RETRY_PENDING', retry_count = 1, \
         next_retry_after = now() + make_interval(hours => $2::int) WHERE id = $1",
    )
    .bind(order)
    .bind(hours)
    .execute(queue.pool())
    .await
    .unwrap();
}
