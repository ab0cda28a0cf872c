//! Creating, reading, listing and cancelling work orders, the move to the log, and the filters of
//! their lists (an id prefix among them) (docs/design.md §2, §5).

use chrono::{DateTime, Utc};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use super::text;
use super::validate::WorkOrderSpec;
use super::{
    ConflictCode, LogEntry, LogRow, Lookup, OnConflict, OrderRow, OrderStatus, Outcome, Page,
    Queue, QueueError, SOURCE_API, WorkOrder, WorkType, cursor, sql,
};

/// Filters of `GET /api/v1/work-orders`.
#[derive(Debug, Clone, Default)]
pub struct OrderFilter {
    pub status: Option<OrderStatus>,
    pub work_type: Option<WorkType>,
    /// Orders targeting this label (U+0000 removed, as it was from stored labels).
    pub label: Option<String>,
    /// Orders this agent holds a claim on now.
    pub agent_id: Option<Uuid>,
    /// Orders created at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Orders whose id starts with this prefix.
    pub id_prefix: Option<IdPrefix>,
    /// Items in the page, within [`super::limits::PAGE_LIMIT`] (the API checks it).
    pub limit: i64,
    pub cursor: Option<String>,
}

/// Filters of `GET /api/v1/work-order-log` (newest first).
#[derive(Debug, Clone, Default)]
pub struct LogFilter {
    pub work_type: Option<WorkType>,
    /// `true` = succeeded; `false` = failed or cancelled.
    pub success: Option<bool>,
    pub outcome: Option<Outcome>,
    /// Agent of the last claim.
    pub agent_id: Option<Uuid>,
    /// Orders that targeted this label.
    pub label: Option<String>,
    /// Orders finished at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Orders whose id starts with this prefix.
    pub id_prefix: Option<IdPrefix>,
    /// Items in the page, within [`super::limits::PAGE_LIMIT`] (the API checks it).
    pub limit: i64,
    pub cursor: Option<String>,
}

/// A prefix of a work order id as git and docker take them: 1–32 hex digits, dashes anywhere
/// ignored, any case. Matches the ids in `[low, high]`, a range the primary key index serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdPrefix {
    pub low: Uuid,
    pub high: Uuid,
}

impl IdPrefix {
    /// Parses `text`; the error names the `id_prefix` query parameter.
    pub fn parse(text: &str) -> Result<Self, QueueError> {
        let hex: String = text.chars().filter(|c| *c != '-').collect();
        if hex.is_empty() || hex.len() > 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(QueueError::Invalid {
                field: "id_prefix".into(),
                message: format!(
                    "id_prefix must be 1 to 32 hexadecimal digits (dashes allowed), got {text:?}"
                ),
            });
        }
        let padded = |fill: char| {
            let full: String = hex
                .chars()
                .chain(std::iter::repeat(fill))
                .take(32)
                .collect();
            Uuid::from_u128(u128::from_str_radix(&full, 16).expect("32 hex digits"))
        };
        Ok(IdPrefix {
            low: padded('0'),
            high: padded('f'),
        })
    }
}

/// Who ended an order; recorded so a late heartbeat can be told `cancelled` or `reclaimed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndedBy {
    Agent,
    /// The agent, reporting an attempt ended by a disruption that the order was not run again
    /// after (docs/design.md §12); read like `Agent` by refusals and replays.
    Disruption,
    Reaper,
    Cancel,
}

impl EndedBy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EndedBy::Agent => "agent",
            EndedBy::Disruption => "disruption",
            EndedBy::Reaper => "reaper",
            EndedBy::Cancel => "cancel",
        }
    }
}

/// The claim that was live (or last) when an order finished, recorded in the log.
pub(crate) struct FinalClaim {
    pub agent_id: Uuid,
    pub claim_id: Uuid,
    pub claimed_at: DateTime<Utc>,
}

impl Lookup {
    /// The active order `id` found, or the error an order route answers without one:
    /// `Finished` for an order in the log, `NotFound` for an unknown id.
    pub(super) fn into_active(self, id: Uuid) -> Result<Box<WorkOrder>, QueueError> {
        match self {
            Lookup::Active(order) => Ok(order),
            Lookup::Finished(entry) => Err(QueueError::Finished {
                id,
                outcome: entry.outcome.as_str(),
            }),
            Lookup::Unknown => Err(QueueError::NotFound {
                what: "work order",
                id: id.to_string(),
            }),
        }
    }
}

