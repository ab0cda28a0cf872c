//! Test support: the shared set-up of `pullman::testing` (one throwaway PostgreSQL per test
//! process, a fresh migrated database per test, an in-process API server), plus what only an
//! integration test can name (the built binary, the admin CLI in [`cli`], `pullman worker` runs
//! in [`worker`], `pullman serve` as a process in [`serve`]) and the Kubernetes helpers.
#![allow(dead_code)]

pub mod agent;
pub mod cli;
pub mod cut;
#[cfg(feature = "k8s-tests")]
pub mod kube;
#[cfg(feature = "k8s-tests")]
pub mod open_streams;
pub mod output;
pub mod own_postgres;
pub mod queue;
pub mod serve;
pub mod worker;

pub use pullman::testing::*;

/// The `pullman` binary built for these tests.
pub fn pullman_bin() -> &'static str {
    env!("CARGO_BIN_EXE_pullman")
}

/// The `message` of an order or log entry (the outcome's words), for the checks of what it says.
///
/// # Panics
/// When `v` has no message.
pub fn message(v: &serde_json::Value) -> &str {
    v["message"].as_str().expect("a message")
}

/// The message of an API error answer (`{"error": {"code", "message"}}`), for the checks of what
/// it says that the refusal tests make.
///
/// # Panics
/// When `v` has no error message.
pub fn error_message(v: &serde_json::Value) -> &str {
    v["error"]["message"].as_str().expect("an error message")
}

/// Asserts that an API answer (`status`, body `v`) is the refusal `want_status` with error code
/// `want_code`, showing the body when it is not: the same check as comparing
/// `(status, v["error"]["code"])` by hand.
#[track_caller]
pub fn assert_refused(status: u16, v: &serde_json::Value, want_status: u16, want_code: &str) {
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (want_status, Some(want_code)),
        "{v}"
    );
}
