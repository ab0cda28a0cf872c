//! The load: a producer creating work orders at a steady rate, and agents pulling them with short
//! leases. Both behave as careful clients do during faults: a create whose answer was lost is
//! retried with the same `Idempotency-Key`; a complete whose answer was lost is retried with the
//! same `claim_id` and outcome; a replica that does not answer is left for the other one. Some
//! agents "die" mid-order (claim, then vanish) and come back later with the stale claim.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::cluster::ADMIN_TOKEN;
use crate::http::{Answer, Api, Endpoint, Request};

/// The label every order targets and every agent carries.
const LABEL: &str = "faults";
/// Lease asked for on every claim; heartbeats every `HEARTBEAT_EVERY` while working.
const LEASE_SECONDS: i64 = 5;
const HEARTBEAT_EVERY: Duration = Duration::from_millis(1500);
/// Long-poll wait of claim-next.
const MAX_WAIT_SECONDS: i64 = 5;
/// How long a create or complete is retried before the client gives up on knowing its fate.
const RETRY_FOR: Duration = Duration::from_secs(90);
/// How long an agent stays with the other replica after its own stopped answering.
const FAILOVER_FOR: Duration = Duration::from_secs(10);

/// Shape of the load.
#[derive(Debug, Clone)]
pub struct LoadSettings {
    pub orders: usize,
    pub agents: usize,
    /// The producer spreads its creates evenly over this time.
    pub produce_for: Duration,
    /// Share of claims after which the agent dies instead of working.
    pub death_rate: f64,
    /// How long after dying an agent comes back and completes with its stale claim.
    pub stale_after: Duration,
    /// Share of first attempts reported as retryable failures (exercises RETRY_PENDING).
    pub failure_rate: f64,
    /// Share of orders worked on for longer than the lease, kept alive by heartbeats.
    pub slow_rate: f64,
}

/// One create intent: the order with marker `seq`, however many requests it took.
#[derive(Debug, Clone)]
pub struct CreateRecord {
    pub seq: usize,
    pub attempts: u32,
    /// Attempts answered `5xx` or not at all: the order may have been created by them.
    pub lost_answers: u32,
    /// The id from the `201`; `None` when the producer gave up or was refused.
    pub id: Option<Uuid>,
}

/// How a complete ended for the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// `200`: the order reached the log.
    Finished,
    /// `202`: a retry was scheduled.
    RetryScheduled,
    /// `409`/`404` with this code: nothing changed.
    Refused(String),
    /// No definitive answer before the client gave up.
    Unknown,
}

/// One complete (with all its retries) as the agent saw it.
#[derive(Debug, Clone)]
pub struct CompleteRecord {
    pub order: Uuid,
    pub claim: Uuid,
    pub agent: Uuid,
    pub success: bool,
    /// Sent by an agent that died with the claim and came back.
    pub stale: bool,
    /// An earlier try's answer was lost, so a refusal may follow the agent's own success.
    pub lost_before: bool,
    /// The answer to each try, in order.
    pub answers: Vec<Answer>,
    pub verdict: Verdict,
}

/// A claim an agent received (`200` on claim-next).
#[derive(Debug, Clone)]
pub struct ClaimRecord {
    pub order: Uuid,
    pub claim: Uuid,
    pub agent: Uuid,
}

#[derive(Debug, Clone)]
struct AgentIdentity {
    id: Uuid,
    token: String,
    home: usize,
    /// Reports through the batch complete (`POST /agents/{id}/complete`, one item a request)
    /// rather than `POST /work-orders/{id}/complete`: every other agent, so both routes meet
    /// every fault.
    batch: bool,
}

/// The load and everything it recorded.
pub struct Load {
    pub api: Api,
    pub settings: LoadSettings,
    run: String,
    agents: Mutex<Vec<AgentIdentity>>,
    pub creates: Mutex<Vec<CreateRecord>>,
    pub claims: Mutex<Vec<ClaimRecord>>,
    pub completes: Mutex<Vec<CompleteRecord>>,
    pub deaths: AtomicUsize,
    /// Orders an agent stopped working on because a heartbeat was refused.
    pub abandoned: AtomicUsize,
    stale_tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// The `yaml_content` of order `seq`: a ConfigMap whose name is the order's marker.
pub fn order_yaml(seq: usize) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fault-order-{seq}\ndata:\n  a: b\n"
    )
}

