//! Concurrency keys (docs/design.md §3 "Concurrency keys", issue #40): an order may carry
//! `concurrency {key, max, on_conflict}`, and at most `max` orders of one key (per tenant) hold a
//! claim at once, whichever agents hold them.
//!
//! The slot is the claim row (`work_order_claims`): the migration's trigger admits a claim's
//! insert only while the key has a free slot and takes it; the trigger on the row's delete frees
//! it. Every way a claim ends deletes that row in the transaction that ends it, so a slot is
//! freed once, and a stale holder, whose row is gone, frees nothing. The walks pass over full
//! keys (`sql/key_full.sql`); `queue::claims` tries again when another claim took a slot after
//! its walk chose (`contended`). Here: the wire shapes (`shapes`, which import nothing of the
//! queue, so `queue::model` can use them), their validation, the holders an explanation names and
//! the maintenance of slot rows; `supersede` runs where orders are created (`queue::orders`).

use uuid::Uuid;

pub(super) mod shapes;

pub use shapes::{Concurrency, NewConcurrency, OnConflict};

use super::limits::{CONCURRENCY_MAX, MAX_CONCURRENCY_KEY_CHARS};
use super::text::strip_nul;
use super::{Queue, QueueError, sql};

/// Checks a create body's `concurrency`; `400 invalid_field` naming `concurrency.key` or
/// `concurrency.max`. U+0000 counts toward the length, then is dropped, as for every text.
pub fn validate(new: NewConcurrency) -> Result<Concurrency, QueueError> {
    let NewConcurrency {
        mut key,
        max,
        on_conflict,
    } = new;
    let invalid = |message: String| QueueError::Invalid {
        field: "concurrency.key".into(),
        message,
    };
    if key.chars().count() > MAX_CONCURRENCY_KEY_CHARS {
        return Err(invalid(format!(
            "concurrency.key is longer than {MAX_CONCURRENCY_KEY_CHARS} characters"
        )));
    }
    strip_nul(&mut key);
    if key.is_empty() {
        return Err(invalid("concurrency.key must not be empty".into()));
    }
    Ok(Concurrency {
        key,
        max: CONCURRENCY_MAX.check_or_default(max)?,
        on_conflict: on_conflict.unwrap_or_default(),
    })
}

/// How many claims hold the slots of the key whose digest is `slot`, and the first `limit`
/// orders they hold, oldest claim first (`sql/key_holders.sql`).
pub(super) async fn holders(
    exec: impl sqlx::PgExecutor<'_>,
    slot: Uuid,
    limit: i64,
) -> Result<(i64, Vec<Uuid>), QueueError> {
    Ok(sqlx::query_as(sql::KEY_HOLDERS)
        .bind(slot)
        .bind(limit)
        .fetch_one(exec)
        .await?)
}

impl Queue {
    /// Deletes the slot rows of keys that hold no claim and have no waiting order
    /// (`sql/drop_idle_slots.sql`); how many. Queue maintenance calls it once a minute. Nothing
    /// waits on it: a key's row is only ever needed by its claims, which make it again if
    /// missing.
    pub async fn drop_idle_slots(&self) -> Result<u64, QueueError> {
        Ok(sqlx::query(sql::DROP_IDLE_SLOTS)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_checked_and_defaults_fill_in() {
        let c = validate(NewConcurrency {
            key: "deploy-prod".into(),
            max: None,
            on_conflict: None,
        })
        .unwrap();
        assert_eq!((c.max, c.on_conflict), (1, OnConflict::Queue));
        for (key, max, field) in [
            ("", None, "concurrency.key"),
            ("\0", None, "concurrency.key"),
            (
                &"k".repeat(MAX_CONCURRENCY_KEY_CHARS + 1),
                None,
                "concurrency.key",
            ),
            ("k", Some(0), "concurrency.max"),
            ("k", Some(CONCURRENCY_MAX.max + 1), "concurrency.max"),
        ] {
            let err = validate(NewConcurrency {
                key: key.to_string(),
                max,
                on_conflict: None,
            })
            .unwrap_err();
            assert!(
                matches!(&err, QueueError::Invalid { field: f, .. } if f == field),
                "{key:?} {max:?}: {err:?}"
            );
        }
    }

    #[test]
    fn on_conflict_reads_both_spellings() {
        for body in [
            r#"{"key":"k","on_conflict":"supersede"}"#,
            r#"{"key":"k","onConflict":"supersede"}"#,
        ] {
            let c: NewConcurrency = serde_json::from_str(body).unwrap();
            assert_eq!(c.on_conflict, Some(OnConflict::Supersede), "{body}");
        }
        assert!(
            serde_json::from_str::<NewConcurrency>(r#"{"key":"k","on_conflict":"x"}"#).is_err()
        );
    }
}
