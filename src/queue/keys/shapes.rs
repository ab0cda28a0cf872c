//! The wire shapes of concurrency keys (docs/design.md §3 "Concurrency keys"). They import
//! nothing of the queue, so `queue::model` can carry them without a module cycle.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What a new order of a key does to the orders of that key that still wait.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnConflict {
    /// Wait for a free slot, with reason `concurrency_limited` (docs/design.md §10).
    #[default]
    Queue,
    /// Cancel the key's waiting orders (never the claimed ones), as GitHub's concurrency groups
    /// cancel superseded runs.
    Supersede,
}

impl OnConflict {
    /// The column's spelling (`work_orders.concurrency_on_conflict`).
    pub fn as_str(self) -> &'static str {
        match self {
            OnConflict::Queue => "queue",
            OnConflict::Supersede => "supersede",
        }
    }
}

/// `concurrency` of a create body (docs/design.md §3). `max` arrives as a wide integer so that an
/// out-of-range value is reported against its bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewConcurrency {
    /// The key, 1–256 characters; keys are per tenant (orders without a tenant share theirs).
    pub key: String,
    /// Most orders of the key holding a claim at once, 1–100000 (default 1).
    #[serde(default)]
    pub max: Option<i64>,
    /// `queue` (default) or `supersede`. `onConflict` is accepted too, as the CRD spells it.
    #[serde(default, alias = "onConflict")]
    pub on_conflict: Option<OnConflict>,
}

/// An order's concurrency key as stored and answered (docs/design.md §3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Concurrency {
    pub key: String,
    /// Most orders of the key holding a claim at once.
    pub max: i32,
    pub on_conflict: OnConflict,
}

impl Concurrency {
    /// From the three columns an order or a log entry stores it in; `None` without a key.
    pub(in crate::queue) fn from_columns(
        key: Option<String>,
        max: Option<i32>,
        on_conflict: Option<String>,
    ) -> Option<Concurrency> {
        Some(Concurrency {
            key: key?,
            max: max.unwrap_or(1),
            on_conflict: match on_conflict.as_deref() {
                Some("supersede") => OnConflict::Supersede,
                _ => OnConflict::Queue,
            },
        })
    }
}
