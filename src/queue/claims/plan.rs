//! The claim's plan, held to its shape: claim-next walks `work_orders_handout` in hand-out
//! order (priority, then age), or while tenants compete their turns and `work_orders_turn`
//! (`queue::turns`), and stops at the first eligible order, whatever the backlog. When the eligibility rule
//! sat in the claim as top-level conditions, the planner turned its targeting disjuncts into a
//! BitmapOr over the `work_orders_target_*` GIN indexes and sorted every eligible order to hand
//! out one; the HTTP path fell from 0.70 to 0.17 of the SQL ceiling and no test noticed
//! (issue #34). These tests read the plan PostgreSQL chooses with 10,000 eligible orders, for
//! the statement `PREPARE`d as sqlx runs it, so the pool's `plan_cache_mode` decides, and fail
//! on a sort or a bitmap scan of the eligible orders (`EXPLAIN`); and, running the statement
//! (`EXPLAIN ANALYZE`), on a fair claim that reads every turn or a list page that reads every
//! row.

use uuid::Uuid;

use super::super::{cursor, sql};
use crate::testing::fresh_pool;

/// The tables a plan node reads, itself or below it.
fn tables_under(plan: &serde_json::Value, out: &mut Vec<String>) {
    if let Some(table) = plan["Relation Name"].as_str() {
        out.push(table.to_string());
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        tables_under(child, out);
    }
}

/// The node types of a JSON plan, depth first; an index scan with its index
/// (`Index Scan using work_orders_handout`), a sequential scan with its table (`Seq Scan on
/// work_orders`), a sort with the tables below it (`Sort over work_orders`).
fn node_types(plan: &serde_json::Value, out: &mut Vec<String>) {
    if let Some(t) = plan["Node Type"].as_str() {
        match (plan["Index Name"].as_str(), plan["Relation Name"].as_str()) {
            (Some(index), _) => out.push(format!("{t} using {index}")),
            (None, Some(table)) if t == "Seq Scan" => out.push(format!("{t} on {table}")),
            // A bitmap of the primary key is a lookup of rows already chosen (the claimed
            // orders' update), not a read of the eligible ones.
            _ if t == "Bitmap Heap Scan"
                && plan["Plans"].as_array().is_some_and(|children| {
                    children
                        .iter()
                        .all(|c| c["Index Name"].as_str() == Some("work_orders_pkey"))
                }) =>
            {
                out.push("Bitmap Heap Scan of work_orders_pkey".to_string());
            }
            _ if t == "Sort" => {
                let mut tables = Vec::new();
                tables_under(plan, &mut tables);
                out.push(format!("Sort over {}", tables.join(" ")));
            }
            _ => out.push(t.to_string()),
        }
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        node_types(child, out);
    }
}

/// A fresh database with 10,000 eligible orders spread over `tenants` tenants, vacuumed and
/// analyzed, and the id of an agent that may take them all.
async fn backlog(tenants: i32) -> (sqlx::PgPool, Uuid) {
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
    let agent = add_agent(&pool, "planner").await;
    sqlx::query("VACUUM ANALYZE").execute(&pool).await.unwrap();
    (pool, agent)
}

/// A new agent named `name`, labelled `plan` (it may take every order of [`backlog`]); its id.
async fn add_agent(pool: &sqlx::PgPool, name: &str) -> Uuid {
    let agent = Uuid::new_v4();
    sqlx::query("INSERT INTO agents (id, name, labels) VALUES ($1, $2, ARRAY['plan'])")
        .bind(agent)
        .bind(name)
        .execute(pool)
        .await
        .unwrap();
    agent
}

