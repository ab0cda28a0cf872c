//! Creating, reading, listing and cancelling work orders, and the move to the log (DESIGN.md §2, §5).

use chrono::{DateTime, Utc};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use super::history::IdPrefix;
use super::validate::WorkOrderSpec;
use super::{
    ConflictCode, LogEntry, LogRow, Lookup, OrderRow, OrderStatus, Outcome, Page, Queue,
    QueueError, SOURCE_API, WorkOrder, WorkType, cursor, log_columns, order_columns, rules,
};

/// Filters of `GET /api/v1/work-orders`.
#[derive(Debug, Clone, Default)]
pub struct OrderFilter {
    pub status: Option<OrderStatus>,
    pub work_type: Option<WorkType>,
    /// Orders targeting this label.
    pub label: Option<String>,
    /// Orders this agent holds a claim on now.
    pub agent_id: Option<Uuid>,
    /// Orders created at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Orders whose id starts with this prefix.
    pub id_prefix: Option<IdPrefix>,
    /// 1–1000.
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
    /// 1–1000.
    pub limit: i64,
    pub cursor: Option<String>,
}

/// Who ended an order; recorded so a late heartbeat can be told `cancelled` or `reclaimed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndedBy {
    Agent,
    Reaper,
    Cancel,
}

impl EndedBy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EndedBy::Agent => "agent",
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

