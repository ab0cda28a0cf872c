//! The integration tests that share one test binary (and one throwaway PostgreSQL, started by
//! the first test that asks for it): one module per concern, named as its file. A single binary
//! instead of one per file saved CI a link, a clippy pass and a PostgreSQL start per file.
//! Binaries of their own: the Kubernetes tests (`k8s_controller`, `k8s_executor`, which need
//! the `k8s-tests` feature and the test control plane), `serve_ready_signal` (its busy threads
//! would slow the timed tests here) and `module_cycles` (no database; a check run by name).
//!
//! One file's tests: `cargo test --test integration history::`.

#[path = "../support/mod.rs"]
mod support;

mod auth_input;
mod claims_concurrency;
mod cli_admin;
mod cli_exit_codes;
mod cli_faults;
mod cli_help;
mod cli_logs;
mod complete_many;
mod concurrency_keys;
mod concurrency_keys_wake;
mod crdgen;
mod disruptions;
mod eligibility;
mod failover;
mod group_claims;
mod hand_out_order;
mod history;
mod limits;
mod openapi;
mod output;
mod output_crash;
mod output_follow;
mod output_lifecycle;
mod own_backlog;
mod parked_turns;
mod pull_loop;
mod pull_reports;
mod readme;
mod reliability;
mod retries_reaper;
mod serve_cli;
mod serve_shutdown;
mod why_waiting;
mod worker_cli;
mod worker_e2e;
mod worker_faults;
mod worker_output;
