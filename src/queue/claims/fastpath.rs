//! One-statement forms of the two calls every work order goes through: claim-next and a
//! successful complete (issue #7). As transactions of four to six statements, their per-statement
//! cost (round trips, context switches, protocol) held the pull API to a third of the bare-SQL
//! ceiling on two cores. One statement is one round trip and one commit, and takes the same row
//! locks in the same order (agent → order → claim, see `queue`): each CTE that must lock later
//! reads the earlier one through a sub-query, so the earlier one has run first. The agent row is
//! locked (`FOR NO KEY UPDATE`, which waits for a retirement in flight) rather than rewritten;
//! the contact is rewritten at most once a second ([`CONTACT_DUE`]).
//!
//! The transactional forms remain where one statement cannot be right:
//! * claims of an agent with `max_concurrency`: its held claims must be counted *after* its row
//!   lock is granted, and under READ COMMITTED only a later statement sees claims committed
//!   while it waited;
//! * failures: the retry decision is made in Rust (`rules::decide_failure`).

use std::sync::LazyLock;

use sqlx::postgres::PgRow;
use sqlx::{FromRow, Row};
use uuid::Uuid;

use super::{
    AgentLockRow, AgentSql, CLAIMER_COLUMNS, CONTACT_DUE, ClaimRequest, Claimer, claim_ctes,
    claimed_order_select, eligible,
};
use crate::queue::orders::{EndedBy, LogValues, log_insert};
use crate::queue::{LogEntry, LogRow, OrderRow, Outcome, Queue, QueueError, WorkOrder, WorkType};

/// The locked agent row `a` of the claim-next statement, as sub-queries.
const LOCKED_AGENT: AgentSql<'static> = AgentSql {
    id: "$1::uuid",
    name: "(SELECT a_name FROM a)",
    labels: "(SELECT a_labels FROM a)",
    annotation_pairs: "(SELECT a_annotation_pairs FROM a)",
    // Requested types ($3) and capabilities both admit the type: their intersection.
    work_types: "(cardinality($3::text[]) = 0 OR w.work_type = ANY($3::text[])) \
        AND (cardinality((SELECT a_work_types FROM a)) = 0 \
             OR w.work_type = ANY((SELECT a_work_types FROM a)::text[]))",
    tenant: "(SELECT a_tenant FROM a)",
};

/// $1 agent id, $2 lease seconds, $3 requested work types (empty = all), $4 the new claim id.
/// One row when the agent exists: its columns (`a_*`) and the claimed order's (NULL if none).
/// Claims nothing for a retired agent or one with `max_concurrency` (see the module docs).
fn claim_next_sql() -> String {
    format!(
        "WITH a AS (SELECT {CLAIMER_COLUMNS} FROM agents WHERE id = $1 FOR NO KEY UPDATE), \
         contact AS (UPDATE agents SET last_seen_at = now(), \
             lease_seconds = COALESCE($2::int, lease_seconds) \
           WHERE id = (SELECT a_id FROM a) \
             AND ({CONTACT_DUE} OR lease_seconds IS DISTINCT FROM COALESCE($2::int, lease_seconds))), \
         target AS (SELECT w.id FROM work_orders w \
           WHERE (SELECT a_retired_at IS NULL AND a_max_concurrency IS NULL FROM a) AND {} \
           ORDER BY w.created_at, w.id LIMIT 1 FOR UPDATE SKIP LOCKED), \
         {} \
         SELECT a.*, o.* FROM a LEFT JOIN ({}) o ON true",
        eligible(&LOCKED_AGENT),
        claim_ctes("$4", "$1", "$2"),
        claimed_order_select(),
    )
}

