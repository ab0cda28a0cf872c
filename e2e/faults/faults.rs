//! The fault plan: a sequence of phases, each opened by one fault injected into the running
//! cluster while the load goes on, and the record of when each fault hit and when the component
//! was back.

use std::time::Duration;

use anyhow::{Context, bail};

use crate::cluster::{PgStop, Postgres, Server};
use crate::http::Recorder;
use crate::report::progress;

/// One fault.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// No fault: the load runs undisturbed (the baseline).
    Calm,
    /// `kill -9` of replica 0, which stays down for `down` and is started again; the load goes on
    /// through replica 1.
    KillReplica { down: Duration },
    /// `kill -9` of every replica, started again at once: the service itself crashed.
    KillServers,
    /// `pg_terminate_backend` of every session of the replicas (PostgreSQL stays up).
    TerminateSessions,
    /// PostgreSQL stopped as `how`, kept down for `down`, started again on the same data.
    Postgres { how: PgStop, down: Duration },
    /// The external database fails over (issue #41): the `--failover-hook` program runs with
    /// `how` as its argument (`delete`: the primary's pod deleted; `switchover`: a replica promoted) and
    /// returns once the new primary is ready.
    Failover { how: &'static str },
}

impl Fault {
    pub fn describe(&self) -> String {
        match self {
            Fault::Calm => "none (baseline)".into(),
            Fault::KillReplica { down } => {
                format!("kill -9 of 1 of 2 replicas, down {} s", down.as_secs())
            }
            Fault::KillServers => "kill -9 of both replicas, restart".into(),
            Fault::TerminateSessions => "pg_terminate_backend of every session".into(),
            Fault::Postgres { how, down } => {
                let what = match how {
                    PgStop::Fast => "PostgreSQL restart -m fast",
                    PgStop::Immediate => "PostgreSQL restart -m immediate",
                    PgStop::Kill => "PostgreSQL kill -9 of the postmaster",
                };
                if down.is_zero() {
                    what.to_string()
                } else {
                    format!("{what}, down {} s", down.as_secs())
                }
            }
            Fault::Failover { how: "delete" } => "failover: the primary's pod deleted".into(),
            Fault::Failover { how } => format!("failover: {how}"),
        }
    }
}

/// A fault and how long its phase lasts (from the injection to the next phase).
#[derive(Debug, Clone, Copy)]
pub struct Phase {
    pub fault: Fault,
    pub length: Duration,
}

/// The phases of a run. The short plan has each fault once; the full plan repeats them as the
/// issue's runs did (server killed five times, PostgreSQL restarted fast and immediate five
/// times each, PostgreSQL down 15 s).
pub fn plan(full: bool) -> Vec<Phase> {
    let secs = Duration::from_secs;
    let phase = |fault, length| Phase {
        fault,
        length: secs(length),
    };
    let postgres = |how, down| Fault::Postgres {
        how,
        down: secs(down),
    };
    if !full {
        return vec![
            phase(Fault::Calm, 5),
            phase(Fault::KillReplica { down: secs(3) }, 10),
            phase(Fault::KillServers, 10),
            phase(Fault::TerminateSessions, 8),
            phase(postgres(PgStop::Fast, 0), 10),
            phase(postgres(PgStop::Immediate, 0), 10),
            phase(postgres(PgStop::Kill, 0), 10),
        ];
    }
    let mut phases = vec![phase(Fault::Calm, 10)];
    for round in 0..5 {
        if round % 2 == 0 {
            phases.push(phase(Fault::KillReplica { down: secs(5) }, 15));
        }
        phases.push(phase(Fault::KillServers, 12));
        phases.push(phase(Fault::TerminateSessions, 8));
        phases.push(phase(postgres(PgStop::Fast, 0), 12));
        phases.push(phase(postgres(PgStop::Immediate, 0), 12));
        match round {
            1 => phases.push(phase(postgres(PgStop::Kill, 0), 15)),
            3 => phases.push(phase(postgres(PgStop::Fast, 15), 30)),
            _ => {}
        }
    }
    phases
}

