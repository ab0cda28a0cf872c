//! Test and benchmark set-up shared by `tests/` and `bench/` (feature `testing`): one throwaway
//! PostgreSQL per process, a fresh migrated database per test, and the API server in-process on
//! an ephemeral port, wired as `pullman serve` wires it.
//!
//! Built only with the `testing` feature, which the crate's own dev-dependency on itself turns on
//! for tests and benches; `pullman` as shipped does not contain it.
//! The crate's own unit tests also find here (`cfg(test)`) how its property tests against the
//! database run.

mod api;
mod poll;
mod postgres;
mod queue;
mod server;

pub use api::{ADMIN_TOKEN, ApiClient};
pub use poll::eventually;
pub use postgres::{free_port, fresh_database_url, fresh_pool, server_url};
pub use queue::{claim_next_id, create_order, register_agent, retry_pending};
pub use server::{TestServer, configmap_order};

/// How many cases the crate's own property tests against the database run:
/// `PULLMAN_PROPTEST_CASES`, or `default`.
#[cfg(test)]
pub(crate) fn proptest_cases(default: u32) -> u32 {
    std::env::var("PULLMAN_PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// A runner of `cases` cases for those property tests, which persist no failures.
#[cfg(test)]
pub(crate) fn proptest_runner(cases: u32) -> proptest::test_runner::TestRunner {
    use proptest::test_runner::{Config, TestRunner};
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}