/// $1 order id, $2 agent id, $3 claim id (NULL = the agent's live claim), $4 message.
/// Returns the log entry, or no row when the agent holds no live claim on the order.
fn complete_success_sql() -> String {
    format!(
        "WITH ag AS (SELECT id FROM agents WHERE id = $2 FOR NO KEY UPDATE), \
         contact AS (UPDATE agents SET last_seen_at = now() \
           WHERE id = (SELECT id FROM ag) AND {CONTACT_DUE}), \
         held AS (SELECT id FROM work_orders WHERE id = $1 \
           AND EXISTS (SELECT 1 FROM ag) FOR UPDATE), \
         claim AS (DELETE FROM work_order_claims WHERE work_order_id = (SELECT id FROM held) \
           AND agent_id = $2 AND ($3::uuid IS NULL OR claim_id = $3) AND deadline > now() \
           AND (lease_expires_at IS NULL OR lease_expires_at > now()) \
           RETURNING agent_id, claim_id, claimed_at), \
         w AS (DELETE FROM work_orders WHERE id = $1 AND EXISTS (SELECT 1 FROM claim) \
           RETURNING *) \
         {}",
        log_insert(
            "w CROSS JOIN claim",
            &LogValues {
                outcome: &format!("'{}'", Outcome::Succeeded.as_str()),
                message: "$4",
                last_error: "NULL",
                claimed_by: "claim.agent_id",
                claim_id: "claim.claim_id",
                claimed_at: "claim.claimed_at",
                ended_by: &format!("'{}'", EndedBy::Agent.as_str()),
            }
        )
    )
}

// Built once: these run on every claim and completion, and formatting a statement of a few KiB
// per call is work the prepared-statement cache (keyed by the text) does not save.
static CLAIM_NEXT_SQL: LazyLock<String> = LazyLock::new(claim_next_sql);
static COMPLETE_SUCCESS_SQL: LazyLock<String> = LazyLock::new(complete_success_sql);

impl Queue {
    /// Claim-next in one statement; see [`claim_next_sql`]. `404` for an unknown agent.
    pub(super) async fn claim_next_one_trip(
        &self,
        req: &ClaimRequest,
        requested: &[WorkType],
    ) -> Result<(Claimer, Option<WorkOrder>), QueueError> {
        let requested: Vec<&str> = requested.iter().map(|t| t.as_str()).collect();
        let row: Option<PgRow> = sqlx::query(&CLAIM_NEXT_SQL)
            .bind(req.agent_id)
            .bind(req.lease_seconds)
            .bind(&requested)
            .bind(Uuid::new_v4())
            .fetch_optional(&self.pool)
            .await?;
        let row = row.ok_or_else(|| QueueError::NotFound {
            what: "agent",
            id: req.agent_id.to_string(),
        })?;
        let claimer: Claimer = AgentLockRow::from_row(&row)?.into();
        let order = match row.try_get::<Option<Uuid>, _>("id")? {
            Some(_) => Some(OrderRow::from_row(&row)?.into()),
            None => None,
        };
        Ok((claimer, order))
    }

    /// A successful complete in one statement; see [`complete_success_sql`]. `None` when the
    /// agent holds no live claim on the order (the caller explains the 409).
    pub(super) async fn complete_success_one_trip(
        &self,
        order_id: Uuid,
        agent_id: Uuid,
        claim_id: Option<Uuid>,
        message: Option<&str>,
    ) -> Result<Option<LogEntry>, QueueError> {
        let row: Option<LogRow> = sqlx::query_as(&COMPLETE_SUCCESS_SQL)
            .bind(order_id)
            .bind(agent_id)
            .bind(claim_id)
            .bind(message)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(Into::into))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_claim_next_statement_binds_exactly_four_parameters() {
        let sql = claim_next_sql();
        for p in ["$1", "$2", "$3", "$4"] {
            assert!(sql.contains(p), "{p} missing from {sql}");
        }
        for p in ["$5", "$6", "$7"] {
            assert!(!sql.contains(p), "{p} left in {sql}");
        }
        let sql = complete_success_sql();
        assert!(sql.contains("$4") && !sql.contains("$5"), "{sql}");
    }
}
