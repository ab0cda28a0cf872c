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
//! - **Claim-next**: `POST /agents/{id}/claim` is `api::claims::claim_next`, which long-polls
//!   on `queue::Queue::claim_next_waiting` (`src/queue/long_poll.rs`: try, sleep until woken or the
//!   deadline, try again); each try is `claim_next_as` in `src/queue/claims/mod.rs`
//!   (`Queue::claim_next` is the same try without the wait). The statement is
//!   `src/queue/sql/claim_next.sql` (and `claim_next_capped.sql` for an agent with
//!   `max_concurrency`); its `-- @include` lines are the shared fragments beside it (the
//!   eligibility rule is `eligible.sql`, the claim row and the `CLAIMED` state are written by
//!   `take_claim.sql`), put in place by `build.rs`.
//! - **One order's life in an agent**: `pull::run` (or `run_once`) enters the private `run_loop`
//!   (`src/pull/mod.rs`), which claims and starts each order as `pull::order::carry_one`
//!   (claimed → applying → watching → reporting, or abandoned; heartbeats in `pull::heartbeat`).
//!   The agent's own steps are its `pull::Carrier`: `worker::ExecCarrier` runs the command, and
//!   the executor's `executor::KubeCarrier` applies and watches through `executor::Plan`.
//! - **The WorkOrder reconcile and its status write**: `controller::workorders` (`apply`: look up
//!   the order, queue it if unknown, compute the status, write it if it changed, say when to look
//!   again); the status is computed, purely, by `workorders::status_of`, which calls
//!   `controller::status` and `controller::schedulable`; `write_status` writes it (a server-side
//!   apply of the status subresource, `patch_status`) and records its Events. What keeps a
//!   burst cheap is apart, in `controller::burst`.
//! - **Output of running orders** (docs/design.md §9): stored and read in `queue::output` (chunks,
//!   the per-order cap, cursors, and the wire shapes), over HTTP in `api::output` (the append,
//!   pages and the NDJSON follow), printed by `admin::logs` (`pullman work-orders logs`).
//! - **Where a stale complete becomes `409`**: `queue::claims::holder` (`complete` matches only the
//!   live claim); when none matches, `queue::refusal::replay_or_refuse` answers a repeat of the
//!   agent's own completion again (or `already_completed` for a different outcome), and
//!   otherwise `explain_refusal` says `cancelled`, `reclaimed` or `not_claim_holder`; `api::error`
//!   turns each into HTTP `409`.

// Printing to stdout goes through `stdout` (a closed pipe must not panic).
#![deny(clippy::print_stdout)]

pub mod admin;
pub mod api;
pub mod auth;
pub mod cli;
pub mod client;
pub mod controller;
pub mod crd;
pub mod executor;
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