impl Queue {
    /// Creates the work order of id `id` (a WorkOrder resource's uid, docs/design.md §6) and returns
    /// it as the insert wrote it (`PENDING`), or, idempotently, the order of that id as it is
    /// when it is already active or in the log: never duplicated, never brought back to life.
    pub async fn create_work_order(
        &self,
        spec: &WorkOrderSpec,
        id: Uuid,
        source: &str,
    ) -> Result<Lookup, QueueError> {
        let mut tx = self.pool.begin().await?;
        let Some(row) = insert_order(&mut *tx, id, spec, source, None).await? else {
            drop(tx);
            return self.lookup(id, true).await;
        };
        // The insert's own check of the log used its snapshot: an order of this id that a
        // complete moved to the log while the insert waited on its row is only visible to a
        // later statement. Then the id is finished, and must stay so.
        let (finished,): (bool,) = sqlx::query_as(sql::ORDER_FINISHED)
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        if finished {
            drop(tx);
            return self.lookup(id, true).await;
        }
        supersede(&mut tx, id, spec).await?;
        tx.commit().await?;
        // After the commit: a look at the turns made before it would not see this tenant's.
        self.turns.order_created(spec.tenant.as_deref());
        Ok(Lookup::Active(Box::new(row.into())))
    }

    /// Creates a work order with a fresh random id (docs/design.md §5 `POST /work-orders`) and returns
    /// it as inserted (`PENDING`, whatever an agent does with it a moment later).
    ///
    /// Without `key`: one statement, one commit. With an `Idempotency-Key` (§5 "Retry safety"):
    /// the first call creates the order and records the answer under the key; a repeat with the
    /// same key and the same request gets that recorded answer again (`replayed`), however the
    /// order has fared since; the same key with a different request is `IdempotencyKeyReused`.
    /// Concurrent calls with one key create one order: the second waits on the first's key row.
    /// Keys are kept for [`IDEMPOTENCY_KEY_RETENTION`].
    pub async fn create_new_work_order(
        &self,
        spec: &WorkOrderSpec,
        key: Option<&IdempotencyKey>,
    ) -> Result<Created, QueueError> {
        self.create_api_order(spec, key, None).await
    }

    /// [`Queue::create_new_work_order`], recording the order as a re-run of `rerun_of` when given
    /// (`Queue::rerun`).
    pub(super) async fn create_api_order(
        &self,
        spec: &WorkOrderSpec,
        key: Option<&IdempotencyKey>,
        rerun_of: Option<Uuid>,
    ) -> Result<Created, QueueError> {
        let Some(key) = key else {
            let order = if supersedes(spec) {
                let mut tx = self.pool.begin().await?;
                let order = insert_fresh(&mut *tx, Uuid::new_v4(), spec, rerun_of).await?;
                supersede(&mut tx, order.id, spec).await?;
                tx.commit().await?;
                order
            } else {
                insert_fresh(&self.pool, Uuid::new_v4(), spec, rerun_of).await?
            };
            self.turns.order_created(spec.tenant.as_deref());
            return Ok(Created {
                order,
                replayed: false,
            });
        };
        let mut tx = self.pool.begin().await?;
        let id = Uuid::new_v4();
        let fresh: Option<(Uuid,)> = sqlx::query_as(sql::INSERT_IDEMPOTENCY_KEY)
            .bind(&key.key)
            .bind(&key.request_sha256[..])
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
        if fresh.is_none() {
            drop(tx);
            return self.replay_creation(key).await;
        }
        let order = insert_fresh(&mut *tx, id, spec, rerun_of).await?;
        supersede(&mut tx, id, spec).await?;
        sqlx::query(sql::RECORD_IDEMPOTENT_RESPONSE)
            .bind(&key.key)
            .bind(sqlx::types::Json(&order))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.turns.order_created(spec.tenant.as_deref());
        Ok(Created {
            order,
            replayed: false,
        })
    }

