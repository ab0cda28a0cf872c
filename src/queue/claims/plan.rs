//! The claim's plan, held to its shape: claim-next walks `work_orders_handout` in hand-out
//! order (priority, then age) and stops at the first eligible order, whatever the backlog. When the eligibility rule
//! sat in the claim as top-level conditions, the planner turned its targeting disjuncts into a
//! BitmapOr over the `work_orders_target_*` GIN indexes and sorted every eligible order to hand
//! out one; the HTTP path fell from 0.70 to 0.17 of the SQL ceiling and no test noticed
//! (issue #34). These tests read the plan PostgreSQL chooses (`EXPLAIN`, the statement is not
//! run) with 10,000 eligible orders and fail on a sort or a bitmap scan.

use uuid::Uuid;

use super::super::sql;
use crate::testing::fresh_pool;

/// The node types of a JSON plan, depth first; an index scan with its index
/// (`Index Scan using work_orders_handout`).
fn node_types(plan: &serde_json::Value, out: &mut Vec<String>) {
    if let Some(t) = plan["Node Type"].as_str() {
        match plan["Index Name"].as_str() {
            Some(index) => out.push(format!("{t} using {index}")),
            None => out.push(t.to_string()),
        }
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        node_types(child, out);
    }
}

async fn plan_of(statement: &str) -> Vec<String> {
    let pool = fresh_pool(2).await;
    sqlx::query(
        "INSERT INTO work_orders (id, work_type, yaml_content, max_retries, backoff_seconds, \
         claim_timeout_seconds, max_reclaims, target_labels, status, created_at) \
         SELECT gen_random_uuid(), 'custom', 'x', 3, 60, 3600, 5, ARRAY['plan'], 'PENDING', \
           now() - make_interval(secs => g) FROM generate_series(1, 10000) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    let agent = Uuid::new_v4();
    sqlx::query("INSERT INTO agents (id, name, labels) VALUES ($1, 'planner', ARRAY['plan'])")
        .bind(agent)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("VACUUM ANALYZE").execute(&pool).await.unwrap();
    let (plan,): (serde_json::Value,) =
        sqlx::query_as(&format!("EXPLAIN (FORMAT JSON) {statement}"))
            .bind(agent)
            .bind(vec![Uuid::new_v4(); 4])
            .bind(None::<i32>)
            .bind(Vec::<String>::new())
            .fetch_one(&pool)
            .await
            .unwrap();
    let mut nodes = Vec::new();
    node_types(&plan[0]["Plan"], &mut nodes);
    nodes
}

fn assert_ordered_walk(name: &str, nodes: &[String]) {
    for bad in [
        "Sort",
        "BitmapOr",
        "Bitmap Heap Scan",
        "Seq Scan on work_orders",
    ] {
        assert!(
            !nodes.iter().any(|n| n == bad),
            "{name}: the claim's plan has a {bad}, so it reads every eligible order to hand out \
             a few: {nodes:?}"
        );
    }
    assert!(
        nodes
            .iter()
            .any(|n| n == "Index Scan using work_orders_handout"),
        "{name}: no walk of work_orders_handout (priority, then age) in {nodes:?}"
    );
}

#[tokio::test]
async fn claim_next_walks_the_handout_index_in_order() {
    assert_ordered_walk("claim_next.sql", &plan_of(sql::CLAIM_NEXT).await);
}

#[tokio::test]
async fn the_capped_claim_walks_the_handout_index_in_order() {
    assert_ordered_walk(
        "claim_next_capped.sql",
        &plan_of(sql::CLAIM_NEXT_CAPPED).await,
    );
}
