//! The guards `.ci/run` runs (`--guard-http-ratio=R`, issue #34): scenarios measured once more
//! before they fail, as the machine is shared and noisy. Each returns the process's exit code.

use super::{AGENTS, Bench};

/// The throughput guard (`.ci/run`): scenarios 1 and 2 in one run, and the exit code 1 when HTTP
/// end to end falls below `min` × the SQL ceiling measured just before it, or its claims share
/// fewer than [`GUARD_CLAIMS_PER_COMMIT`] a commit (the server's group claims). A miss is
/// measured once more before it fails.
pub(super) async fn http_ratio(b: &Bench, orders: usize, min: f64) -> i32 {
    for attempt in 1..=2 {
        let ceiling = b.ceiling_row(orders).await;
        let (http, per_commit) = b.http_row(orders, ceiling).await;
        let ratio = http / ceiling;
        let figures = format!(
            "HTTP {http:.0} orders/s / SQL ceiling {ceiling:.0} orders/s = {ratio:.2} (at least {min}), \
             {per_commit:.1} claims a commit (at least {GUARD_CLAIMS_PER_COMMIT})"
        );
        if ratio >= min && per_commit >= GUARD_CLAIMS_PER_COMMIT {
            println!("\nthroughput guard: {figures} (attempt {attempt}): passed");
            return 0;
        }
        println!("\nthroughput guard: {figures} (attempt {attempt}): below");
    }
    println!(
        "throughput guard: failed twice in a row; the HTTP path lost throughput against the SQL ceiling, or the server's group claims stopped grouping"
    );
    1
}

/// The fewest claims a commit may carry on average in (2), 16 agents claiming one order at a
/// time: 1.0 when each claim commits alone, as before group claims (`queue::claims::group`),
/// which held (2) at 0.52–0.58 × the ceiling (bench/README.md, issue #34).
const GUARD_CLAIMS_PER_COMMIT: f64 = 1.5;

/// The fewest orders a claim-next of (2d)'s agent of 16 slots may carry on average before the
/// batching guard fails: 15.3 with a scheduler turn before a claim gathers its free slots, 8.2
/// without it (bench/README.md, issue #34).
const GUARD_ORDERS_PER_CLAIM: f64 = 12.0;

/// The fewest completes a commit may carry on average in (2d): 10–15 with a scheduler turn
/// before a group commit takes its batch, 4.1 without it (bench/README.md, issue #34).
const GUARD_COMPLETES_PER_COMMIT: f64 = 6.0;

/// The fewest completes one report request of (2d)'s agent may carry on average (batch
/// complete, `pull::report`): 1.0 when every order reports alone, as before the batches, which
/// held (2d) at 0.60–0.76 × River (bench/README.md, issue #34).
const GUARD_COMPLETES_PER_REQUEST: f64 = 3.0;

/// The batching guard (`.ci/run`, with the throughput guard): (2d), one agent of 16 slots, must
/// claim, report and commit its orders in batches of at least [`GUARD_ORDERS_PER_CLAIM`],
/// [`GUARD_COMPLETES_PER_REQUEST`] and [`GUARD_COMPLETES_PER_COMMIT`] on average; measured once
/// more before it fails. Returns the process's exit code.
pub(super) async fn batching(b: &Bench, orders: usize) -> i32 {
    for attempt in 1..=2 {
        let (rate, batching) = b.pull_loops(orders, 1, AGENTS).await;
        let (claim, commit) = (batching.per_claim, batching.per_commit);
        let request = batching.per_request;
        let figures = format!(
            "{rate:.0} orders/s, {claim:.1} orders a claim (at least {GUARD_ORDERS_PER_CLAIM}), \
             {request:.1} completes a request (at least {GUARD_COMPLETES_PER_REQUEST}), \
             {commit:.1} completes a commit (at least {GUARD_COMPLETES_PER_COMMIT})"
        );
        if claim >= GUARD_ORDERS_PER_CLAIM
            && request >= GUARD_COMPLETES_PER_REQUEST
            && commit >= GUARD_COMPLETES_PER_COMMIT
        {
            println!("batching guard: (2d) {figures} (attempt {attempt}): passed");
            return 0;
        }
        println!("batching guard: (2d) {figures} (attempt {attempt}): below");
    }
    println!(
        "batching guard: failed twice in a row; the pull loop or the group commit batches less"
    );
    1
}
