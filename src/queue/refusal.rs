//! Why a heartbeat or complete was refused (DESIGN.md §5): the `code` of the `409`.

use uuid::Uuid;

use super::{ConflictCode, Queue, QueueError};

impl Queue {
    /// Says why a heartbeat or complete was refused (DESIGN.md §5): `cancelled` when the order was
    /// cancelled under this agent's claim, `reclaimed` when this agent's claim was released (reaper,
    /// expired lease, retirement) or superseded, `not_claim_holder` otherwise; `404` unknown order.
    pub(super) async fn explain_refusal(
        &self,
        order_id: Uuid,
        agent_id: Uuid,
        claim_id: Option<Uuid>,
    ) -> Result<QueueError, QueueError> {
        let active: Option<(Option<Uuid>, bool)> = sqlx::query_as(
            "SELECT c.agent_id, EXISTS (SELECT 1 FROM released_claims r \
               WHERE r.work_order_id = w.id AND r.agent_id = $2 \
                 AND ($3::uuid IS NULL OR r.claim_id = $3)) \
             FROM work_orders w LEFT JOIN work_order_claims c ON c.work_order_id = w.id \
             WHERE w.id = $1",
        )
        .bind(order_id)
        .bind(agent_id)
        .bind(claim_id)
        .fetch_optional(&self.pool)
        .await?;
        if let Some((holder, released)) = active {
            let (code, why) = if holder == Some(agent_id) {
                (
                    ConflictCode::Reclaimed,
                    "its lease or claim timeout ran out, or the claim named was superseded",
                )
            } else if released {
                (
                    ConflictCode::Reclaimed,
                    "its claim was released by the reaper or by retirement",
                )
            } else {
                (
                    ConflictCode::NotClaimHolder,
                    "another agent holds it or it is not claimed",
                )
            };
            return Ok(QueueError::conflict(
                code,
                format!("agent {agent_id} does not hold work order {order_id}: {why}"),
            ));
        }
        let finished: Option<(String, Option<Uuid>, Option<Uuid>)> = sqlx::query_as(
            "SELECT ended_by, claimed_by, claim_id FROM work_order_log WHERE id = $1",
        )
        .bind(order_id)
        .fetch_optional(&self.pool)
        .await?;
        let mine = |holder: Option<Uuid>, held_claim: Option<Uuid>| {
            holder == Some(agent_id) && claim_id.is_none_or(|c| held_claim == Some(c))
        };
        let Some((ended_by, claimed_by, last_claim)) = finished else {
            return Ok(QueueError::NotFound {
                what: "work order",
                id: order_id.to_string(),
            });
        };
        let (code, why) = match ended_by.as_str() {
            "cancel" if mine(claimed_by, last_claim) => (
                ConflictCode::Cancelled,
                format!("work order {order_id} was cancelled"),
            ),
            "reaper" if mine(claimed_by, last_claim) => (
                ConflictCode::Reclaimed,
                format!(
                    "work order {order_id} was reclaimed and then failed: no agent finished it"
                ),
            ),
            _ => (
                ConflictCode::NotClaimHolder,
                format!(
                    "work order {order_id} already finished; agent {agent_id} holds no claim on it"
                ),
            ),
        };
        Ok(QueueError::conflict(code, why))
    }
}
