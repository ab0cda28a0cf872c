//! The claim's plan, held to its shape: claim-next walks `work_orders_handout` in hand-out
//! order (priority, then age), or while tenants compete their turns and `work_orders_turn`
//! (`queue::turns`), and stops at the first eligible order, whatever the backlog. When the eligibility rule
//! sat in the claim as top-level conditions, the planner turned its targeting disjuncts into a
//! BitmapOr over the `work_orders_target_*` GIN indexes and sorted every eligible order to hand
//! out one; the HTTP path fell from 0.70 to 0.17 of the SQL ceiling and no test noticed
//! (issue #34). These tests read the plan PostgreSQL chooses (`EXPLAIN`, the statement is not
//! run) with 10,000 eligible orders and fail on a sort or a bitmap scan.

use uuid::Uuid;

use super::super::sql;
use crate::testing::fresh_pool;

/// The node types of a JSON plan, depth first; an index scan with its index
/// (`Index Scan using work_orders_handout`), a sequential scan with its table (`Seq Scan on
/// work_orders`).
fn node_types(plan: &serde_json::Value, out: &mut Vec<String>) {
    if let Some(t) = plan["Node Type"].as_str() {
        match (plan["Index Name"].as_str(), plan["Relation Name"].as_str()) {
            (Some(index), _) => out.push(format!("{t} using {index}")),
            (None, Some(table)) if t == "Seq Scan" => out.push(format!("{t} on {table}")),
            _ => out.push(t.to_string()),
        }
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        node_types(child, out);
    }
}

/// The plan of `statement` with 10,000 eligible orders spread over `tenants` tenants.
async fn plan_of(statement: &str, tenants: i32) -> Vec<String> {
    let pool = fresh_pool(2).await;
    sqlx::query(
        "INSERT INTO work_orders (id, work_type, yaml_content, max_retries, backoff_seconds, \
         claim_timeout_seconds, max_reclaims, target_labels, status, created_at, tenant) \
         SELECT gen_random_uuid(), 'custom', 'x', 3, 60, 3600, 5, ARRAY['plan'], 'PENDING', \
           now() - make_interval(secs => g), 't' || (g % $1) FROM generate_series(1, 10000) g",
    )
    .bind(tenants)
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

fn assert_ordered_walk(name: &str, nodes: &[String], index: &str) {
    for bad in [
        "Sort",
        "BitmapOr",
        "Bitmap Heap Scan",
        "Seq Scan on work_orders",
        "Seq Scan on tenant_turns",
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
            .any(|n| n == &format!("Index Scan using {index}")),
        "{name}: no walk of {index} in hand-out order in {nodes:?}"
    );
}

#[tokio::test]
async fn claim_next_walks_the_handout_index_in_order() {
    assert_ordered_walk(
        "claim_next.sql",
        &plan_of(sql::CLAIM_NEXT, 1).await,
        "work_orders_handout",
    );
}

#[tokio::test]
async fn the_capped_claim_walks_the_handout_index_in_order() {
    assert_ordered_walk(
        "claim_next_capped.sql",
        &plan_of(sql::CLAIM_NEXT_CAPPED, 1).await,
        "work_orders_handout",
    );
}

/// While tenants compete: a probe of `tenant_turns_served` per turn taken, and each tenant's
/// orders through `work_orders_turn`, never a sort of the turns or of the orders.
#[tokio::test]
async fn the_fair_claims_walk_turns_then_each_tenants_orders_in_order() {
    for (name, statement) in [
        ("claim_next_fair.sql", sql::CLAIM_NEXT_FAIR),
        ("claim_next_capped_fair.sql", sql::CLAIM_NEXT_CAPPED_FAIR),
    ] {
        let nodes = plan_of(statement, 1000).await;
        assert_ordered_walk(name, &nodes, "work_orders_turn");
        assert!(
            nodes
                .iter()
                .any(|n| n.ends_with(" Scan using tenant_turns_served")),
            "{name}: no walk of tenant_turns_served (least recently served first) in {nodes:?}"
        );
    }
}
