//! Every bound and default of a work order's and an agent's numbers and texts, in one place
//! (docs/design.md §5, issue #26).
//!
//! Each number here is read by everything that states it: validation ([`super::validate`]), the
//! OpenAPI document (`api::ops` sets `minimum`, `maximum` and `default` from these), the CRD
//! schema (`crd`, through schemars' `range` and serde's defaults) and the clap flags of the
//! worker and the executor (`range` and `default_value_t`). Help texts and doc comments are prose
//! that cannot be computed; `tests/integration/limits.rs` reads `crds/`, the served OpenAPI
//! document and `--help` and fails when any of them states another number than this file.

use super::QueueError;

/// An integer field's accepted range, both ends included, and the value used when the field is
/// absent (`None`: absent means "not set", e.g. no lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// The field's name in the REST API (snake_case); the CRD spells it in camelCase.
    pub field: &'static str,
    pub min: i64,
    pub max: i64,
    pub default: Option<i64>,
}

impl Range {
    /// `value` when it is within the range, else `400 invalid_field` naming the field and both
    /// ends (docs/design.md §5).
    ///
    /// Every range here fits in `i32` (the column type); a test holds that.
    pub fn check(&self, value: i64) -> Result<i32, QueueError> {
        if (self.min..=self.max).contains(&value) {
            Ok(value as i32)
        } else {
            Err(QueueError::Invalid {
                field: self.field.to_string(),
                message: format!(
                    "{} must be between {} and {}, got {value}",
                    self.field, self.min, self.max
                ),
            })
        }
    }

    /// [`Self::check`] for a field that may be absent: absent stays absent.
    pub fn check_optional(&self, value: Option<i64>) -> Result<Option<i32>, QueueError> {
        value.map(|v| self.check(v)).transpose()
    }

    /// [`Self::check`] for a field with a default: absent becomes the default.
    ///
    /// # Panics
    /// When the range has no default (a programming error, caught by the tests of every caller).
    pub fn check_or_default(&self, value: Option<i64>) -> Result<i32, QueueError> {
        let default = self
            .default
            .unwrap_or_else(|| panic!("{} has no default", self.field));
        self.check(value.unwrap_or(default))
    }

    /// The default as the CRD's serde default functions need it.
    ///
    /// # Panics
    /// When the range has no default.
    pub const fn default_i32(&self) -> i32 {
        match self.default {
            Some(d) => d as i32,
            None => panic!("range has no default"),
        }
    }
}

/// Retries after a failed attempt (0 means one attempt).
pub const MAX_RETRIES: Range = Range {
    field: "max_retries",
    min: 0,
    max: 100,
    default: Some(3),
};

/// Base of the exponential backoff between attempts, in seconds (docs/design.md §4).
pub const BACKOFF_SECONDS: Range = Range {
    field: "backoff_seconds",
    min: 1,
    max: 86_400,
    default: Some(60),
};

/// Seconds a claim may last from `claimed_at` before the reaper reclaims it.
pub const CLAIM_TIMEOUT_SECONDS: Range = Range {
    field: "claim_timeout_seconds",
    min: 60,
    max: 604_800,
    default: Some(3600),
};

/// Reclaims of an expired claim before the order fails.
pub const MAX_RECLAIMS: Range = Range {
    field: "max_reclaims",
    min: 0,
    max: 100,
    default: Some(5),
};

/// An order's priority (docs/design.md §3): among one tenant's orders an agent may take, the
/// higher goes first; then the older.
pub const PRIORITY: Range = Range {
    field: "priority",
    min: -1000,
    max: 1000,
    default: Some(0),
};

/// An order's concurrency key's `max` (docs/design.md §3 "Concurrency keys"): most orders of the
/// key holding a claim at once. The API names it `concurrency.max`.
pub const CONCURRENCY_MAX: Range = Range {
    field: "concurrency.max",
    min: 1,
    max: 100_000,
    default: Some(1),
};

/// A lease, in seconds: on a claim, on an agent's registration and on an Executor. Absent means
/// no lease (the claim timeout alone governs).
pub const LEASE_SECONDS: Range = Range {
    field: "lease_seconds",
    min: 5,
    max: 86_400,
    default: None,
};

/// Most claims an agent holds at once. Absent means unlimited.
pub const MAX_CONCURRENCY: Range = Range {
    field: "max_concurrency",
    min: 1,
    max: 100_000,
    default: None,
};

