//! Group claims (issue #34): one-order claims of several agents that arrive together share one
//! statement and one commit (`sql/claim_next_group.sql`) instead of one each, as successful
//! completes do (`queue::group_commit`). A claim of k orders costs PostgreSQL about what one claim
//! of one order costs plus a little per order (bench/README.md, "where (2), (2d) and 9a spend
//! their time"), and one-order claims from many agents are what a fleet of one-slot workers sends.
//!
//! The API does not change. The statement hands an agent only what it may take, and what claims
//! run one after another would hand out (the n-th order in hand-out order to the n-th agent, not
//! each agent the first): it serves, with one walk in hand-out order, the agents whose
//! eligibility does not depend on who they are (the same labels, annotations, work types and
//! tenant as the first of them, no `max_concurrency`, not retired, no waiting order targeting
//! them by id or name), the n-th order to the n-th of them. Every other claim of the batch, a
//! claim alone in its batch, and a member whose order was taken by a concurrency key filled
//! meanwhile, is answered [`Reply::Alone`]: its own task runs the single claim, exactly as
//! without group claims (so a lone claim, an unknown or retired agent, a capped one, or one
//! with its own targeted orders sees nothing new). While tenants compete (`queue::turns`) the
//! group walks their turns (`sql/claim_next_group_fair.sql`): it takes what a multi-claim of as
//! many orders would, and parks the turns it found idle after its commit, as a fair claim alone
//! does. A claim whose request is gone by the time its batch runs is dropped unclaimed.
//!
//! How batches form: [`RUNNERS`] (one) task takes claims from a queue (`gather::spawn_runners`),
//! as the group commit's runners do: the first waiting claim, one turn of the scheduler, then
//! what else waits, up to the batch size.

use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgPool, Row};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::super::group_commit::unavailable;
use super::super::turns::park;
use super::super::{OrderRow, QueueError, WorkOrder, sql};
use super::{AgentLockRow, Claimer};

/// Tasks running batches at once. One: the claims that arrive while a group's statement runs
/// wait for it and then go together, where a second runner took them at once in smaller groups
/// and more claims alone. With one, 3.4 → 4.8 claims a commit in (2) (+4 %, claim p99 +1 ms)
/// and 9a+ with 1,000 tenants +10–14 % (`bench/queue.rs`; bench/README.md, issues #34, #40).
/// A claim alone in its batch is answered at once, before the batch's groups run.
pub const RUNNERS: usize = 1;

/// How one claim sent to the batch is answered.
pub(super) enum Reply {
    /// Claimed in the batch's statement: the order (none when nothing eligible was left) and
    /// the agent as the statement read it.
    Claimed(Vec<WorkOrder>, Claimer),
    /// Not served by the batch: the caller claims alone.
    Alone,
    /// The batch failed: the database was unavailable (`503`; whether its statement committed
    /// is unknown, as for any claim answered so, and the reaper releases what it claimed), or
    /// the agent's row did not read.
    Failed(QueueError),
}

/// One claim waiting for its batch.
struct Claim {
    agent_id: Uuid,
    lease_seconds: Option<i32>,
    types: Vec<&'static str>,
    /// Tenants compete (`queue::turns`): the group walks their turns.
    fair: bool,
    reply: oneshot::Sender<Reply>,
}

/// The queue of claims and its runners; the runners stop when the last [`GroupClaims`] clone is
/// dropped.
#[derive(Clone)]
pub(crate) struct GroupClaims {
    sender: mpsc::UnboundedSender<Claim>,
}

impl GroupClaims {
    /// Starts [`RUNNERS`] runners on `pool` (on the current tokio runtime), each claiming for at
    /// most `max_batch` agents per statement.
    pub(crate) fn start(pool: PgPool, max_batch: usize) -> Self {
        let run = move |batch| {
            let pool = pool.clone();
            async move { run_batch(&pool, batch).await }
        };
        GroupClaims {
            sender: crate::gather::spawn_runners(RUNNERS, max_batch.max(2), run),
        }
    }

    /// One order for `agent_id` in the next batch (`types`: the requested work types as bound
    /// to SQL; `fair`: tenants compete, so the group walks their turns as
    /// `sql/claim_next_group_fair.sql`); see [`Reply`].
    pub(super) async fn claim(
        &self,
        agent_id: Uuid,
        lease_seconds: Option<i32>,
        types: Vec<&'static str>,
        fair: bool,
    ) -> Reply {
        let (reply, answer) = oneshot::channel();
        let claim = Claim {
            agent_id,
            lease_seconds,
            types,
            fair,
            reply,
        };
        if self.sender.send(claim).is_err() {
            return Reply::Alone;
        }
        // A runner dropped the claim unanswered (its task ended mid-batch, as the runtime
        // stops): if its statement committed, the order it claimed for this agent waits for the
        // reaper (its lease, or its deadline), as after any claim whose answer was lost; this
        // claim goes on alone.
        answer.await.unwrap_or(Reply::Alone)
    }
}