impl Queue {
    /// Creates the work order of id `id` (a WorkOrder resource's uid, DESIGN.md §6) and returns
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
        let (finished,): (bool,) =
            sqlx::query_as("SELECT EXISTS (SELECT 1 FROM work_order_log WHERE id = $1)")
                .bind(id)
                .fetch_one(&mut *tx)
                .await?;
        if finished {
            drop(tx);
            return self.lookup(id, true).await;
        }
        tx.commit().await?;
        Ok(Lookup::Active(Box::new(row.into())))
    }

    /// Creates a work order with a fresh random id (DESIGN.md §5 `POST /work-orders` without
    /// `Idempotency-Key`): one statement, one commit, answered with the row as inserted, so the
    /// answer is `PENDING` whatever an agent does with it a moment later.
    pub async fn create_new_work_order(
        &self,
        spec: &WorkOrderSpec,
        source: &str,
    ) -> Result<WorkOrder, QueueError> {
        // A random id that collided would be an `ON CONFLICT` no-op: say so rather than panic.
        insert_order(&self.pool, Uuid::new_v4(), spec, source, None)
            .await?
            .map(Into::into)
            .ok_or(QueueError::Database(sqlx::Error::RowNotFound))
    }

    /// Creates a work order under an `Idempotency-Key` (DESIGN.md §5 "Retry safety"): the first
    /// call creates it and records the answer under the key; a repeat with the same key and the
    /// same request gets that recorded answer again (`replayed`), however the order has fared
    /// since. The same key with a different request is `IdempotencyKeyReused`. Concurrent calls
    /// with one key create one order: the second waits on the first's key row. Keys are kept
    /// for [`IDEMPOTENCY_KEY_RETENTION`].
    pub async fn create_work_order_once(
        &self,
        spec: &WorkOrderSpec,
        key: &IdempotencyKey,
    ) -> Result<Created, QueueError> {
        self.create_once(spec, key, None).await
    }

    /// [`Queue::create_work_order_once`], recording the order as a re-run of `rerun_of`.
    pub(super) async fn create_once(
        &self,
        spec: &WorkOrderSpec,
        key: &IdempotencyKey,
        rerun_of: Option<Uuid>,
    ) -> Result<Created, QueueError> {
        let mut tx = self.pool.begin().await?;
        let id = Uuid::new_v4();
        let fresh: Option<(Uuid,)> = sqlx::query_as(
            "INSERT INTO idempotency_keys (key, request_sha256, work_order_id) \
             VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING RETURNING work_order_id",
        )
        .bind(&key.key)
        .bind(&key.request_sha256[..])
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        if fresh.is_none() {
            drop(tx);
            return self.replay_creation(key).await;
        }
        let order: WorkOrder = insert_order(&mut *tx, id, spec, SOURCE_API, rerun_of)
            .await?
            .ok_or(QueueError::Database(sqlx::Error::RowNotFound))?
            .into();
        sqlx::query("UPDATE idempotency_keys SET response = $2 WHERE key = $1")
            .bind(&key.key)
            .bind(sqlx::types::Json(&order))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Created {
            order,
            replayed: false,
        })
    }

    async fn replay_creation(&self, key: &IdempotencyKey) -> Result<Created, QueueError> {
        let recorded: Option<(Vec<u8>, Option<sqlx::types::Json<WorkOrder>>)> =
            sqlx::query_as("SELECT request_sha256, response FROM idempotency_keys WHERE key = $1")
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

    /// Finds an order by id, active or finished (DESIGN.md §5 `GET /work-orders/{id}`).
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
        match self.lookup(id, true).await? {
            Lookup::Active(order) => Ok(*order),
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

    pub(crate) async fn get_active(
        &self,
        id: Uuid,
        with_yaml: bool,
    ) -> Result<Option<WorkOrder>, QueueError> {
        let sql = format!(
            "SELECT {} FROM work_orders w LEFT JOIN work_order_claims c ON c.work_order_id = w.id \
             WHERE w.id = $1",
            order_columns(with_yaml)
        );
        let row: Option<OrderRow> = sqlx::query_as(&sql)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(Into::into))
    }

    /// Active orders, oldest first, without `yaml_content` (DESIGN.md §5).
    pub async fn list_work_orders(&self, f: &OrderFilter) -> Result<Page<WorkOrder>, QueueError> {
        let after = f.cursor.as_deref().map(cursor::decode).transpose()?;
        let sql = format!(
            "SELECT {} FROM work_orders w LEFT JOIN work_order_claims c ON c.work_order_id = w.id \
             WHERE ($1::text IS NULL OR w.status = $1) AND ($2::text IS NULL OR w.work_type = $2) \
               AND ($3::timestamptz IS NULL OR (w.created_at, w.id) > ($3, $4)) \
               AND ($6::text IS NULL OR $6 = ANY (w.target_labels)) \
               AND ($7::uuid IS NULL OR c.agent_id = $7) \
               AND ($8::timestamptz IS NULL OR w.created_at >= $8) \
               AND ($9::uuid IS NULL OR w.id BETWEEN $9 AND $10) \
             ORDER BY w.created_at, w.id LIMIT $5",
            order_columns(false)
        );
        let rows: Vec<OrderRow> = sqlx::query_as(&sql)
            .bind(f.status.map(OrderStatus::as_str))
            .bind(f.work_type.map(WorkType::as_str))
            .bind(after.map(|a| a.0))
            .bind(after.map(|a| a.1))
            .bind(f.limit)
            .bind(&f.label)
            .bind(f.agent_id)
            .bind(f.since)
            .bind(f.id_prefix.map(|p| p.low))
            .bind(f.id_prefix.map(|p| p.high))
            .fetch_all(&self.pool)
            .await?;
        let items: Vec<WorkOrder> = rows.into_iter().map(Into::into).collect();
        let next_cursor = (items.len() as i64 == f.limit)
            .then(|| items.last().map(|o| cursor::encode(o.created_at, o.id)))
            .flatten();
        Ok(Page { items, next_cursor })
    }

    /// Cancels an active order (DESIGN.md §2): it moves to the log as `cancelled`, claimed or not;
    /// the holder learns it at its next heartbeat or complete. `message` says who cancelled.
    pub async fn cancel_work_order(&self, id: Uuid, message: &str) -> Result<LogEntry, QueueError> {
        let mut tx = self.pool.begin().await?;
        let locked: Option<(Uuid,)> =
            sqlx::query_as("SELECT id FROM work_orders WHERE id = $1 FOR UPDATE")
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
        let claim: Option<(Uuid, Uuid, DateTime<Utc>)> = sqlx::query_as(
            "DELETE FROM work_order_claims WHERE work_order_id = $1 \
             RETURNING agent_id, claim_id, claimed_at",
        )
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

    /// Finished orders, newest first, without `yaml_content` (DESIGN.md §5).
    pub async fn list_log(&self, f: &LogFilter) -> Result<Page<LogEntry>, QueueError> {
        let after = f.cursor.as_deref().map(cursor::decode).transpose()?;
        let sql = format!(
            "SELECT {} FROM work_order_log \
             WHERE ($1::text IS NULL OR work_type = $1) \
               AND ($2::bool IS NULL OR (outcome = 'succeeded') = $2) \
               AND ($3::uuid IS NULL OR claimed_by = $3) \
               AND ($4::timestamptz IS NULL OR (completed_at, id) < ($4, $5)) \
               AND ($7::text IS NULL OR outcome = $7) \
               AND ($8::text IS NULL OR targeting -> 'labels' ? $8) \
               AND ($9::timestamptz IS NULL OR completed_at >= $9) \
               AND ($10::uuid IS NULL OR id BETWEEN $10 AND $11) \
             ORDER BY completed_at DESC, id DESC LIMIT $6",
            log_columns(false)
        );
        let rows: Vec<LogRow> = sqlx::query_as(&sql)
            .bind(f.work_type.map(WorkType::as_str))
            .bind(f.success)
            .bind(f.agent_id)
            .bind(after.map(|a| a.0))
            .bind(after.map(|a| a.1))
            .bind(f.limit)
            .bind(f.outcome.map(Outcome::as_str))
            .bind(&f.label)
            .bind(f.since)
            .bind(f.id_prefix.map(|p| p.low))
            .bind(f.id_prefix.map(|p| p.high))
            .fetch_all(&self.pool)
            .await?;
        let items: Vec<LogEntry> = rows.into_iter().map(Into::into).collect();
        let next_cursor = (items.len() as i64 == f.limit)
            .then(|| items.last().map(|e| cursor::encode(e.completed_at, e.id)))
            .flatten();
        Ok(Page { items, next_cursor })
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
        let sql = format!(
            "SELECT {} FROM work_order_log WHERE id = $1",
            log_columns(with_yaml)
        );
        let row: Option<LogRow> = sqlx::query_as(&sql)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(Into::into))
    }
}