/// `EXPLAIN (<options>, FORMAT JSON) EXECUTE` of `statement` `PREPARE`d on `conn` (so its
/// plan is the one the connection's `plan_cache_mode` gives it), with `arguments` as SQL
/// literals; the whole JSON answer.
async fn explain_prepared(
    conn: &mut sqlx::PgConnection,
    statement: &str,
    options: &str,
    arguments: &str,
) -> serde_json::Value {
    sqlx::raw_sql(&format!("PREPARE explained AS {statement}"))
        .execute(&mut *conn)
        .await
        .unwrap();
    let (plan,): (serde_json::Value,) = sqlx::query_as(&format!(
        "EXPLAIN ({options}, FORMAT JSON) EXECUTE explained({arguments})"
    ))
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    sqlx::raw_sql("DEALLOCATE explained")
        .execute(&mut *conn)
        .await
        .unwrap();
    plan
}

/// `EXPLAIN (<options>, FORMAT JSON)` of the claim `statement` for `agent`, asking for
/// `claims` orders; its top plan node. With `ANALYZE` among the options the claim runs. The
/// statement runs `PREPARE`d, as sqlx runs it, so the plan is the one the pool's
/// `plan_cache_mode` gives it (generic): an `EXPLAIN` with bound parameters is planned for
/// their values.
async fn explain(
    pool: &sqlx::PgPool,
    agent: Uuid,
    statement: &str,
    options: &str,
    claims: usize,
) -> serde_json::Value {
    let ids: Vec<String> = (0..claims).map(|_| Uuid::new_v4().to_string()).collect();
    let mut conn = pool.acquire().await.unwrap();
    let arguments = format!(
        "'{agent}'::uuid, '{{{}}}'::uuid[], NULL, '{{}}'::text[]",
        ids.join(",")
    );
    let plan = explain_prepared(&mut conn, statement, options, &arguments).await;
    plan[0]["Plan"].clone()
}

/// The plan of `statement` with 10,000 eligible orders spread over `tenants` tenants.
async fn plan_of(statement: &str, tenants: i32) -> Vec<String> {
    let (pool, agent) = backlog(tenants).await;
    let plan = explain(&pool, agent, statement, "COSTS ON", 4).await;
    let mut nodes = Vec::new();
    node_types(&plan, &mut nodes);
    nodes
}

/// A node that reads every eligible order (or every turn) to hand out a few: a sort over
/// work_orders, a bitmap scan, a sequential scan of work_orders; and with `turns_too`, a
/// sequential scan of tenant_turns.
fn reads_everything(node: &str, turns_too: bool) -> bool {
    let sorts_orders = node.starts_with("Sort over") && node.split(' ').any(|t| t == "work_orders");
    sorts_orders
        || node == "BitmapOr"
        || node == "Bitmap Heap Scan"
        || node == "Seq Scan on work_orders"
        || (turns_too && node == "Seq Scan on tenant_turns")
}

