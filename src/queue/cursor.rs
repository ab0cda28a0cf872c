//! Keyset-pagination cursors: opaque to clients, `base64url("<micros>_<uuid>")` inside.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::model::Page;

/// A cursor this server did not issue.
#[derive(Debug, thiserror::Error)]
#[error("cursor is not valid (pass back next_cursor from a previous page unchanged)")]
pub struct CursorError;

/// Position after the last row of a page: its sort timestamp and id.
pub(crate) fn encode(at: DateTime<Utc>, id: Uuid) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}_{}", at.timestamp_micros(), id.simple()))
}

pub(crate) fn decode(cursor: &str) -> Result<(DateTime<Utc>, Uuid), CursorError> {
    let raw = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| CursorError)?;
    let raw = String::from_utf8(raw).map_err(|_| CursorError)?;
    let (micros, id) = raw.split_once('_').ok_or(CursorError)?;
    let micros: i64 = micros.parse().map_err(|_| CursorError)?;
    let at = DateTime::from_timestamp_micros(micros).ok_or(CursorError)?;
    let id = Uuid::parse_str(id).map_err(|_| CursorError)?;
    Ok((at, id))
}

/// The page of `items` a keyset query returned with `LIMIT limit` (docs/design.md §5: lists are
/// keyset-paginated): a full page carries the cursor after its last item, whose sort timestamp
/// and id `key` gives; a shorter one is the last page.
pub(crate) fn page<T>(
    items: Vec<T>,
    limit: i64,
    key: impl Fn(&T) -> (DateTime<Utc>, Uuid),
) -> Page<T> {
    let next_cursor = (items.len() as i64 == limit)
        .then(|| {
            items.last().map(|item| {
                let (at, id) = key(item);
                encode(at, id)
            })
        })
        .flatten();
    Page { items, next_cursor }
}

/// A transaction for one list page (it only reads), planned for its arguments
/// (`plan_cache_mode = force_custom_plan` for this transaction only).
///
/// Every pooled connection plans generically (`serve::pool_options`: claim-next was planned anew
/// at every execution). A list statement's optional filters (`$n IS NULL OR …`) cannot be folded
/// in a generic plan, so its cursor was a filter over every row, not a bound on its index: one
/// page of 50 of 200,000 active orders read them all (67 ms, a parallel sequential scan and a
/// sort). Planned with its arguments, the page walks `work_orders_listing` from the cursor and
/// stops after the page. Costs three round trips (`BEGIN`, `SET LOCAL`, `COMMIT`) and a plan per
/// page. `queue::claims::plan` holds the pages of orders, of the log and of an agent's pending
/// orders to it (the agents' list is small and not tested).
///
/// Errors: the database's, as [`sqlx::Error`].
pub(crate) async fn page_transaction(
    pool: &sqlx::PgPool,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET LOCAL plan_cache_mode = force_custom_plan")
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_garbage() {
        let at = DateTime::from_timestamp_micros(1_700_000_000_123_456).unwrap();
        let id = Uuid::new_v4();
        assert_eq!(decode(&encode(at, id)).unwrap(), (at, id));
        assert!(decode("not-a-cursor").is_err());
        assert!(decode("").is_err());
    }
}
