//! Batch complete, `POST /agents/{agent_id}/complete` (issue #34): an agent reports several of its
//! claims' results in one request. Each item is answered as `POST /work-orders/{id}/complete`
//! would answer it (fencing, replays of a repeat, `409`s), because each goes through the same
//! `Queue::complete`; the successes of one request reach the group commit together and share its
//! statement and commit. What the batch saves is the agent's and the server's work per request:
//! one order a request, an agent of 16 slots spent most of its time on HTTP, not on PostgreSQL
//! (bench/README.md, issue #34).

use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use uuid::Uuid;

use super::claims::{completion, note_completion};
use super::error::{ApiJson, ApiPath, DatabaseUnavailable};
use super::{ApiError, AppState, Caller, ErrorBody};
use crate::queue::limits::MAX_COMPLETES;
use crate::queue::validate::validate_completion;
use crate::queue::{Completion, CompletionResult, QueueError};
use crate::wire::{CompleteItem, CompleteManyBody, CompleteResult, CompletedMany, RetryScheduled};

/// Items of one batch complete in flight at once. Successes share the group commit's
/// statements whatever this is; a failure is a transaction of its own, holding a pooled
/// connection, and a batch of 100 failures must not take every connection of the pool from the
/// claims of other agents.
const COMPLETES_AT_ONCE: usize = 16;

/// Report the results of several of the agent's claims in one request; each is answered as
/// `POST /work-orders/{id}/complete` would answer it, in the request's order.
#[utoipa::path(post, path = "/api/v1/agents/{id}/complete", tag = "claims",
    params(("id" = Uuid, Path, description = "Agent id")), request_body = CompleteManyBody,
    responses(
        (status = 200, description = "One result per item, in the request's order, each with the status its own complete would have answered: `200` with the log entry (without `yaml_content`), `202` with the retry, `409`/`404` with the error; an item answered `503` may or may not have been completed: send it again (a repeat of a complete that was committed is answered as a replay)", body = CompletedMany),
        (status = 400, description = "`invalid_field`: `completes` empty or past 100, an order twice, or `disrupted: true` with `success: true` (the item and field are named); nothing completed", body = ErrorBody),
        (status = 503, description = "`database_unavailable`: every item was answered so (a commit's outcome may be unknown); send the request again after `Retry-After` seconds, and a complete that was committed is answered as a replay", body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn complete_many(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(agent_id): ApiPath<Uuid>,
    ApiJson(body): ApiJson<CompleteManyBody>,
) -> Result<Response, ApiError> {
    caller.require_agent(agent_id)?;
    let started = Instant::now();
    let items = checked(body.completes)?;
    let ids: Vec<Uuid> = items.iter().map(|(id, _, _)| *id).collect();
    let answers: Vec<Result<CompletionResult, QueueError>> = futures::stream::iter(items)
        .map(|(id, claim_id, completion)| {
            let queue = state.queue.clone();
            async move { queue.complete(id, agent_id, claim_id, &completion).await }
        })
        .buffered(COMPLETES_AT_ONCE)
        .collect()
        .await;
    let mut unavailable = 0;
    let results: Vec<CompleteResult> = ids
        .into_iter()
        .zip(answers)
        .map(|(id, answer)| {
            let result = answered(&state, id, agent_id, answer);
            if result.status == 503 {
                unavailable += 1;
            }
            result
        })
        .collect();
    tracing::debug!(
        agent = %agent_id,
        completes = results.len(),
        seconds = started.elapsed().as_secs_f64(),
        "batch complete answered"
    );
    if unavailable == results.len() {
        // Every item met the outage: the request's answer is the outage's (docs/design.md §5).
        return Err(ApiError::database_unavailable());
    }
    let mut response = Json(CompletedMany { results }).into_response();
    if unavailable > 0 {
        // Some items found the database gone: the server learns of the outage as from any 503.
        response.extensions_mut().insert(DatabaseUnavailable);
    }
    Ok(response)
}

/// The items as the queue takes them, once all are valid: `400 invalid_field` naming the item
/// and field for the first that is not, so a bad batch completes nothing.
fn checked(items: Vec<CompleteItem>) -> Result<Vec<(Uuid, Option<Uuid>, Completion)>, ApiError> {
    if items.is_empty() || items.len() > MAX_COMPLETES {
        return Err(ApiError::bad_request(
            "invalid_field",
            format!(
                "completes must hold 1 to {MAX_COMPLETES} results, got {}",
                items.len()
            ),
        ));
    }
    let mut seen = std::collections::HashMap::with_capacity(items.len());
    let mut checked = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        if let Some(first) = seen.insert(item.work_order_id, i) {
            return Err(ApiError::bad_request(
                "invalid_field",
                format!(
                    "completes[{i}].work_order_id: {} is also completes[{first}]'s; report each \
                     order once",
                    item.work_order_id
                ),
            ));
        }
        let completion = completion(item.success, item.message, item.retryable, item.disrupted);
        if let Err(QueueError::Invalid { field, message }) = validate_completion(&completion) {
            // The queue's message begins with the field it names.
            let message = match message.strip_prefix(field.as_str()) {
                Some(rest) => format!("completes[{i}].{field}{rest}"),
                None => format!("completes[{i}].{field}: {message}"),
            };
            return Err(ApiError::bad_request("invalid_field", message));
        }
        checked.push((item.work_order_id, item.claim_id, completion));
    }
    Ok(checked)
}

/// One item's result, as its own complete would have answered it.
fn answered(
    state: &AppState,
    id: Uuid,
    agent_id: Uuid,
    answer: Result<CompletionResult, QueueError>,
) -> CompleteResult {
    let mut result = CompleteResult {
        work_order_id: id,
        status: 200,
        log_entry: None,
        retry_scheduled: None,
        error: None,
    };
    match answer {
        Ok(done) => {
            note_completion(state, id, agent_id, &done);
            match done {
                CompletionResult::Finished(mut entry) => {
                    // A batch answer is a list: no `yaml_content` (docs/design.md §5), which
                    // would make it up to 100 MiB.
                    entry.yaml_content = None;
                    result.log_entry = Some(entry);
                }
                CompletionResult::RetryScheduled { next_retry_after } => {
                    result.status = 202;
                    result.retry_scheduled = Some(RetryScheduled::at(next_retry_after));
                }
            }
        }
        Err(e) => {
            let e = ApiError::from(e);
            result.status = e.status.as_u16();
            result.error = Some(e.into());
        }
    }
    result
}
