//! Tenant turns (docs/design.md §3, issue #40): of the orders an agent may take, the tenant
//! served least recently goes first. A row per tenant with orders (`tenant_turns`, kept by a
//! trigger on every insert of orders) says when a claim last served it; while two or more
//! tenants have turns, claims walk the turns in that order (`sql/turn_walk.sql`) and move the
//! served tenant's turn to the back (`sql/serve_turns.sql`).
//!
//! With one tenant (a team alone, or nobody using tenants) that order is priority, then age,
//! and the claim walks one index (`sql/handout_walk.sql`) without touching `tenant_turns`: the
//! turn walk and its write cost a claim 6–20 % of its throughput (pgbench, bench/README.md
//! "Fair share"), for nothing to choose between. [`TurnMode`] tells the claim which one it is, from a look at `tenant_turns` at most
//! once a second per process ([`CHECK_EVERY`]), and at once after this process created an order
//! of a tenant other than the one it knew. So for up to a second after another replica created
//! the first order of a second tenant, this replica's claims still hand out by priority and
//! age: the order of hand-out is approximate, never the set of orders (eligibility is the same
//! in both walks).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Queue, QueueError, sql};

/// How old [`TurnMode`]'s knowledge of the tenants may get before a claim looks again.
pub(super) const CHECK_EVERY: Duration = Duration::from_secs(1);

/// How long [`Queue::drop_idle_turns`] waits for its table lock before it gives up until the
/// next pass: while it waits, claims and creations queue behind it.
const TURN_LOCK_TIMEOUT: &str = "100ms";

/// The longest [`Queue::drop_idle_turns`]'s delete may hold the table lock.
const TURN_DROP_TIMEOUT: &str = "1s";

/// Most turns one [`Queue::drop_idle_turns`] deletes: the rest wait for the next pass.
const DROP_AT_MOST: i64 = 10_000;

/// Most parked turns one [`Queue::unpark_stranded_turns`] unparks: each takes a lock-table entry
/// until its commit.
const UNPARK_AT_MOST: i32 = 64;

/// Whether tenants compete for agents, as this process last saw `tenant_turns`.
#[derive(Debug, Default)]
pub(super) struct TurnMode {
    state: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    /// When `tenant_turns` was last read; `None`: never, or an order since made it stale.
    at: Option<Instant>,
    /// Two or more tenants had turns.
    compete: bool,
    /// With one turn, its tenant (`None` inside: the orders without a tenant); `None` with
    /// none or with several.
    sole: Option<Option<String>>,
}

/// Marks what [`TurnMode`] knows as stale when dropped: a read of the turns that did not
/// finish.
struct Unread<'a>(&'a TurnMode);

impl Drop for Unread<'_> {
    fn drop(&mut self) {
        self.0.state.lock().expect("turn mode lock").at = None;
    }
}

impl TurnMode {
    /// Whether a claim must walk tenant turns (`sql/claim_next_fair.sql`) rather than priority
    /// and age alone (`sql/claim_next.sql`). Reads `sql/competing_tenants.sql` when what this
    /// process knows is older than [`CHECK_EVERY`] or stale; one caller reads while the others
    /// go on with what was known.
    pub(super) async fn fair(&self, pool: &sqlx::PgPool) -> Result<bool, QueueError> {
        let now = Instant::now();
        {
            let mut seen = self.state.lock().expect("turn mode lock");
            // (A read in flight set a time ahead of now: duration_since is zero then.)
            if matches!(seen.at, Some(at) if now.duration_since(at) < CHECK_EVERY) {
                return Ok(seen.compete);
            }
            // Claims the read: until it answers, others see a fresh time and do not read too.
            seen.at = Some(now + CHECK_EVERY);
        }
        // A read that fails, or whose claim is dropped mid-way (its client went away), leaves
        // the next claim to read again, not the time ahead set above.
        let unread = Unread(self);
        let read: Result<Vec<(Option<String>,)>, sqlx::Error> =
            sqlx::query_as(sql::COMPETING_TENANTS).fetch_all(pool).await;
        let tenants = read?;
        std::mem::forget(unread);
        let mut seen = self.state.lock().expect("turn mode lock");
        seen.compete = tenants.len() >= 2;
        seen.sole = match tenants.as_slice() {
            [(tenant,)] => Some(tenant.clone()),
            _ => None,
        };
        // Unless an order made it stale while the read was in flight.
        if seen.at.is_some() {
            seen.at = Some(Instant::now());
        }
        Ok(seen.compete)
    }

    /// Called after this process created an order of `tenant`: when tenants did not compete
    /// and this is not the one tenant known, the next claim looks again.
    pub(super) fn order_created(&self, tenant: Option<&str>) {
        let mut seen = self.state.lock().expect("turn mode lock");
        if !seen.compete && seen.sole.as_ref().map(|t| t.as_deref()) != Some(tenant) {
            seen.at = None;
        }
    }
}

