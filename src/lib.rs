//! Pullman: a pull-based work-order queue on PostgreSQL, its HTTP pull API, and the Kubernetes side
//! (custom resources, controller, in-cluster executor).
//!
//! The contract every module keeps is `docs/design.md`, cited as "DESIGN.md §N" (names, states,
//! wire shapes, status codes, rules).
//! Modules, one concern each:
//! - [`queue`]: the work-order queue: SQL, state transitions, eligibility and retry rules.
//! - [`api`]: the REST API (axum) over the queue.
//! - [`auth`]: admin and agent bearer tokens.
//! - [`telemetry`]: logging and Prometheus metrics.
//! - [`crd`]: the `WorkOrder` and `Executor` custom resources.
//! - [`postgres`]: the embedded PostgreSQL used when no `DATABASE_URL` is given.
//! - [`pull`]: the pull loop of agents (claim, heartbeat, complete) and the life of one order,
//!   shared by [`worker`] and [`executor`].
//! - [`wire`]: the HTTP API's request, answer and error shapes, shared by server and clients.
//! - [`stdout`]: printing for the commands that print; a closed pipe ends them quietly.
//! - `testing` (feature `testing`): the set-up shared by `tests/` and `bench/`.

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