/// The phases of a failover run (`--failover-hook`): a calm baseline, then the primary's pod
/// deleted, then a switchover, each with time for the load to go on after the new primary.
pub fn failover_plan() -> Vec<Phase> {
    let phase = |fault, length| Phase {
        fault,
        length: Duration::from_secs(length),
    };
    vec![
        phase(Fault::Calm, 10),
        phase(Fault::Failover { how: "delete" }, 45),
        phase(Fault::Failover { how: "switchover" }, 45),
    ]
}

/// The processes the faults are done to: the suite's own PostgreSQL, or none with an external
/// database (`--database-url`), whose failovers `failover_hook` brings about.
pub struct Cluster {
    pub postgres: Option<Postgres>,
    pub servers: Vec<Server>,
    pub failover_hook: Option<String>,
}

/// When one phase's fault hit, times from the start of the run.
#[derive(Debug, Clone)]
pub struct PhaseRecord {
    pub fault: Fault,
    /// The fault was injected (signal sent).
    pub injected: Duration,
    /// The component was down (process gone).
    pub down: Duration,
    /// The component was back (PostgreSQL accepting connections, replica ready).
    pub back: Duration,
    /// The next phase began.
    pub end: Duration,
}

impl Cluster {
    /// Runs the phases in order; returns what happened when.
    pub async fn run_plan(
        &mut self,
        phases: &[Phase],
        rec: &Recorder,
    ) -> anyhow::Result<Vec<PhaseRecord>> {
        let mut records = Vec::with_capacity(phases.len());
        for (i, phase) in phases.iter().enumerate() {
            let injected = rec.now();
            progress(&format!(
                "phase {}/{}: {}",
                i + 1,
                phases.len(),
                phase.fault.describe()
            ));
            let (down, back) = self.inject(phase.fault, rec).await?;
            let until = injected + phase.length;
            if let Some(left) = until.checked_sub(rec.now()) {
                tokio::time::sleep(left).await;
            }
            records.push(PhaseRecord {
                fault: phase.fault,
                injected,
                down,
                back,
                end: rec.now(),
            });
        }
        Ok(records)
    }

    async fn inject(
        &mut self,
        fault: Fault,
        rec: &Recorder,
    ) -> anyhow::Result<(Duration, Duration)> {
        Ok(match fault {
            Fault::Calm => (rec.now(), rec.now()),
            Fault::KillReplica { down } => {
                self.servers[0].kill9();
                let gone = rec.now();
                tokio::time::sleep(down).await;
                self.servers[0].restart().await?;
                (gone, rec.now())
            }
            Fault::KillServers => {
                for server in &mut self.servers {
                    server.kill9();
                }
                let gone = rec.now();
                for server in &mut self.servers {
                    server.restart().await?;
                }
                (gone, rec.now())
            }
            Fault::TerminateSessions => {
                let ended = self.own_postgres()?.terminate_sessions().await?;
                progress(&format!("ended {ended} sessions"));
                (rec.now(), rec.now())
            }
            Fault::Postgres { how, down } => {
                self.own_postgres()?.stop(how).await?;
                let gone = rec.now();
                tokio::time::sleep(down).await;
                self.own_postgres()?.start_again().await?;
                (gone, rec.now())
            }
            Fault::Failover { how } => {
                let hook = self
                    .failover_hook
                    .as_deref()
                    .context("a failover phase needs --failover-hook")?;
                let injected = rec.now();
                let out = tokio::process::Command::new(hook)
                    .arg(how)
                    .stdin(std::process::Stdio::null())
                    .output()
                    .await
                    .with_context(|| format!("running the failover hook {hook:?}"))?;
                if !out.status.success() {
                    bail!(
                        "the failover hook `{hook} {how}` failed ({}): {}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                }
                progress(&format!(
                    "new primary ready after {:.1} s",
                    (rec.now() - injected).as_secs_f64()
                ));
                (injected, rec.now())
            }
        })
    }

    fn own_postgres(&mut self) -> anyhow::Result<&mut Postgres> {
        self.postgres
            .as_mut()
            .context("this fault needs the suite's own PostgreSQL, not --database-url")
    }
}