impl Load {
    pub fn new(api: Api, settings: LoadSettings) -> Self {
        Load {
            api,
            settings,
            run: Uuid::new_v4().simple().to_string()[..8].to_string(),
            agents: Mutex::new(Vec::new()),
            creates: Mutex::new(Vec::new()),
            claims: Mutex::new(Vec::new()),
            completes: Mutex::new(Vec::new()),
            deaths: AtomicUsize::new(0),
            abandoned: AtomicUsize::new(0),
            stale_tasks: Mutex::new(Vec::new()),
        }
    }

    /// Registers the agents (before any fault), homed on the replicas in turn.
    pub async fn register_agents(&self) -> anyhow::Result<()> {
        let http = reqwest::Client::new();
        let base = |i: usize| self.api_base(i);
        for i in 0..self.settings.agents {
            let resp = http
                .post(format!("{}/api/v1/agents", base(i)))
                .bearer_auth(ADMIN_TOKEN)
                .json(&json!({"name": format!("faults-agent-{i}"), "labels": [LABEL]}))
                .send()
                .await?;
            let status = resp.status();
            let v: Value = resp.json().await?;
            anyhow::ensure!(
                status.as_u16() == 201,
                "registering agent {i}: {status} {v}"
            );
            self.agents.lock().unwrap().push(AgentIdentity {
                id: v["agent"]["id"].as_str().unwrap_or_default().parse()?,
                token: v["token"].as_str().unwrap_or_default().to_string(),
                home: i % self.api.replica_count(),
                batch: i % 2 == 1,
            });
        }
        Ok(())
    }

    fn api_base(&self, replica: usize) -> String {
        self.api.base(replica % self.api.replica_count())
    }

    /// Starts every agent; they pull until `stop` is cancelled.
    pub fn spawn_agents(
        self: &Arc<Self>,
        stop: &CancellationToken,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let agents = self.agents.lock().unwrap().clone();
        agents
            .into_iter()
            .map(|agent| {
                let load = self.clone();
                let stop = stop.clone();
                tokio::spawn(async move { load.run_agent(agent, stop).await })
            })
            .collect()
    }

    /// Creates `orders` orders evenly over `produce_for`; returns when every create has an answer
    /// or was given up.
    pub async fn produce(self: &Arc<Self>) {
        let s = &self.settings;
        let interval = s.produce_for / s.orders.max(1) as u32;
        let start = tokio::time::Instant::now();
        let mut tasks = Vec::with_capacity(s.orders);
        for seq in 0..s.orders {
            tokio::time::sleep_until(start + interval * seq as u32).await;
            let load = self.clone();
            tasks.push(tokio::spawn(async move { load.create(seq).await }));
        }
        for task in tasks {
            if let Ok(record) = task.await {
                self.creates.lock().unwrap().push(record);
            }
        }
    }

