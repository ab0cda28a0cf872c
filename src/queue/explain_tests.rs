//! Tests of `queue::explain` against a real PostgreSQL (a file of its own, so the test helpers
//! it uses are not an edge of the module: tests/module_cycles.rs).

use super::*;

/// Callers that ask while a read of the live agents is under way share the next one (no
/// read per order in a burst, issue #35), and no caller gets a read begun before it asked.
#[tokio::test]
async fn a_burst_shares_reads_and_no_read_is_older_than_its_question() {
    let queue = Queue::new(crate::testing::fresh_pool(4).await);
    let recent = RecentAgents::default();
    let burst = futures::future::join_all((0..21).map(|_| recent.get(&queue))).await;
    let reads: Vec<_> = burst.into_iter().map(Result::unwrap).collect();
    let distinct = reads
        .iter()
        .enumerate()
        .filter(|(i, a)| !reads[..*i].iter().any(|b| std::sync::Arc::ptr_eq(a, b)))
        .count();
    assert!(distinct <= 2, "21 callers at once made {distinct} reads");
    crate::testing::register_agent(&queue, serde_json::json!({"name": "late", "labels": ["x"]}))
        .await;
    let later = recent.get(&queue).await.unwrap();
    assert_eq!(
        later.len(),
        1,
        "a read begun after the question sees the new agent"
    );
}