/// SQL expressions for the columns of a log entry that do not come from the order row itself.
pub(crate) struct LogValues<'a> {
    pub outcome: &'a str,
    pub message: &'a str,
    /// Overrides the order's `last_error` when not NULL (and then stamps `last_error_at`).
    pub last_error: &'a str,
    pub claimed_by: &'a str,
    pub claim_id: &'a str,
    pub claimed_at: &'a str,
    pub ended_by: &'a str,
}

/// `INSERT INTO work_order_log … SELECT … FROM {from} RETURNING …`, where `{from}` includes a
/// relation `w` with the deleted order's columns (DESIGN.md §2: a finished order moves to the
/// log). One place for the mapping, shared by every way an order finishes.
pub(crate) fn log_insert(from: &str, v: &LogValues<'_>) -> String {
    format!(
        "INSERT INTO work_order_log (id, work_type, yaml_content, max_retries, backoff_seconds, \
           claim_timeout_seconds, max_reclaims, tenant, targeting, outcome, message, retry_count, \
           reclaim_count, last_error, last_error_at, claimed_by, claim_id, claimed_at, source, \
           ended_by, rerun_of, created_at, completed_at) \
         SELECT w.id, w.work_type, w.yaml_content, w.max_retries, w.backoff_seconds, \
           w.claim_timeout_seconds, w.max_reclaims, w.tenant, \
           jsonb_build_object('agent_ids', to_jsonb(w.target_agent_ids), \
             'agent_names', to_jsonb(w.target_agent_names), 'labels', to_jsonb(w.target_labels), \
             'annotations', w.target_annotations), \
           {outcome}, {message}, w.retry_count, w.reclaim_count, COALESCE({last_error}, w.last_error), \
           CASE WHEN {last_error}::text IS NULL THEN w.last_error_at ELSE now() END, \
           {claimed_by}, {claim_id}, {claimed_at}, w.source, {ended_by}, w.rerun_of, w.created_at, \
           now() \
         FROM {from} RETURNING {columns}",
        outcome = v.outcome,
        message = v.message,
        last_error = v.last_error,
        claimed_by = v.claimed_by,
        claim_id = v.claim_id,
        claimed_at = v.claimed_at,
        ended_by = v.ended_by,
        columns = log_columns(false),
    )
}

/// Moves an active order to the log in the caller's transaction (DESIGN.md §2). Any live claim row
/// goes with it (cascade). `last_error` overrides the order's when the order fails now.
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
    let sql = format!(
        "WITH w AS (DELETE FROM work_orders WHERE id = $1 RETURNING *) {}",
        log_insert(
            "w",
            &LogValues {
                outcome: "$2",
                message: "$3",
                last_error: "$4",
                claimed_by: "COALESCE($5, w.last_claimed_by)",
                claim_id: "COALESCE($6, w.last_claim_id)",
                claimed_at: "$7",
                ended_by: "$8",
            }
        )
    );
    let row: LogRow = sqlx::query_as(&sql)
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

/// How long an `Idempotency-Key` is remembered after its order was created (DESIGN.md §5). A
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

/// Inserts a new `PENDING` order and returns it as written (no claim). Nothing is inserted, and
/// `None` returned, when the id is active already or finished (in the log).
/// $1 id, $2 work type, $3 YAML, $4–$7 retry and timeout settings, $8 tenant, $9–$13 targeting,
/// $14 source, $15 the order re-run (or NULL).
pub(super) async fn insert_order(
    exec: impl sqlx::PgExecutor<'_>,
    id: Uuid,
    spec: &WorkOrderSpec,
    source: &str,
    rerun_of: Option<Uuid>,
) -> Result<Option<OrderRow>, QueueError> {
    static INSERT_ORDER: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "WITH w AS (INSERT INTO work_orders (id, work_type, yaml_content, max_retries, \
               backoff_seconds, claim_timeout_seconds, max_reclaims, tenant, target_agent_ids, \
               target_agent_names, target_labels, target_annotations, target_annotation_pairs, \
               status, source, rerun_of) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, 'PENDING', $14, $15 \
             WHERE NOT EXISTS (SELECT 1 FROM work_order_log WHERE id = $1) \
             ON CONFLICT (id) DO NOTHING RETURNING *) \
             SELECT {} FROM w LEFT JOIN work_order_claims c ON false",
            order_columns(true)
        )
    });
    let pairs = rules::annotation_pairs(&spec.targeting.annotations);
    Ok(sqlx::query_as(&INSERT_ORDER)
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
        .fetch_optional(exec)
        .await?)
}
