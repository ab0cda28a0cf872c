//! The database failing over under a running server (issue #41, docs/design.md §5): the address
//! the server connects to leads for a while to a read-only standby (a demoted primary), then to a
//! promoted one. The server never holds a connection to the standby, answers `503` (never `500`)
//! meanwhile, says why in `/readyz`, and goes on by itself once the standby is promoted. And the
//! database vanishing under statements in flight, nothing closed: they are answered `503` and
//! their connections freed (`pullman::db_keepalive`).

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::eventually;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_behind_the_address_is_refused_until_promoted_then_work_goes_on() {
    let own = support::own_postgres::OwnPostgres::new();
    let pg = own.start().await;
    let s = own.server(&pg).await;
    let (agent, token) = s
        .agent(json!({"name": "failover", "labels": ["failover"]}))
        .await;
    let before = s.order(support::configmap_order("failover")).await;

    // The same data directory and port, now a hot standby: it answers, read-only.
    pg.stop().await.unwrap();
    std::fs::write(own.data_dir().join("standby.signal"), "").unwrap();
    let standby = own.start().await;

    let readyz = |s: &support::TestServer| {
        let (http, url) = (s.http.clone(), s.url("/readyz"));
        async move {
            let r = http.get(url).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    eventually(30, "/readyz to name the standby", || async {
        let (st, body) = readyz(&s).await;
        (st == 503 && body.contains("read-only") && body.contains("standby")).then_some(())
    })
    .await;
    for _ in 0..5 {
        let (st, v) = s
            .admin_post("/api/v1/work-orders", support::configmap_order("failover"))
            .await;
        assert_eq!(st, 503, "a create against a standby: {v}");
        assert_eq!(v["error"]["code"], "database_unavailable", "{v}");
        let (st, v) = s
            .claim_next(&agent, &token, Some(json!({"max_wait_seconds": 0})))
            .await;
        assert_eq!(st, 503, "a claim against a standby: {v}");
    }

    // A connection that reaches the standby is never handed out: the pool's own check, for an
    // address that leads there before anything noticed an outage.
    let refused = pullman::serve::pool_options(1, &standby.options())
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(standby.options())
        .await;
    assert!(refused.is_err(), "a pool connected to a standby");

    // Promoted in place, as CloudNativePG's new primary: no restart of the server.
    let mut conn = sqlx::ConnectOptions::connect(&standby.options())
        .await
        .unwrap();
    let (promoted,): (bool,) = sqlx::query_as("SELECT pg_promote(true, 30)")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(promoted, "pg_promote");
    eventually(
        30,
        "the server to answer again on the promoted primary",
        || async {
            let (st, _) = readyz(&s).await;
            (st == 200).then_some(())
        },
    )
    .await;
    let (st, v): (u16, Value) = s
        .claim_next(&agent, &token, Some(json!({"max_wait_seconds": 5})))
        .await;
    assert_eq!(st, 200, "claim after the promotion: {v}");
    assert_eq!(
        v["id"],
        before.as_str(),
        "the order from before the failover"
    );
    let after = s.order(support::configmap_order("failover")).await;
    assert_ne!(after, before);
}

/// PgBouncer (Debian's `pgbouncer`) in front of the test PostgreSQL in `pool_mode`, on a free
/// port, as the `postgres` user when the tests run as root (it refuses root). Killed on drop.
struct Bouncer {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Bouncer {
    fn start(pool_mode: &str) -> Bouncer {
        use std::os::unix::process::CommandExt;
        let bin = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("pgbouncer is not installed (apt install pgbouncer)");
        let upstream = reqwest::Url::parse(support::server_url()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let port = support::free_port();
        std::fs::write(dir.path().join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        let ini = dir.path().join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n* = host={} port={}\n[pgbouncer]\nlisten_addr = 127.0.0.1\n\
                 listen_port = {port}\nunix_socket_dir =\nauth_type = trust\nauth_file = {}\n\
                 pool_mode = {pool_mode}\nignore_startup_parameters = extra_float_digits,options\n",
                upstream.host_str().unwrap(),
                upstream.port().unwrap(),
                dir.path().join("users.txt").display()
            ),
        )
        .unwrap();
        let mut cmd = std::process::Command::new(bin);
        cmd.arg(&ini).stdout(std::process::Stdio::null());
        if nix::unistd::Uid::effective().is_root() {
            let user = nix::unistd::User::from_name("postgres").unwrap().unwrap();
            std::os::unix::fs::chown(dir.path(), Some(user.uid.as_raw()), None).unwrap();
            cmd.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        }
        let child = cmd.spawn().expect("starting pgbouncer");
        Bouncer {
            child,
            port,
            _dir: dir,
        }
    }

    /// `url` (a database of the test PostgreSQL) through this PgBouncer.
    fn through(&self, url: &str) -> String {
        let mut url = reqwest::Url::parse(url).unwrap();
        url.set_port(Some(self.port)).unwrap();
        url.to_string()
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `pullman serve` on `database_url` until it exits or 60 s pass; its exit and stderr.
fn serve_until_exit(database_url: &str) -> (Option<std::process::ExitStatus>, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(support::pullman_bin())
        .args(["serve", "--controller", "off", "--listen"])
        .arg(format!("127.0.0.1:{}", support::free_port()))
        .current_dir(dir.path())
        .env("DATABASE_URL", database_url)
        .env("NO_COLOR", "1")
        .env_remove("PULLMAN_ADMIN_TOKEN")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_a_transaction_mode_pooler_and_names_it() {
    let db = support::fresh_database_url().await;
    let bouncer = Bouncer::start("transaction");
    let url = bouncer.through(&db);
    let (status, stderr) = tokio::task::spawn_blocking(move || serve_until_exit(&url))
        .await
        .unwrap();
    let status = status.expect("serve through a transaction-mode pooler kept running");
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("transaction-mode pooler") && stderr.contains("notification"),
        "the refusal names the cause:\n{stderr}"
    );
    // Through the same pooler in session mode, LISTEN works and serve starts.
    let session = Bouncer::start("session");
    let dir = tempfile::tempdir().unwrap();
    let serve = support::serve::Serve::start_on(
        dir.path(),
        &session.through(&db),
        std::process::Stdio::null(),
    )
    .await;
    let r = reqwest::get(serve.url("/readyz")).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

/// While a failover moves the Service, its address can lead for a moment to something that is
/// not PostgreSQL: with no rules for it, to the default route, where this CI machine's network
/// answers any port with `HTTP/1.1 400` (CI saw three `500`s from it, issue #41). Such a peer is
/// an outage, `503` and retried, not a server error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_is_not_postgresql_is_an_outage_not_a_server_error() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = answered.clone();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 8];
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            if socket.read_exact(&mut request).await.is_ok() {
                let _ = socket
                    .write_all(b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
                    .await;
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    let url = format!("postgres://pullman:secret@127.0.0.1:{port}/pullman");
    let options: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
    let pool = pullman::serve::pool_options(4, &options)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(options);
    let error = sqlx::query("SELECT 1").execute(&pool).await.unwrap_err();
    assert!(
        answered.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "the peer never answered: {error}"
    );
    assert!(
        matches!(&error, sqlx::Error::Protocol(m) if m.contains("SSLRequest")),
        "the peer's HTTP answer should fail the start-up handshake, got {error:?}"
    );
    assert!(
        pullman::queue::database_unavailable(&error),
        "{error} should count as the database being unavailable (503), not a server error"
    );
    assert!(matches!(
        pullman::queue::QueueError::from(error),
        pullman::queue::QueueError::Unavailable(_)
    ));
}

/// A server that vanishes under statements in flight, nothing closed (a lost node, a pod's network
/// torn down mid-failover): sqlx sets no keepalive, so without `pullman::db_keepalive` each such
/// request waited forever and its pool slot with it. Three lists wait on a table lock, the path to
/// the database is cut, the lock is let go (its answers dropped on the way): each request is
/// answered `503` within the keepalive's bound, and once the path is back the pool, whose every
/// slot those three held, serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_when_the_database_vanishes_are_answered_and_their_connections_freed() {
    // The LISTEN connection holds one of the four.
    let Some((s, mut path, direct)) = server_behind_a_cut(4).await else {
        return;
    };
    s.order(support::configmap_order("vanished")).await;

    let mut locker = lock_orders(&direct).await;
    let lists: Vec<_> = (0..3)
        .map(|_| {
            let api = s.api.clone();
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let (status, body) = api.admin_get("/api/v1/work-orders").await;
                (status, body, started.elapsed())
            })
        })
        .collect();
    lists_waiting(&direct, 3).await;

    path.cut();
    sqlx::Executor::execute(&mut locker, "ROLLBACK")
        .await
        .unwrap();
    for list in lists {
        let (status, body, took) = tokio::time::timeout(Duration::from_secs(40), list)
            .await
            .expect("a request in flight was not answered within 40 s")
            .unwrap();
        support::assert_refused(status, &body, 503, "database_unavailable");
        assert!(took < Duration::from_secs(30), "answered after {took:?}");
        eprintln!("a request in flight through the cut answered 503 after {took:?}");
    }

    path.mend();
    lists_again(&s.api, "the pool serving again").await;
}

/// A database that acknowledges but answers nothing (a stopped server process, a proxy whose
/// server is gone): its kernel answers keepalive probes, so only `serve
/// --request-timeout-seconds` ends the wait. A list waiting on a table lock when the path
/// freezes is answered `503` at the bound, `/readyz` says not ready, and once the path thaws
/// `serve` answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_database_never_answers_is_answered_503_at_the_request_timeout() {
    use support::cut::Cut;
    let url = support::fresh_database_url().await;
    let direct: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
    let server = std::net::SocketAddr::from(([127, 0, 0, 1], direct.get_port()));
    let path = Cut::to(server).await;
    let through = url.replace(
        &format!(":{}/", direct.get_port()),
        &format!(":{}/", path.port),
    );
    assert_ne!(through, url, "the forwarder's port in the URL");
    let dir = tempfile::tempdir().unwrap();
    let serve = support::serve::Serve::over(
        &through,
        &["--request-timeout-seconds", "2"],
        &dir.path().join("serve.log"),
        "info",
    );
    support::serve::wait_ready(serve.port).await;
    let api = support::ApiClient::new(&serve.url(""));

    let mut locker = lock_orders(&direct).await;
    let list = {
        let api = api.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let answer = api.admin_get("/api/v1/work-orders").await;
            (answer, started.elapsed())
        })
    };
    lists_waiting(&direct, 1).await;

    path.freeze();
    sqlx::Executor::execute(&mut locker, "ROLLBACK")
        .await
        .unwrap();
    let ((status, body), took) = tokio::time::timeout(Duration::from_secs(20), list)
        .await
        .expect("a request the database never answered was not answered within 20 s")
        .unwrap();
    support::assert_refused(status, &body, 503, "database_unavailable");
    assert!(
        support::error_message(&body).contains("no answer within 2 s"),
        "{body}"
    );
    assert!(took < Duration::from_secs(10), "answered after {took:?}");
    let (status, _) = api.get("/readyz").await;
    assert_eq!(status, 503, "ready while the database answers nothing");

    path.thaw();
    lists_again(&api, "serve answering again").await;
}

/// Completes in flight when the database vanishes are answered `503` together, not one by one
/// behind the pool's acquire timeout (`queue::group_commit`). The server's pool reaches its
/// database through a path that is then cut, as in the test above, so nothing tells it of the
/// outage before 8 completes sent at once reach its group commit. Each is answered `503` once
/// keepalive ends the connections (about 10 s); retried one by one, each waited for a connection
/// through the cut path too, 5 s apiece here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completes_of_a_batch_that_meets_an_outage_are_all_answered_at_once() {
    let Some((s, mut path, _)) = server_behind_a_cut(12).await else {
        return;
    };
    let (agent, token) = s
        .agent(json!({"name": "batch-outage", "labels": ["batch-outage"]}))
        .await;
    for _ in 0..8 {
        s.order(support::configmap_order("batch-outage")).await;
    }
    let (status, claimed) = s
        .claim_next(&agent, &token, Some(json!({"max_orders": 8})))
        .await;
    assert_eq!(status, 200, "{claimed}");
    let claimed = claimed["orders"].as_array().unwrap().clone();
    assert_eq!(claimed.len(), 8, "{claimed:?}");

    path.cut();
    let started = std::time::Instant::now();
    let completes: Vec<_> = claimed
        .iter()
        .map(|o| {
            let (api, token) = (s.api.clone(), token.clone());
            let body = json!({"agent_id": agent, "claim_id": o["claim_id"], "success": true});
            let order = o["id"].as_str().unwrap().to_string();
            tokio::spawn(async move { api.complete(&order, &token, body).await })
        })
        .collect();
    for complete in completes {
        let (status, body) = tokio::time::timeout(Duration::from_secs(90), complete)
            .await
            .expect("a complete not answered within 90 s")
            .unwrap();
        support::assert_refused(status, &body, 503, "database_unavailable");
    }
    let took = started.elapsed();
    eprintln!("8 completes through the cut path answered 503 within {took:?}");
    assert!(
        took < Duration::from_secs(20),
        "8 completes answered after {took:?}: one by one behind the acquire timeout?"
    );
}

