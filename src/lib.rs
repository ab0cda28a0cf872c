//! Pullman: a pull-based work-order queue on PostgreSQL, its HTTP pull API, and the Kubernetes side
//! (custom resources, controller, in-cluster executor).
//!
//! The contract every module keeps is `docs/design.md` (the repository's copy of the design),
//! cited in the code as "docs/design.md §N": names, states, wire shapes, status codes, rules.
//!
//! # Code map
//!
//! One binary, `pullman`, runs as one of three kinds of process ([`cli`] parses; `main.rs` only
//! dispatches). Modules, one concern each, by the process that runs them:
//!
//! **The server** (`pullman serve`, [`serve`]: database, API, maintenance, controller, shutdown)
//! - [`queue`]: the work-order queue: every statement a file in `src/queue/sql/`, the state
//!   transitions, and the one eligibility rule (`queue::eligibility`) every claim path shares.
//!   Every bound and default of an order's or an agent's numbers is in `queue::limits`, read by
//!   validation, the OpenAPI document, the CRDs and the agents' flags alike.
//! - [`api`]: the REST API (axum) over the queue, with its OpenAPI description.
//! - [`auth`]: checking admin and agent bearer tokens (the queue stores only hashes).
//! - [`controller`]: the WorkOrder and Executor reconcilers (leader-elected).
//! - [`postgres`]: the embedded PostgreSQL used when no database URL is given.
//! - [`telemetry`]: logging and Prometheus metrics.
//! - [`memory`]: how the process hands large freed blocks back to the system.
//!
//! **The agents** (`pullman worker` on any host, `pullman executor` in a cluster)
//! - [`pull`]: the pull loop both share (claim, heartbeat, complete, drain on signals) and the
//!   life of one order as a state machine.
//! - [`worker`]: runs a command per order.
//! - [`executor`]: applies an order's YAML with server-side apply and watches its Jobs and
//!   BuildRuns to a verdict.
//! - [`manifest`]: the multi-document YAML of `yaml_content` (also checked by the server).
//!
//! **The CLI** (`pullman agents|work-orders|log`, `completion`)
//! - [`admin`]: the admin commands over the REST API.
//!
//! **Shared**
//! - [`wire`]: the API's request, answer and error shapes (server and clients).
//! - [`client`]: the typed HTTP client of the API (agents and CLI).
//! - [`crd`]: the `WorkOrder` and `Executor` custom resources (`pullman crdgen`).
//! - [`signals`]: SIGINT/SIGTERM handling.
//! - [`stdout`]: printing for the commands that print; a closed pipe ends them quietly.
//! - `testing` (feature `testing`): the set-up shared by `tests/` and `bench/`.
//!
//! No two modules import each other, directly or round a loop (a parent over its own children
//! aside): the lower one holds what both need (`queue::model` the why-waiting answer,
//! `queue::output` the output's wire shapes, which `wire` re-exports). `tests/module_cycles.rs`
//! fails on a cycle and names the `use` lines that make it (`cargo test --test module_cycles`).
//!
//! # Where to start reading
//!
//! - **Claim-next**: `POST /agents/{id}/claim` is `api::claims::claim_next`, which long-polls on
//!   `queue::Queue::claim_next_waiting` (`src/queue/long_poll.rs`: try, sleep until woken or the
//!   deadline, try again); each try is `claim_next_as` in `src/queue/claims/mod.rs`
//!   (`Queue::claim_next` is the same try without the wait). The statement is
//!   `src/queue/sql/claim_next.sql`, four `-- @include` fragments beside it, put in place by
//!   `build.rs`, in this order: `claiming_agent.sql` (the agent's row, `FOR KEY SHARE`),
//!   `handout_walk.sql` (the walk over claimable orders, whose `target` picks them, which includes
//!   the eligibility rule `eligible.sql` and the key check `key_full.sql`), `take_claim.sql` (the
//!   claim row and the `CLAIMED` state), and `claim_next_result.sql` (the answer, with
//!   `claimed_order.sql`). For an agent with `max_concurrency` that statement walks nothing
//!   (`walks` is false) and only returns the agent; `claim_next_as` then runs `claim_next_capped`
//!   (a transaction: its room counted, then `claim_next_capped.sql`, which starts with
//!   `capped_agent.sql` instead of `claiming_agent.sql`); skip it on a first read. Tenants take
//!   turns while several compete (`queue::turns`: `claim_next_fair.sql` and
//!   `claim_next_capped_fair.sql`, which walk `turn_walk.sql` instead of `handout_walk.sql`); an
//!   order's concurrency key is a slot its claim row takes and gives back (`queue::keys`: the
//!   triggers of migration `20261211000040_concurrency_keys.sql`, and `key_full.sql` in the walks).
//! - **One order's life in an agent** (traced hop by hop below): `pull::run` (or `run_once`) enters
//!   the private `run_loop` (`src/pull/mod.rs`), which claims and starts each order as
//!   `pull::order::carry_one` (claimed → applying → watching → reporting, or abandoned; heartbeats
//!   in `pull::heartbeat`). An order gives its slot back once its verdict is in, then waits for a
//!   report permit (`pull::order`'s `Slot` and `Reports`), so the next claim does not wait for this
//!   complete; `report` (`src/pull/order.rs`) sends the verdict as `POST …/complete` (next entry).
//!   The agent's own steps are its `pull::Carrier`: `worker::ExecCarrier` runs the command, and the
//!   executor's `executor::KubeCarrier` applies and watches through `executor::Plan`.
//! - **The WorkOrder reconcile and its status write**: `controller::workorders` (`apply`: look up
//!   the order, queue it if unknown, compute the status, write it if it changed, say when to look
//!   again); the status is computed, purely, by `workorders::status_of`, which calls
//!   `controller::status` and `controller::schedulable`; `write_status` writes it (a server-side
//!   apply of the status subresource, `patch_status`) and records its Events. What keeps a burst
//!   cheap is apart, in `controller::burst`.
//! - **Output of running orders** (docs/design.md §9): stored and read in `queue::output` (chunks,
//!   the per-order cap, cursors, and the wire shapes), over HTTP in `api::output` (the append,
//!   pages and the NDJSON follow), printed by `admin::logs` (`pullman work-orders logs`). The whole
//!   path, from a pod or a command to `logs -f`, is traced below.
//! - **Where a stale complete becomes `409`**: in short, the fence is `sql/live_claim.sql` and
//!   which `409` is the table at the top of `src/queue/refusal.rs`; read those first.
//!   `POST /work-orders/{id}/complete` is `api::claims::complete`, which calls `Queue::complete`
//!   (`src/queue/claims/holder.rs`). A success goes through `commit_success`, into the next
//!   `queue::group_commit` batch (several agents' completes in one transaction) or, with group
//!   commit off, `group_commit::single`; a failure is its own transaction. Either way the statement
//!   touches only the live claim (the condition is `sql/live_claim.sql`, included by
//!   `complete_success.sql`, the batch's `complete_success_many.sql` and the failure's
//!   `end_live_claim.sql`); when none matches, `Queue::replay_or_refuse` (`src/queue/refusal.rs`)
//!   answers a repeat of the agent's own completion again (or `already_completed` for a different
//!   outcome), and otherwise `explain_refusal` says `cancelled`, `reclaimed` or `not_claim_holder`;
//!   `api::error` turns each into HTTP `409`.
//! - **A Job under a disruption** (docs/design.md §12): `executor::plan`'s `JobsPlan::watch` waits
//!   on each Job through `JobWatching::job_end` (`src/executor/held.rs`), which holds a verdict
//!   while `executor::disruption::holds` finds a pod that may still run on a node that does not
//!   report (the order says `node_unreachable` through `pull::Progress`), and records in an
//!   `executor::disrupted::Record` what the pods said. A failure a disruption ended is
//!   `pull::Verdict::Disrupted` (after `clear_for_rerun` under `retryOnDisruption: safe`), sent by
//!   `pull::order`'s `report` as `complete {disrupted: true}`; the queue decides in
//!   `rules::decide_disruption` and writes `sql/requeue_disrupted.sql` or the log (`holder.rs`,
//!   `EndedAttempt::disrupted`).
//! - **A `build` order** (docs/design.md §4): `executor::plan`'s `Plan::apply` hands it to
//!   `executor::build::BuildPlan::apply` (`src/executor/build.rs`): the Build applied, its
//!   `status.registered` awaited (`verdict::build_registered`), the attempt's BuildRun applied;
//!   `BuildPlan::watch` waits on the shared BuildRun watch (`verdict::buildrun_verdict`) and, on a
//!   failure, adds the failed step's exit code (`pods::failed_build_step`). The real controllers
//!   run it in `e2e/shipwright`.
//!
//! # Three traces, hop by hop
//!
//! **One order in an agent** (`src/pull/mod.rs`, then `src/pull/order.rs`; docs/design.md §2).
//! 1. `pull::run` (or `run_once`) enters `run_loop`; each turn `Running::collect_finished` first
//!    notes the orders that ended.
//! 2. A free slot (a permit of `slots`, one per `--concurrency`); `more_permits` adds every other
//!    free one, so one claim asks for all of them.
//! 3. `Pull::claim`: `ask` sends `Client::claim_next` with `max_orders` (long-polling), `start`
//!    spawns each order claimed with its slot (`spawn_order`), `back_off` waits after a failure.
//! 4. `pull::order::carry_one`: claimed → applying (`Carrier::start`) → watching
//!    (`Carrier::finish`), heartbeats every lease/3 meanwhile (`pull::heartbeat`); a refused
//!    heartbeat abandons the order.
//! 5. The verdict is in: `Slot::reporting` takes a report permit, then gives the slot back, so
//!    the next claim does not wait for this complete.
//! 6. `report` sends `POST …/complete` with the claim's `claim_id`, retrying transient failures
//!    (a repeat is answered as the first: `queue::refusal`).
//! 7. Drained (SIGTERM): `run_loop` stops claiming and waits for the orders running.
//!
//! **Why an order waits** (docs/design.md §10). The API and the WorkOrder condition ask the same
//! classifier, built on the claim's own eligibility rule, so neither can contradict a claim.
//! 1. `pullman work-orders explain ID` (`admin::explain::explain`) calls `Client::explain_work_order`.
//! 2. `GET /api/v1/work-orders/{id}/explain` is `api::work_orders::explain` (routed in `api::router`).
//! 3. `queue::Queue::explain` (`src/queue/explain.rs`) asks `Queue::waiting`; else `404` or `409`.
//! 4. `Queue::waiting` (its body is the private `waiting_with`) reads the order
//!    (`waiting_order.sql`) and `live_agents` in one snapshot.
//! 5. The private `WaitingColumns::verdict` makes the order's `OrderProfile` and calls `classify`.
//! 6. `queue::waiting::classify` matches by `eligibility::agent_may_see`, then picks the first reason.
//! 7. Only for `queued`, `queue_position.sql` counts the orders the same takers take first.
//! 8. `waiting::explanation` builds the answer, a `queue::model::Explanation`, sent as JSON.
//! 9. The CLI turns `409 not_waiting` and `404 finished` into a "running" or "finished" answer
//!    with exit 0 (`admin::explain`'s `running` and `finished`, which ask for the order or its
//!    log entry).
//!
//! The `Schedulable` condition asks the same classifier from the controller:
//! 1. `controller::workorders::apply` asks `waiting_reason` about an unclaimed order.
//! 2. `Queue::waits` (`waiting_orders.sql`) runs `classify` once per group of like orders.
//! 3. `waiting::wait` turns each verdict into a reason and one sentence.
//! 4. `status_of` calls `controller::schedulable::condition_of`; `parts` maps reason to status.
//! 5. `write_status` patches the status and records `schedulable::unschedulable_event` once.
//! 6. `schedulable::refreshes` asks again every `REFRESH_EVERY`: agent changes never touch the order.
//!
//! **A running order's output, from a pod or a command to `logs -f`** (docs/design.md §9), in
//! three parts: the agent (1–7), the server (8–12), the reader (13).
//! On a first read follow the worker (3) and skip 1–2: the executor feeds the same pipeline.
//! 1. Executor: `KubeCarrier::follow_logs` (`src/executor/mod.rs`) starts the sender and
//!    `executor::logs::PodLogs::follow` (`src/executor/logs.rs`).
//! 2. Executor: each container run is `executor::container_log::follow`
//!    (`src/executor/container_log.rs`), reopened when it breaks.
//! 3. Worker: `worker::spawn_command` (`src/worker.rs`) starts the `OutputSender` and a
//!    `stream_lines` per pipe.
//! 4. Both cut bytes with `pull::lines::LineCutter` (`src/pull/lines.rs`), redacted before any cut.
//! 5. Lines go to `OutputHandle::push_redacted` (`src/pull/output/mod.rs`; from the executor's
//!    `container_log::StreamSink`, the worker's `emit_line`).
//! 6. The `OutputSender` task (`src/pull/output/send.rs`: `send_loop`, `next_chunk`, `deliver`)
//!    sends numbered chunks each second.
//! 7. `Client::send_output` (`src/client.rs`) is `POST /api/v1/work-orders/{id}/output`, resent
//!    with one `seq`.
//! 8. `api::output::append` (`src/api/output.rs`) reads the body within `read_chunk_body`'s
//!    guards (size, write permits, time), then checks the caller.
//! 9. `Queue::append_output` (`src/queue/output/mod.rs`) checks the claim is live
//!    (`sql/output_fence.sql`, the output's `409`) and stores it; the statement,
//!    `sql/output_insert.sql`, also sends `pg_notify('pullman_output', order)`.
//! 10. The `queue::notify` listener (`listen`, `src/queue/notify.rs`) passes that on to
//!     `Notifications::output_stored`'s subscribers.
//! 11. `…/output?follow=true`: `api::output::read`'s `Follower` reads `Queue::read_output` when woken
//!     (and about once a minute without a wake-up, `FOLLOW_POLL`, should a notification be lost).
//! 12. The order's end: its follower row (`Queue::register_follower`, before the first read)
//!     makes its move to the log `NOTIFY pullman_output` too, so the stream ends with the order.
//! 13. `work-orders logs -f`: `admin::logs::logs` (`src/admin/logs.rs`), whose `follow_once` reads
//!     `Client::follow_output`.

// Printing to stdout goes through `stdout` (a closed pipe must not panic).
#![deny(clippy::print_stdout)]

pub mod admin;
pub mod api;
pub mod auth;
pub mod cli;
pub mod client;
pub mod controller;
pub mod crd;
pub mod db_keepalive;
pub mod executor;
mod gather;
pub mod manifest;
pub mod memory;
pub mod postgres;
pub mod pull;
pub mod queue;
pub mod serve;
pub mod signals;
pub mod stdout;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
pub mod wire;
pub mod worker;