    async fn replay_creation(&self, key: &IdempotencyKey) -> Result<Created, QueueError> {
        let recorded: Option<(Vec<u8>, Option<sqlx::types::Json<WorkOrder>>)> =
            sqlx::query_as(sql::IDEMPOTENCY_KEY)
                .bind(&key.key)
                .fetch_optional(&self.pool)
                .await?;
        match recorded {
            Some((hash, _)) if hash[..] != key.request_sha256[..] => Err(QueueError::conflict(
                ConflictCode::IdempotencyKeyReused,
                format!(
                    "Idempotency-Key {:?} was used for a different request; use a new key for a \
                     new work order",
                    key.key
                ),
            )),
            Some((_, Some(response))) => Ok(Created {
                order: response.0,
                replayed: true,
            }),
            // Written in the transaction that inserted the key, so never seen without it; and a
            // key that expired between the two statements is simply gone.
            _ => Err(QueueError::conflict(
                ConflictCode::IdempotencyKeyReused,
                format!(
                    "Idempotency-Key {:?} expired while it was being used; retry",
                    key.key
                ),
            )),
        }
    }

    /// Finds an order by id, active or finished (docs/design.md §5 `GET /work-orders/{id}`).
    pub async fn lookup(&self, id: Uuid, with_yaml: bool) -> Result<Lookup, QueueError> {
        if let Some(order) = self.get_active(id, with_yaml).await? {
            return Ok(Lookup::Active(Box::new(order)));
        }
        match self.get_log_entry_opt(id, with_yaml).await? {
            Some(entry) => Ok(Lookup::Finished(Box::new(entry))),
            None => Ok(Lookup::Unknown),
        }
    }

    /// One active order; `404` (`Finished` when it is in the log) otherwise.
    pub async fn get_work_order(&self, id: Uuid) -> Result<WorkOrder, QueueError> {
        self.lookup(id, true)
            .await?
            .into_active(id)
            .map(|order| *order)
    }

