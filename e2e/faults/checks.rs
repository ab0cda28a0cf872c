//! The verdict, read from the database once the queue has drained, against what the clients saw:
//! every created order is in the log exactly once and none is left active; no order was completed
//! twice; every complete the server accepted carried the `claim_id` the log records.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use uuid::Uuid;

use crate::load::{ClaimRecord, CompleteRecord, CreateRecord, Verdict};

/// Connects to the database, retrying while it comes up.
pub async fn connect(url: &str) -> anyhow::Result<PgPool> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect(url)
            .await
        {
            Ok(pool) => return Ok(pool),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Waits until no order is active (the suite's database holds only its own orders). Returns how
/// long it took, or `None` at the deadline.
pub async fn wait_drained(pool: &PgPool, deadline: Duration) -> Option<Duration> {
    let started = Instant::now();
    loop {
        let active: Result<(i64,), _> = sqlx::query_as("SELECT count(*) FROM work_orders")
            .fetch_one(pool)
            .await;
        if matches!(active, Ok((0,))) {
            return Some(started.elapsed());
        }
        if started.elapsed() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A finished order as the log records it.
#[derive(Debug, sqlx::FromRow)]
struct LogRow {
    id: Uuid,
    seq: Option<i32>,
    outcome: String,
    ended_by: String,
    claim_id: Option<Uuid>,
    claimed_by: Option<Uuid>,
}

/// What the checks found.
#[derive(Debug, Default)]
pub struct Checks {
    /// Invariant violations: each fails the run.
    pub violations: Vec<String>,
    /// Markers created more than once after a create whose answer was lost: fails the run only
    /// unless `--lenient-retry-safety`.
    pub duplicates: Vec<String>,
    pub created: usize,
    pub gave_up: usize,
    pub create_attempts: u64,
    pub creates_with_lost_answer: usize,
    pub log_rows: usize,
    pub active_left: i64,
    /// `outcome/ended_by` → count.
    pub outcomes: BTreeMap<String, usize>,
    pub completes_finished: usize,
    pub completes_retry: usize,
    pub completes_refused: usize,
    pub completes_unknown: usize,
    /// Orders an agent finished although it never saw the `200` (its answer was lost).
    pub finished_unseen: usize,
    /// Completes the server applied although it answered `5xx` or nothing, after which the
    /// agent's retry with the same claim was refused: the agent could not tell its success from
    /// a loss (issue 14, "Retry-safe calls").
    pub applied_but_refused: Vec<String>,
    /// Stale completes: verdict → count.
    pub stale: BTreeMap<String, usize>,
}

/// Runs every check.
pub async fn check(
    pool: &PgPool,
    creates: &[CreateRecord],
    claims: &[ClaimRecord],
    completes: &[CompleteRecord],
) -> anyhow::Result<Checks> {
    let mut c = Checks::default();
    let rows: Vec<LogRow> = sqlx::query_as(
        "SELECT id, substring(yaml_content from 'fault-order-([0-9]+)')::int AS seq, outcome, \
                ended_by, claim_id, claimed_by \
         FROM work_order_log",
    )
    .fetch_all(pool)
    .await?;
    let active: Vec<(Uuid, String)> = sqlx::query_as("SELECT id, status FROM work_orders")
        .fetch_all(pool)
        .await?;
    c.log_rows = rows.len();
    c.active_left = active.len() as i64;
    for (id, status) in active.iter().take(10) {
        c.violations.push(format!(
            "order {id} is still {status} after the drain deadline"
        ));
    }
    // No foreign key removes a claim row with its order (the migration claims_without_cascade):
    // every way an order ends must, or the row would hold its key's slot for good.
    let orphans: Vec<(Uuid,)> = sqlx::query_as(
        "SELECT c.work_order_id FROM work_order_claims c \
         WHERE NOT EXISTS (SELECT 1 FROM work_orders o WHERE o.id = c.work_order_id) LIMIT 10",
    )
    .fetch_all(pool)
    .await?;
    for (order,) in orphans {
        c.violations
            .push(format!("a claim row of order {order} outlived its order"));
    }
    let log: HashMap<Uuid, &LogRow> = rows.iter().map(|r| (r.id, r)).collect();
    for r in &rows {
        *c.outcomes
            .entry(format!("{}/{}", r.outcome, r.ended_by))
            .or_default() += 1;
    }

    // Every created order is in the log exactly once (the id is the log's key); markers tell
    // orders created twice.
    let mut by_seq: HashMap<i32, Vec<Uuid>> = HashMap::new();
    for r in &rows {
        match r.seq {
            Some(seq) => by_seq.entry(seq).or_default().push(r.id),
            None => c
                .violations
                .push(format!("log entry {} carries no order marker", r.id)),
        }
    }
    let active_ids: HashSet<Uuid> = active.iter().map(|(id, _)| *id).collect();
    for create in creates {
        c.create_attempts += u64::from(create.attempts);
        if create.lost_answers > 0 {
            c.creates_with_lost_answer += 1;
        }
        match create.id {
            Some(id) => {
                c.created += 1;
                if !log.contains_key(&id) && !active_ids.contains(&id) {
                    c.violations.push(format!(
                        "lost: order {id} (marker fault-order-{}) was created (201) but is \
                         neither active nor in the log",
                        create.seq
                    ));
                }
            }
            None => c.gave_up += 1,
        }
        let copies = by_seq.get(&(create.seq as i32)).map_or(0, Vec::len);
        if copies > 1 {
            let line = format!(
                "marker fault-order-{} is in the log {copies} times ({:?}) after {} create \
                 attempts, {} of them with the answer lost",
                create.seq,
                by_seq[&(create.seq as i32)],
                create.attempts,
                create.lost_answers
            );
            if create.lost_answers == 0 {
                c.violations
                    .push(format!("created twice from one request: {line}"));
            } else {
                c.duplicates.push(line);
            }
        }
    }

    // No order completed twice; every accepted complete carried the logged claim.
    let received: HashMap<Uuid, &ClaimRecord> = claims.iter().map(|cl| (cl.claim, cl)).collect();
    let mut finished_claims: HashMap<Uuid, HashSet<Uuid>> = HashMap::new();
    let mut seen_finished: HashSet<Uuid> = HashSet::new();
    for done in completes {
        match &done.verdict {
            Verdict::Finished => c.completes_finished += 1,
            Verdict::RetryScheduled => c.completes_retry += 1,
            Verdict::Refused(_) => c.completes_refused += 1,
            Verdict::Unknown => c.completes_unknown += 1,
        }
        if done.stale {
            let key = match &done.verdict {
                Verdict::Finished => "accepted (200)".to_string(),
                Verdict::RetryScheduled => "accepted (202)".to_string(),
                Verdict::Refused(code) => format!("refused ({code})"),
                Verdict::Unknown => "no answer".to_string(),
            };
            *c.stale.entry(key).or_default() += 1;
        }
        let logged = log.get(&done.order);
        match done.verdict {
            Verdict::Finished => {
                seen_finished.insert(done.order);
                finished_claims
                    .entry(done.order)
                    .or_default()
                    .insert(done.claim);
                match logged {
                    None => c.violations.push(format!(
                        "complete of order {} with claim {} was accepted (200) but the order is \
                         not in the log",
                        done.order, done.claim
                    )),
                    Some(row) if row.claim_id != Some(done.claim) => c.violations.push(format!(
                        "claim_id mismatch: complete of order {} by agent {} with claim {} \
                             was accepted (200), but the log records claim {:?} ({}/{})",
                        done.order, done.agent, done.claim, row.claim_id, row.outcome, row.ended_by
                    )),
                    Some(row) if row.claimed_by != Some(done.agent) => c.violations.push(format!(
                        "complete of order {} by agent {} was accepted (200), but the log \
                             records agent {:?}",
                        done.order, done.agent, row.claimed_by
                    )),
                    Some(row) if done.success && row.outcome != "succeeded" => {
                        c.violations.push(format!(
                            "a successful complete of order {} was accepted (200), but the log \
                             records it {}",
                            done.order, row.outcome
                        ))
                    }
                    Some(_) => {}
                }
            }
            Verdict::RetryScheduled => {
                if let Some(row) = logged
                    && row.claim_id == Some(done.claim)
                {
                    c.violations.push(format!(
                        "order {} was logged under claim {} whose complete scheduled a retry \
                         (202)",
                        done.order, done.claim
                    ));
                }
            }
            Verdict::Refused(_) => {
                if done.lost_before
                    && let Some(row) = logged
                    && row.claim_id == Some(done.claim)
                    && row.claimed_by == Some(done.agent)
                {
                    let answers: Vec<String> =
                        done.answers.iter().map(|a| format!("{a:?}")).collect();
                    c.applied_but_refused.push(format!(
                        "complete of order {} (claim {}) answered {} — yet the log records it \
                         finished under that claim ({})",
                        done.order,
                        done.claim,
                        answers.join(" then "),
                        row.outcome
                    ));
                }
            }
            Verdict::Unknown => {}
        }
    }
    for (order, claims) in &finished_claims {
        if claims.len() > 1 {
            c.violations.push(format!(
                "completed twice: order {order} accepted a finishing complete (200) from {} \
                 claims: {claims:?}",
                claims.len()
            ));
        }
    }
    // `disruption` is an agent's own complete too (of a disrupted attempt, docs/design.md §12).
    for row in rows
        .iter()
        .filter(|r| r.ended_by == "agent" || r.ended_by == "disruption")
    {
        match row.claim_id.and_then(|claim| received.get(&claim)) {
            Some(cl) if cl.order == row.id && Some(cl.agent) == row.claimed_by => {}
            Some(cl) => c.violations.push(format!(
                "order {} was finished by agent {:?} under claim {}, which agent {} received \
                 for order {}",
                row.id, row.claimed_by, cl.claim, cl.agent, cl.order
            )),
            None => c.violations.push(format!(
                "order {} was finished by an agent under claim {:?}, which no agent received",
                row.id, row.claim_id
            )),
        }
        if !seen_finished.contains(&row.id) {
            c.finished_unseen += 1;
        }
    }
    Ok(c)
}