/// Most orders one claim-next may hand out (`max_orders`, multi-claim). Absent means one order,
/// answered as the order itself rather than a list.
pub const MAX_ORDERS: Range = Range {
    field: "max_orders",
    min: 1,
    max: 100,
    default: None,
};

/// Most results one batch complete carries (`POST /agents/{agent_id}/complete`, `completes`):
/// as many as one multi-claim hands out ([`MAX_ORDERS`]), so an agent can report every order
/// of a claim together. More, or none, is `400 invalid_field` naming `completes`.
pub const MAX_COMPLETES: usize = MAX_ORDERS.max as usize;

/// `limit` of the list routes (`GET /work-orders`, `/work-order-log`, `/agents`,
/// `/agents/{id}/pending`): items in one page, 1–1000, default 100 (docs/design.md §5 "Lists").
/// A query parameter, so not in [`RANGES`]: `api::ops` states it on each list route and
/// `api::error::page_limit` answers `400 invalid_query` outside it. The admin CLI fetches pages of
/// at most `max` items (`--chunk-size`), and the controller reads agents in pages of `max`.
pub const PAGE_LIMIT: Range = Range {
    field: "limit",
    min: 1,
    max: 1000,
    default: Some(100),
};

/// Longest claim-next long-poll, in seconds (docs/design.md §5: `max_wait_seconds` ≥ 0, capped
/// at 30). A larger `max_wait_seconds` is not refused but waits this long; `pullman worker` and
/// `pullman executor` ask for this much on each claim.
pub const MAX_WAIT_SECONDS: u32 = 30;

/// Most values of each parameter of a `GET /backlog` profile query (`label`, `annotation`,
/// `work_type`; docs/design.md §10), `400 invalid_query` past it. Tighter than a registration's
/// [`MAX_LIST_ENTRIES`]: the whole profile travels in a URL, which the HTTP server refuses past
/// its buffer (`414`/`431`) long before a registration's 256 × 4096 characters.
pub const PROFILE_MAX_VALUES: usize = 32;
/// Longest `label`, `annotation` (`KEY=VALUE`) or `tenant` of a `GET /backlog` profile query, in
/// characters; see [`PROFILE_MAX_VALUES`] for why it is tighter than [`MAX_STRING_CHARS`].
pub const PROFILE_MAX_CHARS: usize = 253;

/// Most successful completes one group commit runs in one statement (`serve --complete-batch`,
/// `queue::group_commit`); 1 turns batching off.
pub const COMPLETE_BATCH_MAX: u64 = 1000;
/// `serve --complete-batch` unless told: enough to cover every agent of a busy server in one
/// commit, small enough that one statement stays a few milliseconds.
pub const COMPLETE_BATCH_DEFAULT: u64 = 64;
/// Most one-order claims one group claim serves in one statement (`serve --claim-batch`,
/// `queue::claims::group`); 1 turns group claims off.
pub const CLAIM_BATCH_MAX: u64 = 256;
/// `serve --claim-batch` unless told: one statement for up to 32 agents. A claim of 16 orders
/// took 1.4 ms of PostgreSQL (bench/README.md, "where (2), (2d) and 9a spend their time"), so a
/// full batch stays within a few milliseconds.
pub const CLAIM_BATCH_DEFAULT: u64 = 32;

// Output of running orders (docs/design.md §9). `tests/integration/limits.rs` holds these
// against the served OpenAPI document, the server's answers and `--help`.

/// Longest output line an agent sends as one, bytes; longer lines go in pieces of this size
/// (`pull::lines`), the same for the worker and the executor.
pub const MAX_OUTPUT_LINE_BYTES: usize = 64 * 1024;
/// Largest `POST …/output` body, bytes as sent (`413` above).
pub const MAX_OUTPUT_CHUNK_BYTES: usize = 1024 * 1024;
/// Default of `serve --output-cap-bytes`: output kept per order, bytes as counted against the cap.
pub const OUTPUT_CAP_BYTES_DEFAULT: u64 = 16 * 1024 * 1024;
/// Least `serve --output-cap-bytes` accepts: one chunk.
pub const OUTPUT_CAP_BYTES_MIN: u64 = MAX_OUTPUT_CHUNK_BYTES as u64;
/// Default of `serve --max-output-writes`: output chunks stored at once per replica.
pub const MAX_OUTPUT_WRITES_DEFAULT: u64 = 8;
/// Most lines `GET …/output?limit=` gives in one page.
pub const MAX_OUTPUT_PAGE_LINES: i64 = 10_000;
/// Lines of a page when `limit` is not given.
pub const OUTPUT_PAGE_LINES_DEFAULT: i64 = 1_000;
/// Most lines `GET …/output?tail=` (and `work-orders logs --tail`) asks for.
pub const MAX_OUTPUT_TAIL: i64 = 10_000;
/// Default of `serve --max-output-followers`: open `follow=true` output streams per replica.
pub const MAX_FOLLOWERS_DEFAULT: u64 = 1000;
/// Most `serve --max-output-followers` accepts.
pub const MAX_FOLLOWERS_MAX: u64 = 100_000;