    async fn create(&self, seq: usize) -> CreateRecord {
        let mut body = json!({
            "work_type": "custom",
            "yaml_content": order_yaml(seq),
            "max_retries": 3,
            "backoff_seconds": 1,
            "claim_timeout_seconds": 60,
            "targeting": {"labels": [LABEL]},
        });
        if let Some(concurrency) =
            crate::keys::concurrency_of(seq, crate::keys::keys_for(self.settings.orders))
        {
            body["concurrency"] = concurrency;
        }
        if let Some(tenant) = tenant_of(seq, self.settings.orders) {
            body["tenant"] = json!(tenant);
        }
        let key = format!("faults-{}-{seq}", self.run);
        let mut record = CreateRecord {
            seq,
            attempts: 0,
            lost_answers: 0,
            id: None,
        };
        let mut replica = seq % self.api.replica_count();
        let deadline = tokio::time::Instant::now() + RETRY_FOR;
        loop {
            record.attempts += 1;
            let reply = self
                .api
                .send(
                    replica,
                    Request {
                        endpoint: Endpoint::Create,
                        method: Method::POST,
                        path: "/api/v1/work-orders".into(),
                        token: ADMIN_TOKEN,
                        body: Some(body.clone()),
                        idempotency_key: Some(key.clone()),
                        timeout: Duration::from_secs(20),
                    },
                )
                .await;
            match reply.answer {
                Answer::Status(201) => {
                    record.id = reply.body["id"].as_str().and_then(|s| s.parse().ok());
                    return record;
                }
                // A definitive refusal (recorded as a finding): retrying would not help.
                Answer::Status(s) if s < 500 => return record,
                answer => {
                    if answer.maybe_applied() {
                        record.lost_answers += 1;
                    }
                    if tokio::time::Instant::now() > deadline {
                        return record;
                    }
                    replica = (replica + 1) % self.api.replica_count();
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }
    }

    async fn run_agent(self: Arc<Self>, agent: AgentIdentity, stop: CancellationToken) {
        let n = self.api.replica_count();
        let mut replica = agent.home;
        let mut away_since: Option<tokio::time::Instant> = None;
        while !stop.is_cancelled() {
            if away_since.is_some_and(|t| t.elapsed() > FAILOVER_FOR) {
                replica = agent.home;
                away_since = None;
            }
            let claim = self.api.send(
                replica,
                Request {
                    endpoint: Endpoint::ClaimNext,
                    method: Method::POST,
                    path: format!("/api/v1/agents/{}/claim", agent.id),
                    token: &agent.token,
                    body: Some(json!({
                        "max_wait_seconds": MAX_WAIT_SECONDS,
                        "lease_seconds": LEASE_SECONDS,
                    })),
                    idempotency_key: None,
                    timeout: Duration::from_secs(20),
                },
            );
            let reply = tokio::select! {
                reply = claim => reply,
                _ = stop.cancelled() => return,
            };
            match reply.answer {
                Answer::Status(200) => {
                    let order = reply.body["id"].as_str().and_then(|s| s.parse().ok());
                    let claim = reply.body["claim_id"].as_str().and_then(|s| s.parse().ok());
                    let (Some(order), Some(claim)) = (order, claim) else {
                        crate::report::progress(&format!(
                            "claim answer without id: {}",
                            reply.body
                        ));
                        continue;
                    };
                    self.claims.lock().unwrap().push(ClaimRecord {
                        order,
                        claim,
                        agent: agent.id,
                    });
                    let retry_count = reply.body["retry_count"].as_i64().unwrap_or(0);
                    self.work(&agent, &mut replica, order, claim, retry_count)
                        .await;
                }
                Answer::Status(204) => {}
                answer => {
                    if answer != Answer::Status(409) {
                        replica = (replica + 1) % n;
                        away_since.get_or_insert_with(tokio::time::Instant::now);
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
    }

    async fn work(
        self: &Arc<Self>,
        agent: &AgentIdentity,
        replica: &mut usize,
        order: Uuid,
        claim: Uuid,
        retry_count: i64,
    ) {
        let s = &self.settings;
        if rand::random::<f64>() < s.death_rate {
            self.die(agent, order, claim);
            // The agent's process restarts before it pulls again.
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
        }
        let work_for = if rand::random::<f64>() < s.slow_rate {
            Duration::from_secs(LEASE_SECONDS as u64 + 2)
        } else {
            Duration::from_millis(rand::random_range(20..200))
        };
        let started = tokio::time::Instant::now();
        loop {
            if !self.heartbeat(agent, replica, order, claim).await {
                self.abandoned.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let left = work_for.saturating_sub(started.elapsed());
            if left.is_zero() {
                break;
            }
            tokio::time::sleep(left.min(HEARTBEAT_EVERY)).await;
        }
        let success = !(retry_count == 0 && rand::random::<f64>() < s.failure_rate);
        let record = self
            .complete(agent, replica, order, claim, success, false)
            .await;
        self.completes.lock().unwrap().push(record);
    }

    /// Extends the lease; `false` when the claim is gone (`409`/`404`: stop working on it). A
    /// heartbeat that gets no answer does not stop the work: the complete will tell.
    async fn heartbeat(
        &self,
        agent: &AgentIdentity,
        replica: &mut usize,
        order: Uuid,
        claim: Uuid,
    ) -> bool {
        let reply = self
            .api
            .send(
                *replica,
                Request {
                    endpoint: Endpoint::Heartbeat,
                    method: Method::POST,
                    path: format!("/api/v1/work-orders/{order}/heartbeat"),
                    token: &agent.token,
                    body: Some(json!({"agent_id": agent.id, "claim_id": claim})),
                    idempotency_key: None,
                    timeout: Duration::from_secs(10),
                },
            )
            .await;
        match reply.answer {
            Answer::Status(409 | 404) => false,
            Answer::Status(s) if s < 500 => true,
            _ => {
                *replica = (*replica + 1) % self.api.replica_count();
                true
            }
        }
    }

    /// The agent vanishes holding the claim; it comes back after `stale_after` and reports a
    /// success with the old `claim_id`, which must be refused unless the claim is still current.
    fn die(self: &Arc<Self>, agent: &AgentIdentity, order: Uuid, claim: Uuid) {
        self.deaths.fetch_add(1, Ordering::Relaxed);
        let agent = agent.clone();
        let after = self.settings.stale_after;
        let me = self.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let mut replica = agent.home;
            let record = me
                .complete(&agent, &mut replica, order, claim, true, true)
                .await;
            me.completes.lock().unwrap().push(record);
        });
        self.stale_tasks.lock().unwrap().push(task);
    }

    /// Sends a complete until it gets a definitive answer or `RETRY_FOR` has passed, always with
    /// the same `claim_id` and outcome.
    async fn complete(
        &self,
        agent: &AgentIdentity,
        replica: &mut usize,
        order: Uuid,
        claim: Uuid,
        success: bool,
        stale: bool,
    ) -> CompleteRecord {
        let mut record = CompleteRecord {
            order,
            claim,
            agent: agent.id,
            success,
            stale,
            lost_before: false,
            answers: Vec::new(),
            verdict: Verdict::Unknown,
        };
        let endpoint = if stale {
            Endpoint::StaleComplete
        } else {
            Endpoint::Complete
        };
        let message = if success { "done" } else { "failed, try again" };
        let result =
            json!({"claim_id": claim, "success": success, "message": message, "retryable": true});
        let (path, body) = if agent.batch {
            let mut item = result;
            item["work_order_id"] = json!(order);
            let path = format!("/api/v1/agents/{}/complete", agent.id);
            (path, json!({"completes": [item]}))
        } else {
            let mut body = result;
            body["agent_id"] = json!(agent.id);
            (format!("/api/v1/work-orders/{order}/complete"), body)
        };
        let deadline = tokio::time::Instant::now() + RETRY_FOR;
        loop {
            let reply = self
                .api
                .send(
                    *replica,
                    Request {
                        endpoint,
                        method: Method::POST,
                        path: path.clone(),
                        token: &agent.token,
                        body: Some(body.clone()),
                        idempotency_key: None,
                        timeout: Duration::from_secs(20),
                    },
                )
                .await;
            record.answers.push(reply.answer);
            record.verdict = match reply.answer {
                Answer::Status(200) => Verdict::Finished,
                Answer::Status(202) => Verdict::RetryScheduled,
                Answer::Status(s) if s < 500 => Verdict::Refused(format!("{s} {}", reply.code())),
                answer => {
                    record.lost_before |= answer.maybe_applied();
                    if tokio::time::Instant::now() > deadline {
                        return record;
                    }
                    *replica = (*replica + 1) % self.api.replica_count();
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    continue;
                }
            };
            return record;
        }
    }

    /// Waits for the stale completes still due.
    pub async fn finish_stale_completes(&self) {
        let tasks: Vec<_> = std::mem::take(&mut *self.stale_tasks.lock().unwrap());
        for task in tasks {
            let _ = task.await;
        }
    }
}

/// The tenant of order `seq` of `orders`: one of three in the first half of the run, none in the
/// second, so the claims walk tenant turns (fair mode, the group claims' fair statement
/// included) while the first half's orders wait, and priority and age alone afterwards
/// (docs/design.md §11, `queue::turns`). A key's slot is per tenant, and the key watcher counts
/// per slot.
fn tenant_of(seq: usize, orders: usize) -> Option<String> {
    (seq < orders / 2).then(|| format!("t{}", seq % 3))
}
