//! The test PostgreSQL: started once per process on a free loopback port (unless
//! `PULLMAN_TEST_DATABASE_URL` names a server), and a fresh database per caller.

use std::sync::OnceLock;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::postgres::{EmbeddedPostgres, Listen, Options};
use crate::queue;

/// URL of the server-wide `postgres` database of the process's test PostgreSQL. The first call
/// starts it (`fsync=on`, default settings); it stops when the process ends.
///
/// # Panics
/// When PostgreSQL cannot be started (the message says why).
pub fn server_url() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("PULLMAN_TEST_DATABASE_URL") {
            return url;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        // The server is started from a thread that lives as long as the process: the kernel
        // stops PostgreSQL (PR_SET_PDEATHSIG) when that thread dies, i.e. when the process ends.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for starting PostgreSQL");
            let root = std::env::temp_dir().join(format!("pullman-test-pg-{}", std::process::id()));
            clean_stale_dirs();
            let _ = std::fs::remove_dir_all(&root);
            let pg = rt.block_on(EmbeddedPostgres::start(Options {
                root,
                listen: Listen::Loopback(free_port()),
                database: "postgres".into(),
                bin_dir: None,
                die_with_parent: true,
            }));
            match pg {
                Ok(pg) => {
                    let _ = tx.send(Ok(pg.url()));
                    loop {
                        std::thread::park();
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(format!("{e:#}")));
                }
            }
        });
        rx.recv()
            .expect("the PostgreSQL starter thread answers")
            .unwrap_or_else(|e| panic!("could not start the test PostgreSQL: {e}"))
    })
}

/// Removes data directories of earlier test processes that are gone.
fn clean_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if let Some(pid) = name.strip_prefix("pullman-test-pg-")
            && let Ok(pid) = pid.parse::<u32>()
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// A free TCP port on 127.0.0.1 (free when asked; a race with other processes is possible).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding 127.0.0.1:0")
}

/// A new, empty, migrated database on [`server_url`]'s server, as a pool of at most
/// `max_connections` (acquire timeout 30 s).
///
/// # Panics
/// When the server cannot be reached or the migrations fail.
pub async fn fresh_pool(max_connections: u32) -> PgPool {
    let server = server_url();
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(server)
        .await
        .expect("connecting to the test PostgreSQL");
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await
        .expect("CREATE DATABASE");
    admin.close().await;
    let (base, _) = server.rsplit_once('/').expect("a URL with a database");
    let options: sqlx::postgres::PgConnectOptions = format!("{base}/{name}")
        .parse()
        .expect("the test database's URL");
    let pool = crate::serve::pool_options(max_connections, &options)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await
        .expect("connecting to the fresh database");
    queue::MIGRATOR
        .run(&pool)
        .await
        .expect("migrating the fresh database");
    pool
}

/// The URL of a fresh migrated database (for processes a test starts).
pub async fn fresh_database_url() -> String {
    let pool = fresh_pool(1).await;
    let (name,): (String,) = sqlx::query_as("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .expect("current_database()");
    pool.close().await;
    let (base, _) = server_url()
        .rsplit_once('/')
        .expect("a URL with a database");
    format!("{base}/{name}")
}
