//! The list pages of the OpenAPI document, one schema per item type (docs/design.md §5: lists are
//! keyset-paginated, `next_cursor` in the response).
//!
//! The handlers answer [`Page<T>`](crate::queue::Page). utoipa 5 describes a generic `Page<T>` by
//! copying the schema of `T` into it (utoipa issue #1586), so a client generated from the
//! document had a `PageWorkOrderItemsItem` class beside `WorkOrder`. These structs describe the
//! same wire shape with the items as references to `WorkOrder`, `Agent` and `LogEntry`. They are
//! never built; `tests/integration/openapi.rs` checks that `Page<T>` serializes to exactly
//! their fields.

#![allow(dead_code)]

use utoipa::ToSchema;

use crate::queue::{Agent, LogEntry, WorkOrder};

/// One page of active work orders (`Page<WorkOrder>` on the wire), without `yaml_content`.
#[derive(ToSchema)]
pub struct WorkOrderPage {
    /// The orders of this page, in the list's order.
    items: Vec<WorkOrder>,
    /// Pass as `cursor` to get the next page; null on the last page.
    #[schema(required = true)]
    next_cursor: Option<String>,
}

/// One page of agents (`Page<Agent>` on the wire).
#[derive(ToSchema)]
pub struct AgentPage {
    /// The agents of this page, in the list's order.
    items: Vec<Agent>,
    /// Pass as `cursor` to get the next page; null on the last page.
    #[schema(required = true)]
    next_cursor: Option<String>,
}

/// One page of the log of finished work orders (`Page<LogEntry>` on the wire), newest first,
/// without `yaml_content`.
#[derive(ToSchema)]
pub struct LogEntryPage {
    /// The log entries of this page, newest first.
    items: Vec<LogEntry>,
    /// Pass as `cursor` to get the next page; null on the last page.
    #[schema(required = true)]
    next_cursor: Option<String>,
}
