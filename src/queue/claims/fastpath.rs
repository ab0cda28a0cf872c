//! The one-statement successful complete (issue #7; its twin, claim-next, is
//! `sql/claim_next.sql`). As transactions of four to six statements, the two calls every order
//! goes through held the pull API to a third of the bare-SQL ceiling on two cores (per-statement
//! cost: round trips, context switches, protocol). One statement is one round trip and one commit, and takes the same row
//! locks in the same order (agent → order → claim, see `queue`): each CTE that must lock later
//! reads the earlier one through a sub-query, so the earlier one has run first. The agent row is
//! locked (`FOR NO KEY UPDATE`, which waits for a retirement in flight) rather than rewritten;
//! the contact is rewritten at most once a second (as `sql/record_contact.sql`).
//!
//! The transactional forms remain where one statement cannot be right:
//! * claims of an agent with `max_concurrency`: its held claims must be counted *after* its row
//!   lock is granted, and under READ COMMITTED only a later statement sees claims committed
//!   while it waited;
//! * failures: the retry decision is made in Rust (`rules::decide_failure`).

use uuid::Uuid;

use crate::queue::{LogEntry, LogRow, Queue, QueueError, sql};

impl Queue {
    /// A successful complete in one statement (`sql/complete_success.sql`). `None` when the
    /// agent holds no live claim on the order (the caller explains the 409).
    pub(super) async fn complete_success_one_trip(
        &self,
        order_id: Uuid,
        agent_id: Uuid,
        claim_id: Option<Uuid>,
        message: Option<&str>,
    ) -> Result<Option<LogEntry>, QueueError> {
        let row: Option<LogRow> = sqlx::query_as(sql::COMPLETE_SUCCESS)
            .bind(order_id)
            .bind(agent_id)
            .bind(claim_id)
            .bind(message)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(Into::into))
    }
}