/// Orders ahead of a queued one that `explain` counts (docs/design.md §10, DESIGN §10: "past
/// 10,000 it says so, not the number"): the count stops there, so a position costs the same with
/// 10,000 orders ahead as with a million.
pub const MAX_POSITION_COUNTED: i64 = 10_000;

/// The lease `pullman worker` and `pullman executor` ask for on each claim unless told, in
/// seconds; within [`LEASE_SECONDS`].
pub const AGENT_LEASE_SECONDS: i64 = 60;

/// Least `claim_timeout_seconds` for an order that must be watched (a Job or a build): the
/// smallest whose watch budget reaches `rules::MIN_WATCH_BUDGET` (docs/design.md §4).
pub const WATCHED_MIN_CLAIM_TIMEOUT_SECONDS: i64 = 120;

/// Largest `yaml_content`, in bytes (docs/design.md §5): 1 MiB. Larger bodies get `413`.
pub const MAX_YAML_BYTES: usize = 1024 * 1024;
/// Longest tenant, label, agent name in targeting, or annotation key/value accepted, in
/// characters (as JSON Schema's `maxLength` counts them, so the OpenAPI bound is the server's).
pub const MAX_STRING_CHARS: usize = 4096;
/// Longest agent name, in characters.
pub const MAX_AGENT_NAME_CHARS: usize = 253;
/// Longest concurrency key, in characters (docs/design.md §3).
pub const MAX_CONCURRENCY_KEY_CHARS: usize = 256;
/// Most entries in any one list or map of a request.
pub const MAX_LIST_ENTRIES: usize = 256;

/// Every integer range, for the tests and for the OpenAPI document.
pub const RANGES: [Range; 9] = [
    MAX_RETRIES,
    BACKOFF_SECONDS,
    CLAIM_TIMEOUT_SECONDS,
    MAX_RECLAIMS,
    PRIORITY,
    CONCURRENCY_MAX,
    LEASE_SECONDS,
    MAX_CONCURRENCY,
    MAX_ORDERS,
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::rules::{MIN_WATCH_BUDGET, watch_budget};

    #[test]
    fn every_range_is_ordered_fits_the_column_and_holds_its_default() {
        for r in RANGES.into_iter().chain([PAGE_LIMIT]) {
            assert!(r.min <= r.max, "{}", r.field);
            assert!(
                r.min >= i64::from(i32::MIN) && r.max <= i64::from(i32::MAX),
                "{}",
                r.field
            );
            if let Some(d) = r.default {
                assert!((r.min..=r.max).contains(&d), "{} default {d}", r.field);
            }
        }
        assert!((LEASE_SECONDS.min..=LEASE_SECONDS.max).contains(&AGENT_LEASE_SECONDS));
    }

    #[test]
    fn check_names_the_field_and_both_ends() {
        assert_eq!(MAX_RETRIES.check(100).unwrap(), 100);
        assert_eq!(MAX_RETRIES.check_or_default(None).unwrap(), 3);
        assert_eq!(LEASE_SECONDS.check_optional(None).unwrap(), None);
        match LEASE_SECONDS.check(4) {
            Err(QueueError::Invalid { field, message }) => {
                assert_eq!(field, "lease_seconds");
                assert_eq!(message, "lease_seconds must be between 5 and 86400, got 4");
            }
            other => panic!("{other:?}"),
        }
        assert!(CLAIM_TIMEOUT_SECONDS.check(604_801).is_err());
        assert!(MAX_CONCURRENCY.check_optional(Some(0)).is_err());
    }

    #[test]
    fn the_watched_minimum_is_the_least_timeout_with_a_full_watch_budget() {
        let at = |s: i64| watch_budget(s as u32);
        assert!(at(WATCHED_MIN_CLAIM_TIMEOUT_SECONDS) >= MIN_WATCH_BUDGET);
        assert!(at(WATCHED_MIN_CLAIM_TIMEOUT_SECONDS - 1) < MIN_WATCH_BUDGET);
    }
}