    pub(crate) async fn get_active(
        &self,
        id: Uuid,
        with_yaml: bool,
    ) -> Result<Option<WorkOrder>, QueueError> {
        let statement = if with_yaml {
            sql::GET_ORDER
        } else {
            sql::GET_ORDER_SUMMARY
        };
        let row: Option<OrderRow> = sqlx::query_as(statement)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(Into::into))
    }

    /// Active orders, oldest first, without `yaml_content` (docs/design.md §5).
    pub async fn list_work_orders(&self, f: &OrderFilter) -> Result<Page<WorkOrder>, QueueError> {
        let after = f.cursor.as_deref().map(cursor::decode).transpose()?;
        let mut tx = cursor::page_transaction(&self.pool).await?;
        let rows: Vec<OrderRow> = sqlx::query_as(sql::LIST_WORK_ORDERS)
            .bind(f.status.map(OrderStatus::as_str))
            .bind(f.work_type.map(WorkType::as_str))
            .bind(after.map(|a| a.0))
            .bind(after.map(|a| a.1))
            .bind(f.limit)
            .bind(f.label.as_deref().map(text::without_nul))
            .bind(f.agent_id)
            .bind(f.since)
            .bind(f.id_prefix.map(|p| p.low))
            .bind(f.id_prefix.map(|p| p.high))
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        let items: Vec<WorkOrder> = rows.into_iter().map(Into::into).collect();
        Ok(cursor::page(items, f.limit, |o| (o.created_at, o.id)))
    }

    /// Cancels an active order (docs/design.md §2): it moves to the log as `cancelled`, claimed or not;
    /// the holder learns it at its next heartbeat or complete. `message` says who cancelled.
    pub async fn cancel_work_order(&self, id: Uuid, message: &str) -> Result<LogEntry, QueueError> {
        let mut tx = self.pool.begin().await?;
        let locked: Option<(Uuid,)> = sqlx::query_as(sql::LOCK_ORDER)
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
        if locked.is_none() {
            drop(tx);
            return Err(match self.get_log_entry_opt(id, false).await? {
                Some(entry) => QueueError::conflict(
                    ConflictCode::AlreadyFinished,
                    format!(
                        "work order {id} already finished ({})",
                        entry.outcome.as_str()
                    ),
                ),
                None => QueueError::NotFound {
                    what: "work order",
                    id: id.to_string(),
                },
            });
        }
        let claim: Option<(Uuid, Uuid, DateTime<Utc>)> = sqlx::query_as(sql::CANCEL_CLAIM)
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
        let claim = claim.map(|(agent_id, claim_id, claimed_at)| FinalClaim {
            agent_id,
            claim_id,
            claimed_at,
        });
        let entry = finish(
            &mut tx,
            id,
            EndedBy::Cancel,
            Outcome::Cancelled,
            Some(message),
            None,
            claim,
        )
        .await?;
        tx.commit().await?;
        Ok(entry)
    }

    /// Finished orders, newest first, without `yaml_content` (docs/design.md §5).
    pub async fn list_log(&self, f: &LogFilter) -> Result<Page<LogEntry>, QueueError> {
        let after = f.cursor.as_deref().map(cursor::decode).transpose()?;
        let mut tx = cursor::page_transaction(&self.pool).await?;
        let rows: Vec<LogRow> = sqlx::query_as(sql::LIST_LOG)
            .bind(f.work_type.map(WorkType::as_str))
            .bind(f.success)
            .bind(f.agent_id)
            .bind(after.map(|a| a.0))
            .bind(after.map(|a| a.1))
            .bind(f.limit)
            .bind(f.outcome.map(Outcome::as_str))
            .bind(f.label.as_deref().map(text::without_nul))
            .bind(f.since)
            .bind(f.id_prefix.map(|p| p.low))
            .bind(f.id_prefix.map(|p| p.high))
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        let items: Vec<LogEntry> = rows.into_iter().map(Into::into).collect();
        Ok(cursor::page(items, f.limit, |e| (e.completed_at, e.id)))
    }

    /// One finished order with its `yaml_content`; `404` when not in the log.
    pub async fn get_log_entry(&self, id: Uuid) -> Result<LogEntry, QueueError> {
        self.get_log_entry_opt(id, true)
            .await?
            .ok_or_else(|| QueueError::NotFound {
                what: "work order log entry",
                id: id.to_string(),
            })
    }

    pub(crate) async fn get_log_entry_opt(
        &self,
        id: Uuid,
        with_yaml: bool,
    ) -> Result<Option<LogEntry>, QueueError> {
        let statement = if with_yaml {
            sql::GET_LOG_ENTRY
        } else {
            sql::GET_LOG_ENTRY_SUMMARY
        };
        let row: Option<LogRow> = sqlx::query_as(statement)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(Into::into))
    }
}

/// Moves an active order to the log in the caller's transaction (docs/design.md §2). Any live claim row
/// goes with it, in the same statement (`sql/finish_order.sql`). `last_error` overrides the
/// order's when the order fails now.
/// The caller must hold the order's row lock.
pub(crate) async fn finish(
    tx: &mut Transaction<'_, Postgres>,
    id: Uuid,
    ended_by: EndedBy,
    outcome: Outcome,
    message: Option<&str>,
    last_error: Option<&str>,
    claim: Option<FinalClaim>,
) -> Result<LogEntry, QueueError> {
    let row: LogRow = sqlx::query_as(sql::FINISH_ORDER)
        .bind(id)
        .bind(outcome.as_str())
        .bind(message)
        .bind(last_error)
        .bind(claim.as_ref().map(|c| c.agent_id))
        .bind(claim.as_ref().map(|c| c.claim_id))
        .bind(claim.as_ref().map(|c| c.claimed_at))
        .bind(ended_by.as_str())
        .fetch_one(&mut **tx)
        .await?;
    Ok(row.into())
}

/// How long an `Idempotency-Key` is remembered after its order was created (docs/design.md §5). A
/// client retrying a lost answer does so within seconds; a day covers a long outage.
pub const IDEMPOTENCY_KEY_RETENTION: std::time::Duration =
    std::time::Duration::from_secs(24 * 3600);

/// A client's `Idempotency-Key` for a create, with a fingerprint of its request so that reusing a
/// key for a different order is refused rather than answered with the wrong order.
#[derive(Debug, Clone)]
pub struct IdempotencyKey {
    /// 1–255 visible ASCII characters (checked by the API).
    pub key: String,
    /// SHA-256 of the request body as parsed (so whitespace and key order do not matter).
    pub request_sha256: [u8; 32],
}