fn assert_ordered_walk(name: &str, nodes: &[String], index: &str) {
    if let Some(bad) = nodes.iter().find(|n| reads_everything(n, true)) {
        panic!(
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

/// A claim while tenants compete, by its plan's `nodes`: a probe of `tenant_turns_served` per
/// turn taken (least recently served first), each tenant's orders through `work_orders_turn`.
fn assert_turn_walk(name: &str, nodes: &[String]) {
    assert_ordered_walk(name, nodes, "work_orders_turn");
    assert!(
        nodes
            .iter()
            .any(|n| n.ends_with(" Scan using tenant_turns_served")),
        "{name}: no walk of tenant_turns_served (least recently served first) in {nodes:?}"
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
        assert_turn_walk(name, &plan_of(statement, 1000).await);
        // Two tenants, each with half the backlog: still a walk, whichever index it takes.
        let nodes = plan_of(statement, 2).await;
        assert!(
            nodes
                .iter()
                .any(|n| n == "Index Scan using work_orders_turn"
                    || n == "Index Scan using work_orders_handout"),
            "{name} with two tenants: no ordered walk in {nodes:?}"
        );
        // Two turns are read as a table is (a sort of two rows): what matters is the orders.
        if let Some(bad) = nodes.iter().find(|n| reads_everything(n, false)) {
            panic!("{name} with two tenants: a {bad} in {nodes:?}");
        }
    }
}

/// Every pooled connection plans generically (the plans above are the ones claims run) and
/// never compiles a statement with JIT, which cost a claim 60 ms when a large backlog's
/// estimate passed `jit_above_cost` (`serve::pool_options`).
#[tokio::test]
async fn pooled_connections_plan_generically_without_jit() {
    let pool = fresh_pool(1).await;
    for (setting, want) in [("plan_cache_mode", "force_generic_plan"), ("jit", "off")] {
        let (got,): (String,) = sqlx::query_as(&format!("SHOW {setting}"))
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(got, want, "{setting}");
    }
}

/// The rows each scan of `table` read, as `(node, rows)`: the rows it returned and those its
/// filter removed, over all its loops (`EXPLAIN ANALYZE`'s per-loop averages times the loops).
fn rows_read(plan: &serde_json::Value, table: &str, out: &mut Vec<(String, f64)>) {
    if plan["Relation Name"].as_str() == Some(table) {
        let per_loop = plan["Actual Rows"].as_f64().unwrap_or(0.0)
            + plan["Rows Removed by Filter"].as_f64().unwrap_or(0.0);
        let node = format!(
            "{} using {}",
            plan["Node Type"].as_str().unwrap_or("?"),
            plan["Index Name"].as_str().unwrap_or("-")
        );
        out.push((
            node,
            per_loop * plan["Actual Loops"].as_f64().unwrap_or(1.0),
        ));
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        rows_read(child, table, out);
    }
}

/// A fair claim reads the turns it hands out from and steps past, not every turn: with 1,000
/// tenants, a claim that takes from the first turn reads a handful. The look for idle turns
/// once tested "no pick, or before the first pick" as a filter over every live turn (the OR
/// kept its bound out of the index scan): 3.4 of a claim's 4.1 ms at 10,000 tenants, half the
/// fair claims' throughput (bench/README.md "Fair share"). A shape test could not see it: the
/// plan was an index scan, its bound a filter.
#[tokio::test]
async fn a_fair_claim_reads_the_turns_it_passes_not_every_turn() {
    for (name, statement) in [
        ("claim_next_fair.sql", sql::CLAIM_NEXT_FAIR),
        ("claim_next_capped_fair.sql", sql::CLAIM_NEXT_CAPPED_FAIR),
    ] {
        let (pool, agent) = backlog(1000).await;
        for claims in [1, 4] {
            let plan = explain(&pool, agent, statement, "ANALYZE", claims).await;
            let mut scans = Vec::new();
            rows_read(&plan, "tenant_turns", &mut scans);
            assert!(!scans.is_empty(), "{name}: no scan of tenant_turns");
            let most = scans.iter().map(|(_, rows)| *rows).fold(0.0, f64::max);
            assert!(
                most <= 16.0,
                "{name}, {claims} claims: a scan of tenant_turns read {most} of 1,000 turns: \
                 {scans:?}"
            );
        }
    }
}

/// The rows each list page reads, planned as [`cursor::page_transaction`] plans it: a page of
/// 50 from the start and one from a cursor 5,000 rows in, of 10,000 active orders (and as many
/// finished ones for the log). Each must walk its index from the cursor and stop after the page.
/// Planned generically, as every pooled connection plans, each read all 10,000 rows (a
/// parallel sequential scan and a sort; 67 ms a page at 200,000): the cursor and the optional
/// filters (`$n IS NULL OR …`) stayed filters. The statements run as `PREPARE`d ones, as sqlx
/// runs them, so the plan cache and its `plan_cache_mode` decide: an `EXPLAIN` with bound
/// parameters is planned for their values whatever the mode, and would not see it.
#[tokio::test]
async fn a_list_page_reads_its_page_not_the_table() {
    let (pool, agent) = backlog(1).await;
    sqlx::query(
        "INSERT INTO work_order_log (id, work_type, yaml_content, max_retries, backoff_seconds, \
         claim_timeout_seconds, max_reclaims, targeting, outcome, retry_count, reclaim_count, \
         source, ended_by, created_at, completed_at) \
         SELECT gen_random_uuid(), 'custom', 'x', 3, 60, 3600, 5, '{}', 'succeeded', 0, 0, \
           'api', 'agent', now(), now() - make_interval(secs => g) \
         FROM generate_series(1, 10000) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE").execute(&pool).await.unwrap();
    // The row 5,000 in, in each list's order, as SQL literals.
    let (order_cursor,): (String,) = sqlx::query_as(
        "SELECT quote_literal(created_at) || '::timestamptz, ' || quote_literal(id) || '::uuid' \
         FROM work_orders ORDER BY created_at, id OFFSET 5000 LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let (log_cursor,): (String,) = sqlx::query_as(
        "SELECT quote_literal(completed_at) || '::timestamptz, ' || quote_literal(id) || '::uuid' \
         FROM work_order_log ORDER BY completed_at DESC, id DESC OFFSET 5000 LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let first = "NULL, NULL".to_string();
    for (orders_at, log_at) in [(&first, &first), (&order_cursor, &log_cursor)] {
        let pages = [
            (
                "list_work_orders.sql",
                sql::LIST_WORK_ORDERS,
                "work_orders",
                format!("NULL, NULL, {orders_at}, 50, NULL, NULL, NULL, NULL, NULL"),
            ),
            (
                "pending_for_agent.sql",
                sql::PENDING_FOR_AGENT,
                "work_orders",
                format!("'{agent}'::uuid, '{{}}'::text[], {orders_at}, 50"),
            ),
            (
                "list_log.sql",
                sql::LIST_LOG,
                "work_order_log",
                format!("NULL, NULL, NULL, {log_at}, 50, NULL, NULL, NULL, NULL, NULL"),
            ),
        ];
        for (name, statement, table, arguments) in pages {
            let mut tx = cursor::page_transaction(&pool).await.unwrap();
            let plan = explain_prepared(&mut tx, statement, "ANALYZE", &arguments).await;
            tx.commit().await.unwrap();
            let mut scans = Vec::new();
            rows_read(&plan[0]["Plan"], table, &mut scans);
            assert!(!scans.is_empty(), "{name}: no scan of {table}");
            let most = scans.iter().map(|(_, rows)| *rows).fold(0.0, f64::max);
            assert!(
                most <= 100.0,
                "{name} ({arguments}): a scan of {table} read {most} of 10,000 rows for a page \
                 of 50: {scans:?}"
            );
        }
    }
}

/// The plan node `name` (a CTE's, `CTE target`) under `plan`.
fn subplan<'p>(plan: &'p serde_json::Value, name: &str) -> Option<&'p serde_json::Value> {
    if plan["Subplan Name"].as_str() == Some(name) {
        return Some(plan);
    }
    plan["Plans"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|child| subplan(child, name))
}

/// The node types of a group claim's walk (`sql/claim_next_group.sql`,
/// `sql/claim_next_group_fair.sql`: its `target` and, while tenants compete, `turns` CTEs) for
/// the backlog's agent and a second of the same profile, with 10,000 eligible orders spread over
/// `tenants` tenants; with `ANALYZE` the claim runs: also the rows each scan of `tenant_turns`
/// read. The rest of the statement reads the agents (their rows, sorted for the answer, and two
/// GIN probes each for orders naming them), not the eligible orders.
async fn group_walk(statement: &str, tenants: i32, options: &str) -> (Vec<String>, Vec<f64>) {
    let (pool, agent) = backlog(tenants).await;
    let second = add_agent(&pool, "planner-2").await;
    let mut conn = pool.acquire().await.unwrap();
    let arguments = format!(
        "'{{{agent},{second}}}'::uuid[], '{{{},{}}}'::uuid[], NULL, '{{}}'::text[]",
        Uuid::new_v4(),
        Uuid::new_v4()
    );
    let plan = explain_prepared(&mut conn, statement, options, &arguments).await;
    let mut nodes = Vec::new();
    for cte in ["CTE target", "CTE turns"] {
        if let Some(walk) = subplan(&plan[0]["Plan"], cte) {
            node_types(walk, &mut nodes);
        }
    }
    let mut scans = Vec::new();
    rows_read(&plan[0]["Plan"], "tenant_turns", &mut scans);
    (nodes, scans.into_iter().map(|(_, rows)| rows).collect())
}

/// A group claim walks as the single claim does: the hand-out index with one tenant; while
/// tenants compete, the turns one probe at a time and each tenant's orders in order, reading the
/// turns it passes, not every turn.
#[tokio::test]
async fn group_claims_walk_in_hand_out_order() {
    let (nodes, _) = group_walk(sql::CLAIM_NEXT_GROUP, 1, "COSTS ON").await;
    assert_ordered_walk("claim_next_group.sql", &nodes, "work_orders_handout");
    let name = "claim_next_group_fair.sql";
    let (nodes, _) = group_walk(sql::CLAIM_NEXT_GROUP_FAIR, 1000, "COSTS ON").await;
    assert_turn_walk(name, &nodes);
    let (_, scans) = group_walk(sql::CLAIM_NEXT_GROUP_FAIR, 1000, "ANALYZE").await;
    let most = scans.iter().copied().fold(0.0, f64::max);
    assert!(
        !scans.is_empty() && most <= 16.0,
        "{name}: a scan of tenant_turns read {most} of 1,000 turns: {scans:?}"
    );
}

/// Once claims have churned through `work_order_claims` and a vacuum replanned the statements
/// that end a claim, each finds the claim row through an index (the order's primary key, or
/// the agent's claims), not by reading the table. A vacuum that gave back the table's empty
/// tail left it a few pages long, where a sequential scan is the cheaper plan, and the generic
/// plan made then read every page the table grew to until the next vacuum: with the
/// foreign-key cascade's look-up, that cost one agent of 16 slots a third of its throughput
/// over 100,000 orders (the migration claims_without_cascade, bench/README.md, issue #34).
#[tokio::test]
async fn a_claim_is_ended_through_an_index_after_churn() {
    let pool = fresh_pool(1).await;
    // Five thousand claims, come and gone, as a busy minute between two vacuums leaves them.
    sqlx::query(
        "INSERT INTO work_order_claims (work_order_id, claim_id, agent_id, claimed_at, deadline) \
         SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), now(), now() \
         FROM generate_series(1, 5000)",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("DELETE FROM work_order_claims")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("VACUUM ANALYZE work_order_claims")
        .execute(&pool)
        .await
        .unwrap();
    let (order, agent) = (Uuid::new_v4(), Uuid::new_v4());
    let one = format!("'{order}'::uuid, '{agent}'::uuid, NULL::uuid, NULL::text");
    let many = format!(
        "ARRAY['{order}']::uuid[], ARRAY['{agent}']::uuid[], ARRAY[NULL]::uuid[], \
         ARRAY[NULL]::text[]"
    );
    let finish = format!(
        "'{order}'::uuid, 'failed', NULL, NULL, '{agent}'::uuid, NULL::uuid, NULL::timestamptz, \
         'agent'"
    );
    let mut conn = pool.acquire().await.unwrap();
    for (name, statement, arguments) in [
        ("complete_success", sql::COMPLETE_SUCCESS, one),
        ("complete_success_many", sql::COMPLETE_SUCCESS_MANY, many),
        ("finish_order", sql::FINISH_ORDER, finish),
    ] {
        let plan = explain_prepared(&mut conn, statement, "COSTS ON", &arguments).await;
        let mut nodes = Vec::new();
        node_types(&plan[0]["Plan"], &mut nodes);
        assert!(
            !nodes.iter().any(|n| n == "Seq Scan on work_order_claims"),
            "{name} reads every claim row to end one: {nodes:?}"
        );
        assert!(
            nodes
                .iter()
                .any(|n| n.starts_with("Index Scan using work_order_claims_")),
            "{name} does not find the claim through an index: {nodes:?}"
        );
    }
}