/// Runs one batch (`gather::spawn_runners`): its groups' statements, and every other claim of it
/// answered [`Reply::Alone`].
async fn run_batch(pool: &PgPool, batch: Vec<Claim>) {
    // A claim whose request is gone (its client left, or the request's own time ran out while
    // the database was away) is not claimed for: nobody would run that order, and it would wait
    // for the reaper.
    let batch = batch.into_iter().filter(|c| !c.reply.is_closed()).collect();
    let (alone, groups): (Vec<_>, Vec<_>) = groups(batch).into_iter().partition(|g| g.len() == 1);
    // The claims no statement here serves go on at once, not after the groups' statements.
    for c in alone.into_iter().flatten() {
        let _ = c.reply.send(Reply::Alone);
    }
    for group in groups {
        run_group(pool, group).await;
    }
}

/// The batch split into groups one statement can serve: the same lease, requested types and
/// walk (plain or fair), each agent once (an agent's second claim of the batch goes in a group of
/// its own).
fn groups(batch: Vec<Claim>) -> Vec<Vec<Claim>> {
    let mut groups: Vec<Vec<Claim>> = Vec::new();
    for claim in batch {
        let fits = groups.iter_mut().find(|g| {
            g[0].lease_seconds == claim.lease_seconds
                && g[0].types == claim.types
                && g[0].fair == claim.fair
                && g.iter().all(|c| c.agent_id != claim.agent_id)
        });
        match fits {
            Some(group) => group.push(claim),
            None => groups.push(vec![claim]),
        }
    }
    groups
}

/// Runs one group's statement (two claims or more), answers each of its claims, then parks the
/// turns the statement named idle (`queue::turns`), as a fair claim alone does after its commit.
async fn run_group(pool: &PgPool, group: Vec<Claim>) {
    let agents: Vec<Uuid> = group.iter().map(|c| c.agent_id).collect();
    let claim_ids: Vec<Uuid> = group.iter().map(|_| Uuid::new_v4()).collect();
    let statement = if group[0].fair {
        sql::CLAIM_NEXT_GROUP_FAIR
    } else {
        sql::CLAIM_NEXT_GROUP
    };
    let rows: Result<Vec<PgRow>, sqlx::Error> = sqlx::query(statement)
        .bind(&agents)
        .bind(&claim_ids)
        .bind(group[0].lease_seconds)
        .bind(&group[0].types)
        .fetch_all(pool)
        .await;
    let rows = match rows.map_err(QueueError::from) {
        Ok(rows) => rows,
        Err(QueueError::Unavailable(error)) => {
            tracing::warn!(%error, claims = group.len(), "a group claim found the database unavailable; answering each claim 503");
            let why = error.to_string();
            for c in group {
                let _ = c
                    .reply
                    .send(Reply::Failed(unavailable("group claim", &why)));
            }
            return;
        }
        Err(error) => {
            tracing::warn!(%error, claims = group.len(), "a group claim failed; claiming for each agent alone");
            Vec::new()
        }
    };
    for c in group {
        let reply = rows
            .iter()
            .find(|row| row.try_get::<Uuid, _>("a_id").ok() == Some(c.agent_id))
            .map_or(Reply::Alone, answer);
        // The request may be gone (its client disconnected): an order claimed for it stays
        // claimed until its lease or deadline ends, as after any claim whose answer was lost.
        let _ = c.reply.send(reply);
    }
    // Every row names the statement's idle turns; one that does not read names none.
    let idle: Vec<Uuid> = rows
        .first()
        .and_then(|row| row.try_get("idle_turns").ok())
        .unwrap_or_default();
    park(pool, &idle).await;
}

/// One agent's row of `claim_next_group.sql` (or `claim_next_group_fair.sql`) as its
/// [`Reply`]. A row that does not read is an error (`500`), not [`Reply::Alone`]: the statement
/// has committed, and an order it claimed for the agent must not be followed by a second claim
/// while the first waits for the reaper.
fn answer(row: &PgRow) -> Reply {
    let read = || -> Result<Reply, sqlx::Error> {
        let member: bool = row.try_get("member")?;
        let contended: bool = row.try_get("contended")?;
        let claimed = row.try_get::<Option<Uuid>, _>("id")?.is_some();
        let short: bool = row.try_get("short")?;
        if !member || contended || !(claimed || short) {
            return Ok(Reply::Alone);
        }
        let claimer: Claimer = AgentLockRow::from_row(row)?.into();
        let orders = if claimed {
            vec![OrderRow::from_row(row)?.into()]
        } else {
            Vec::new()
        };
        Ok(Reply::Claimed(orders, claimer))
    };
    read().unwrap_or_else(|error| Reply::Failed(error.into()))
}
