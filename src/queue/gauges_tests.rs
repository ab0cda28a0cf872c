//! Tests of `queue::gauges` against a real PostgreSQL (a file of its own, so the test helpers
//! it uses are not an edge of the module: tests/module_cycles.rs).

use super::*;
use crate::queue::WaitReason;
use crate::testing::{create_order, fresh_pool, register_agent};
use serde_json::json;

use crate::testing::configmap_order as order;

/// Sets when the current turn was taken, and whether its figures were stored after it.
async fn turn_taken(queue: &Queue, seconds_ago: f64, computed: bool) {
    sqlx::query(
        "UPDATE gauge_snapshot SET taken_at = now() - make_interval(secs => $1), \
         computed_at = CASE WHEN $2 THEN now() ELSE now() - make_interval(secs => $1 + 1) END",
    )
    .bind(seconds_ago)
    .bind(computed)
    .execute(&queue.pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn one_caller_per_period_computes_and_a_read_returns_what_it_stored() {
    let queue = Queue::new(fresh_pool(16).await);
    assert_eq!(queue.stored_gauges().await.unwrap(), None);
    create_order(&queue, order("gpu")).await;
    register_agent(&queue, json!({"name": "a", "labels": ["gpu"]})).await;
    create_order(&queue, order("tpu")).await;
    create_order(&queue, order("tpu")).await;

    let period = Duration::from_secs(60);
    let calls = (0..8).map(|_| {
        let queue = queue.clone();
        tokio::spawn(async move { queue.refresh_gauges(period, 20).await.unwrap() })
    });
    let took = futures::future::join_all(calls).await;
    let took = took.into_iter().filter(|t| *t.as_ref().unwrap()).count();
    assert_eq!(took, 1, "one of 8 concurrent callers computes in a period");

    let stored = queue
        .stored_gauges()
        .await
        .unwrap()
        .expect("stored figures");
    assert!(stored.age_seconds < 30.0, "{stored:?}");
    let f = &stored.figures;
    assert_eq!(f.statuses.get("PENDING"), Some(&3), "{f:?}");
    assert_eq!(f.waiting["no_matching_agent"].orders, 2, "{f:?}");
    assert_eq!(f.waiting["no_agent_connected"].orders, 1, "{f:?}");
    assert_eq!(f.waiting.len(), WaitReason::ALL.len());
    assert_eq!(f.unclassified, 0);
    assert_eq!(f.tenants.len(), 1, "{f:?}");
    assert_eq!(f.tenants[0].waiting, 3);

    // Until the next turn a read returns the stored figures, not the queue as it is now.
    create_order(&queue, order("tpu")).await;
    assert!(!queue.refresh_gauges(period, 20).await.unwrap());
    let again = queue.stored_gauges().await.unwrap().unwrap();
    assert_eq!(&again.figures, f);
    // The next period's turn sees the new order.
    turn_taken(&queue, 61.0, true).await;
    assert!(queue.refresh_gauges(period, 20).await.unwrap());
    let next = queue.stored_gauges().await.unwrap().unwrap();
    assert_eq!(next.figures.statuses.get("PENDING"), Some(&4));
}

#[tokio::test]
async fn a_turn_taken_and_never_computed_passes_on_after_four_periods() {
    let queue = Queue::new(fresh_pool(4).await);
    let period = Duration::from_secs(60);
    assert!(queue.refresh_gauges(period, 20).await.unwrap());
    for (ago, computed, free) in [
        (30.0, true, false),
        (61.0, true, true),
        (61.0, false, false),
        (200.0, false, false),
        (241.0, false, true),
    ] {
        turn_taken(&queue, ago, computed).await;
        assert_eq!(
            queue.refresh_gauges(period, 20).await.unwrap(),
            free,
            "a turn taken {ago} s ago, computed: {computed}"
        );
    }
}

#[tokio::test]
async fn a_short_period_is_never_taken_over_before_a_minute_and_a_failed_turn_is_given_back() {
    let queue = Queue::new(fresh_pool(4).await);
    let period = Duration::from_secs(1);
    for (ago, free) in [(30.0, false), (59.0, false), (61.0, true)] {
        turn_taken(&queue, ago, false).await;
        assert_eq!(
            queue.refresh_gauges(period, 20).await.unwrap(),
            free,
            "a 1 s turn taken {ago} s ago, never computed"
        );
    }
    // A computation that fails (here: the statement it stores with is refused) gives the
    // turn back, so the next ask computes without waiting out four periods.
    let period = Duration::from_secs(60);
    turn_taken(&queue, 61.0, true).await;
    sqlx::query(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'refused'; END $$",
    )
    .execute(&queue.pool)
    .await
    .unwrap();
    sqlx::query(
        "CREATE TRIGGER refuse BEFORE UPDATE ON gauge_snapshot FOR EACH ROW \
         WHEN (NEW.computed_at IS DISTINCT FROM OLD.computed_at) EXECUTE FUNCTION refuse()",
    )
    .execute(&queue.pool)
    .await
    .unwrap();
    assert!(queue.refresh_gauges(period, 20).await.is_err());
    sqlx::query("DROP TRIGGER refuse ON gauge_snapshot")
        .execute(&queue.pool)
        .await
        .unwrap();
    assert!(
        queue.refresh_gauges(period, 20).await.unwrap(),
        "the failed turn was given back"
    );
}

#[tokio::test]
async fn figures_are_never_stored_over_those_of_a_later_snapshot() {
    let queue = Queue::new(fresh_pool(4).await);
    let later = GaugeFigures {
        unclassified: 2,
        ..GaugeFigures::default()
    };
    let earlier = GaugeFigures {
        unclassified: 1,
        ..GaugeFigures::default()
    };
    let now = Utc::now();
    for (figures, as_of) in [
        (&later, now),
        (&earlier, now - chrono::Duration::seconds(5)),
    ] {
        sqlx::query(sql::STORE_GAUGES)
            .bind(Json(figures))
            .bind(as_of)
            .execute(&queue.pool)
            .await
            .unwrap();
    }
    let stored = queue.stored_gauges().await.unwrap().unwrap();
    assert_eq!(stored.figures, later);
}

#[tokio::test]
async fn groups_past_the_cut_are_counted_unclassified() {
    let queue = Queue::new(fresh_pool(4).await);
    for (label, n) in [("a", 3), ("b", 2), ("c", 1)] {
        for _ in 0..n {
            create_order(&queue, order(label)).await;
        }
    }
    let mut conn = queue.pool.acquire().await.unwrap();
    for (cut, classified, unclassified) in [(3, 6, 0), (2, 5, 1), (1, 3, 3)] {
        let (by_reason, rest) = waiting_by_reason(&mut conn, cut).await.unwrap();
        let counted: i64 = by_reason.values().map(|c| c.orders).sum();
        assert_eq!((counted, rest), (classified, unclassified), "cut at {cut}");
    }
}