/// A created work order, and whether it is the recorded answer of an earlier call.
#[derive(Debug, Clone)]
pub struct Created {
    pub order: WorkOrder,
    pub replayed: bool,
}

/// [`insert_order`] of an API order under an id just drawn at random: an id that collided would
/// be an `ON CONFLICT` no-op, reported as an error rather than a panic.
async fn insert_fresh(
    exec: impl sqlx::PgExecutor<'_>,
    id: Uuid,
    spec: &WorkOrderSpec,
    rerun_of: Option<Uuid>,
) -> Result<WorkOrder, QueueError> {
    insert_order(exec, id, spec, SOURCE_API, rerun_of)
        .await?
        .map(Into::into)
        .ok_or(QueueError::Database(sqlx::Error::RowNotFound))
}

/// Inserts a new `PENDING` order and returns it as written (no claim). Nothing is inserted, and
/// `None` returned, when the id is active already or finished (in the log).
/// `sql/insert_order.sql`.
pub(super) async fn insert_order(
    exec: impl sqlx::PgExecutor<'_>,
    id: Uuid,
    spec: &WorkOrderSpec,
    source: &str,
    rerun_of: Option<Uuid>,
) -> Result<Option<OrderRow>, QueueError> {
    let pairs = super::eligibility::annotation_pairs(&spec.targeting.annotations);
    Ok(sqlx::query_as(sql::INSERT_ORDER)
        .bind(id)
        .bind(spec.work_type.as_str())
        .bind(&spec.yaml_content)
        .bind(spec.max_retries)
        .bind(spec.backoff_seconds)
        .bind(spec.claim_timeout_seconds)
        .bind(spec.max_reclaims)
        .bind(&spec.tenant)
        .bind(&spec.targeting.agent_ids)
        .bind(&spec.targeting.agent_names)
        .bind(&spec.targeting.labels)
        .bind(sqlx::types::Json(&spec.targeting.annotations))
        .bind(&pairs)
        .bind(source)
        .bind(rerun_of)
        .bind(spec.priority)
        .bind(spec.concurrency.as_ref().map(|c| &c.key))
        .bind(spec.concurrency.as_ref().map(|c| c.max))
        .bind(spec.concurrency.as_ref().map(|c| c.on_conflict.as_str()))
        .bind(spec.retry_on_disruption.as_str())
        .fetch_optional(exec)
        .await?)
}

/// Whether creating an order of `spec` cancels the waiting orders of its key.
fn supersedes(spec: &WorkOrderSpec) -> bool {
    spec.concurrency
        .as_ref()
        .is_some_and(|c| c.on_conflict == OnConflict::Supersede)
}

/// With `on_conflict: supersede`, cancels the waiting orders of the key of `id`, just created in
/// `tx` (docs/design.md §3 "Concurrency keys"; `sql/supersede.sql`); claimed ones go on.
async fn supersede(
    tx: &mut Transaction<'_, Postgres>,
    id: Uuid,
    spec: &WorkOrderSpec,
) -> Result<(), QueueError> {
    if !supersedes(spec) {
        return Ok(());
    }
    let gone: Vec<LogRow> = sqlx::query_as(sql::SUPERSEDE)
        .bind(id)
        .fetch_all(&mut **tx)
        .await?;
    if !gone.is_empty() {
        let ids: Vec<Uuid> = gone.into_iter().map(|r| LogEntry::from(r).id).collect();
        tracing::info!(order = %id, superseded = ?ids, "cancelled the waiting orders of its concurrency key");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_become_ranges() {
        let p = IdPrefix::parse("0A1b-").unwrap();
        assert_eq!(p.low.to_string(), "0a1b0000-0000-0000-0000-000000000000");
        assert_eq!(p.high.to_string(), "0a1bffff-ffff-ffff-ffff-ffffffffffff");
        let whole = "6f1c2a90-1b2c-4d3e-8f00-0123456789ab";
        let p = IdPrefix::parse(whole).unwrap();
        assert_eq!(
            (p.low.to_string(), p.high.to_string()),
            (whole.into(), whole.into())
        );
        for bad in ["", "-", "xyz", "0123456789abcdef0123456789abcdef0"] {
            assert!(IdPrefix::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
