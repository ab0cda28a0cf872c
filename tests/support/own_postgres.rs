//! A PostgreSQL of one test's own (embedded, on a port of its own) that the test stops and
//! starts again, with an in-process server over it: for what the queue and the API do while the
//! database is away.

use std::time::Duration;

use pullman::postgres::{EmbeddedPostgres, Listen, Options};

use super::{TestServer, free_port};

/// Where the test's PostgreSQL keeps its data and listens; the same across its restarts.
pub struct OwnPostgres {
    dir: tempfile::TempDir,
    port: u16,
}

impl OwnPostgres {
    pub fn new() -> Self {
        OwnPostgres {
            dir: tempfile::tempdir().expect("a temporary directory"),
            port: free_port(),
        }
    }

    /// Starts it (again); stop it with `EmbeddedPostgres::stop`.
    pub async fn start(&self) -> EmbeddedPostgres {
        EmbeddedPostgres::start(Options {
            root: self.dir.path().join("pg"),
            listen: Listen::Loopback(self.port),
            database: "postgres".into(),
            bin_dir: None,
            die_with_parent: true,
        })
        .await
        .expect("starting the test's own PostgreSQL")
    }

    /// The data directory, the same across restarts (for `standby.signal`).
    pub fn data_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("pg").join("data")
    }

    /// Migrates `pg`'s database and starts a server over it, its pool as `serve` has it (its
    /// connection settings and primary check; an acquire waits 10 s: what an unknown outage
    /// costs).
    pub async fn server(&self, pg: &EmbeddedPostgres) -> TestServer {
        let pool = pullman::serve::pool_options(8, &pg.options())
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(pg.options())
            .await
            .expect("connecting to the test's own PostgreSQL");
        pullman::queue::MIGRATOR
            .run(&pool)
            .await
            .expect("migrations");
        TestServer::start_on(pool, 64).await
    }
}