/// An in-process server whose pool of `max_connections` (acquire timeout 5 s) reaches a fresh
/// database through a [`Cut`](support::cut::Cut) path; also the path and the database's own
/// address. `None`, said on stderr, where this machine cannot cut (root and iptables; CI has
/// both).
async fn server_behind_a_cut(
    max_connections: u32,
) -> Option<(
    support::TestServer,
    support::cut::Cut,
    sqlx::postgres::PgConnectOptions,
)> {
    if !support::cut::Cut::possible() {
        eprintln!("skipped: cutting a connection needs root and iptables (CI runs as root)");
        return None;
    }
    let direct: sqlx::postgres::PgConnectOptions =
        support::fresh_database_url().await.parse().unwrap();
    let server = std::net::SocketAddr::from(([127, 0, 0, 1], direct.get_port()));
    let path = support::cut::Cut::to(server).await;
    let through = direct.clone().port(path.port);
    let pool = pullman::serve::pool_options(max_connections, &through)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(through)
        .await
        .unwrap();
    Some((support::TestServer::start_on(pool, 8).await, path, direct))
}

/// Takes `work_orders` in ACCESS EXCLUSIVE mode on a connection of its own to `direct`, held
/// until the connection's `ROLLBACK`.
async fn lock_orders(direct: &sqlx::postgres::PgConnectOptions) -> sqlx::postgres::PgConnection {
    let mut locker = sqlx::ConnectOptions::connect(direct).await.unwrap();
    sqlx::Executor::execute(
        &mut locker,
        "BEGIN; LOCK TABLE work_orders IN ACCESS EXCLUSIVE MODE",
    )
    .await
    .unwrap();
    locker
}

/// Returns once `n` lists of work orders wait on a lock in `direct`'s database. (Not a count of
/// every waiter: `serve`'s gauges read the table too.)
async fn lists_waiting(direct: &sqlx::postgres::PgConnectOptions, n: i64) {
    let watcher = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(direct.clone())
        .await
        .unwrap();
    eventually(10, "the lists waiting on the lock", || {
        let watcher = watcher.clone();
        async move {
            let (waiting,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE wait_event_type = 'Lock' AND datname = current_database() \
                 AND query LIKE '-- list_work_orders:%'",
            )
            .fetch_one(&watcher)
            .await
            .unwrap();
            (waiting == n).then_some(())
        }
    })
    .await;
}

/// Waits up to 30 s (`what` names the wait) for `api` to answer a list of work orders `200`
/// again, after the path to its database was mended.
async fn lists_again(api: &support::ApiClient, what: &str) {
    eventually(30, what, || {
        let api = api.clone();
        async move {
            let (status, body) = api.admin_get("/api/v1/work-orders").await;
            (status == 200).then_some(body)
        }
    })
    .await;
}
