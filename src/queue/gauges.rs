//! The database gauges of `/metrics`, computed off the scrape path (docs/design.md §5, issue
//! #35). Orders by status, waiting orders by reason and orders per tenant each read every active
//! order: seconds of database time at a million pending, while Prometheus scrapes every replica
//! every few seconds. So one replica per period takes the turn (`sql/take_gauge_turn.sql`),
//! computes them in one read-only snapshot and stores them (`gauge_snapshot`); a scrape on any
//! replica reads that one row ([`Queue::stored_gauges`]) and says how old it is.
//!
//! - [`run_gauge_refresh`]: the loop every `pullman serve` runs; at most one replica computes
//!   per period. A replica whose computation fails gives the turn back at once; another takes
//!   over after four periods (at least a minute) if one dies mid-computation.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::types::Json;
use tokio_util::sync::CancellationToken;

use super::backlog::TenantCount;
use super::explain::{snapshot, waiting_by_reason};
use super::waiting::ReasonCount;
use super::{Queue, QueueError, sql};

/// The most groups of waiting orders (orders sharing work type, tenant, targeting, status and
/// due-ness) whose reason one computation decides. Each group is compared with every live agent,
/// and per-order targeting can make a group of every order; the orders past the cut are counted
/// as [`GaugeFigures::unclassified`].
pub const MAX_WAITING_GROUPS: i64 = 10_000;

/// What one computation of the database gauges found, all of it as of one snapshot. Stored as
/// JSON and read by every replica, so a field or a reason one version adds is ignored, and one
/// it lacks read as empty, by the others during a rolling upgrade.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GaugeFigures {
    /// Active orders per status (`PENDING`, `CLAIMED`, `RETRY_PENDING`); a status without
    /// orders is absent.
    pub statuses: BTreeMap<String, i64>,
    /// Unclaimed orders by why they wait (`WaitReason::as_str`), every reason present
    /// (docs/design.md §10).
    pub waiting: BTreeMap<String, ReasonCount>,
    /// Unclaimed orders in the groups past [`MAX_WAITING_GROUPS`], whose reason was not decided.
    pub unclassified: i64,
    /// Active orders per tenant, the busiest first, the others summed
    /// ([`TenantCount`]).
    pub tenants: Vec<TenantCount>,
}

/// The last stored [`GaugeFigures`] and how old they are.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredGauges {
    pub figures: GaugeFigures,
    /// Seconds since the snapshot that computed them began, by the database's clock.
    pub age_seconds: f64,
}

impl Queue {
    /// Computes the gauges in one read-only `REPEATABLE READ` snapshot, with `top_tenants`
    /// tenants named in [`GaugeFigures::tenants`]. Returns them with the snapshot's start time.
    pub async fn compute_gauges(
        &self,
        top_tenants: i64,
    ) -> Result<(GaugeFigures, DateTime<Utc>), QueueError> {
        let mut tx = snapshot(self).await?;
        let (as_of,): (DateTime<Utc>,) = sqlx::query_as("SELECT now()").fetch_one(&mut *tx).await?;
        let statuses: Vec<(String, i64)> = sqlx::query_as(sql::COUNT_BY_STATUS)
            .fetch_all(&mut *tx)
            .await?;
        let (waiting, unclassified) = waiting_by_reason(&mut tx, MAX_WAITING_GROUPS).await?;
        let tenants = sqlx::query_as(sql::TENANT_COUNTS)
            .bind(top_tenants)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        let figures = GaugeFigures {
            statuses: statuses.into_iter().collect(),
            waiting: waiting
                .into_iter()
                .map(|(reason, count)| (reason.as_str().to_string(), count))
                .collect(),
            unclassified,
            tenants,
        };
        Ok((figures, as_of))
    }

    /// Computes and stores the gauges if this replica takes the turn of the current `period`
    /// (`sql/take_gauge_turn.sql`); `Ok(false)` when another replica has it. A computation or a
    /// store that fails gives the turn back (best effort) before the error is returned.
    pub async fn refresh_gauges(
        &self,
        period: Duration,
        top_tenants: i64,
    ) -> Result<bool, QueueError> {
        let taken: Option<(DateTime<Utc>,)> = sqlx::query_as(sql::TAKE_GAUGE_TURN)
            .bind(period.as_secs_f64())
            .fetch_optional(&self.pool)
            .await?;
        let Some((taken_at,)) = taken else {
            return Ok(false);
        };
        let done = async {
            let (figures, as_of) = self.compute_gauges(top_tenants).await?;
            sqlx::query(sql::STORE_GAUGES)
                .bind(Json(&figures))
                .bind(as_of)
                .execute(&self.pool)
                .await?;
            Ok::<_, QueueError>(())
        };
        if let Err(error) = done.await {
            let _ = sqlx::query(sql::RELEASE_GAUGE_TURN)
                .bind(taken_at)
                .execute(&self.pool)
                .await;
            return Err(error);
        }
        Ok(true)
    }

    /// The last stored gauges, for a scrape: one primary-key read, whatever the queue holds.
    /// `None` until a replica has computed them once.
    pub async fn stored_gauges(&self) -> Result<Option<StoredGauges>, QueueError> {
        let row: Option<(Json<GaugeFigures>, f64)> = sqlx::query_as(sql::READ_GAUGES)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|(Json(figures), age_seconds)| StoredGauges {
            figures,
            age_seconds: age_seconds.max(0.0),
        }))
    }
}

/// Refreshes the stored gauges until `shutdown`: every quarter `period` (at least 250 ms) this
/// replica asks for the turn, so the figures are at most about 1.25 × `period` old while any
/// replica runs. A failed computation is logged and gives the turn back, so the next ask (here or
/// on another replica) computes again. A computation under way when `shutdown` comes is dropped:
/// the process does not wait for it.
pub async fn run_gauge_refresh(
    queue: Queue,
    period: Duration,
    top_tenants: i64,
    shutdown: CancellationToken,
) {
    let tick = (period / 4).max(Duration::from_millis(250));
    loop {
        let refreshed = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = queue.refresh_gauges(period, top_tenants) => r,
        };
        match refreshed {
            Ok(true) => tracing::debug!("database gauges computed"),
            Ok(false) => {}
            Err(error) => {
                if matches!(error, QueueError::Unavailable(_)) {
                    queue.note_database_unavailable();
                }
                tracing::warn!(%error, "could not compute the database gauges; trying again")
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(tick) => {}
        }
    }
}

#[cfg(test)]
#[path = "gauges_tests.rs"]
mod tests;