/// [`Queue::park_turns`] on `pool`: also for the group claims (`queue::claims::group`), which
/// run on the pool, not on a [`Queue`].
pub(super) async fn park(pool: &sqlx::PgPool, tenants: &[uuid::Uuid]) {
    if tenants.is_empty() {
        return;
    }
    let parked: Result<i32, sqlx::Error> = sqlx::query_scalar(sql::PARK_TURNS)
        .bind(tenants)
        .fetch_one(pool)
        .await;
    match parked {
        Ok(n) => tracing::trace!(named = tenants.len(), parked = n, "tenant turns parked"),
        Err(error) => tracing::debug!(%error, "idle tenant turns not parked"),
    }
}

impl Queue {
    /// Parks the turns of `tenants` (tenant keys a claim named idle, `sql/claim_next_result.sql`)
    /// whose tenants have no order to hand out (docs/design.md §3 "Parked turns";
    /// `sql/park_turns.sql`), so the next claims' walks do not step past them. Called after the
    /// claim committed: the look that decides is taken under each tenant's lock, after it. A
    /// failure is logged and dropped: the claim has happened, and a later claim names the turn
    /// again.
    pub(super) async fn park_turns(&self, tenants: &[uuid::Uuid]) {
        park(&self.pool, tenants).await;
    }

    /// Unparks up to [`UNPARK_AT_MOST`] parked turns whose tenants have orders to hand out
    /// (docs/design.md §3 "Parked turns"; `sql/unpark_stranded_turns.sql`): the repair for a
    /// statement that created orders of more than 64 tenants while a claim parked one of them.
    /// Returns how many; queue maintenance calls it every pass.
    pub async fn unpark_stranded_turns(&self) -> Result<u64, QueueError> {
        let n: i32 = sqlx::query_scalar(sql::UNPARK_STRANDED_TURNS)
            .bind(UNPARK_AT_MOST)
            .fetch_one(&self.pool)
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Deletes the turns (`tenant_turns`, docs/design.md §3) of tenants that have no order left,
    /// claimed ones included (a claimed order may come back without an insert), so the claim's
    /// walk over the turns stays as short as the tenants with work, and one tenant alone is
    /// back to the plain walk. Returns how many it dropped: 0 without taking any lock when there
    /// is nothing to drop, and 0 when the table lock ([`TURN_LOCK_TIMEOUT`]) was not granted
    /// (the next pass tries again). The idle tenants are found before the lock is taken, at most
    /// [`DROP_AT_MOST`], and checked again under it. `sql/idle_turns.sql`,
    /// `sql/lock_tenant_turns.sql`, `sql/drop_idle_turns.sql`.
    pub async fn drop_idle_turns(&self) -> Result<u64, QueueError> {
        let idle: Vec<(uuid::Uuid,)> = sqlx::query_as(sql::IDLE_TURNS)
            .bind(DROP_AT_MOST)
            .fetch_all(&self.pool)
            .await?;
        if idle.is_empty() {
            return Ok(0);
        }
        let idle: Vec<uuid::Uuid> = idle.into_iter().map(|(key,)| key).collect();
        let mut tx = self.pool.begin().await?;
        // The lock holds creations and fair claims off: wait for it briefly, and hold it for
        // the few index probes of the delete only.
        for setting in [
            format!("SET LOCAL lock_timeout = '{TURN_LOCK_TIMEOUT}'"),
            format!("SET LOCAL statement_timeout = '{TURN_DROP_TIMEOUT}'"),
        ] {
            sqlx::query(&setting).execute(&mut *tx).await?;
        }
        match sqlx::query(sql::LOCK_TENANT_TURNS).execute(&mut *tx).await {
            Ok(_) => {}
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55P03") => {
                tracing::debug!("idle tenant turns not dropped: the table lock was busy");
                return Ok(0);
            }
            Err(e) => return Err(e.into()),
        }
        let dropped = sqlx::query(sql::DROP_IDLE_TURNS)
            .bind(&idle)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(dropped)
    }
}

#[cfg(test)]
mod tests {
    use std::task::Poll;

    use super::*;

    /// A claim dropped while it reads the turns (its client went away) leaves the next claim
    /// to read them, rather than what it knew being taken as fresh for another second.
    #[tokio::test]
    async fn a_read_dropped_midway_leaves_the_next_claim_to_read() {
        let pool = crate::testing::fresh_pool(1).await;
        let mode = TurnMode::default();
        assert!(!mode.fair(&pool).await.unwrap(), "no tenant has a turn");
        mode.order_created(Some("a"));
        // The pool's one connection is taken: the read waits for it.
        let held = pool.acquire().await.unwrap();
        {
            let read = mode.fair(&pool);
            let mut read = std::pin::pin!(read);
            let polled = std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await;
            assert!(polled.is_pending(), "the read waits for a connection");
            assert!(
                mode.state.lock().unwrap().at.is_some(),
                "a read in flight holds the others off"
            );
        }
        assert!(
            mode.state.lock().unwrap().at.is_none(),
            "the dropped read left what is known stale"
        );
        drop(held);
        assert!(!mode.fair(&pool).await.unwrap());
        assert!(mode.state.lock().unwrap().at.is_some(), "read, and fresh");
    }
}
