//! An executor running in-process over the real pull API, as the tests start it.

use std::sync::Arc;

use kube::Client;
use pullman::client::Client as PullClient;
use pullman::executor::KubeCarrier;
use pullman::pull::output::{OutputConfig, Redactor};
use pullman::pull::{self, LoopConfig, Shutdown};

use crate::support::TestServer;

/// An executor running in-process over the real pull API, for one namespace.
pub struct Executor {
    shutdown: Shutdown,
    task: tokio::task::JoinHandle<Result<(), pull::PullError>>,
}

impl Executor {
    /// An executor for `t`'s agent and namespace, with leases of `lease` seconds, 4 orders at
    /// once, and no output sent.
    pub fn start(t: &crate::Setup, lease: u32) -> Self {
        Self::start_with(&t.s, &t.k, &t.agent, &t.token, &t.ns, lease, 4, false).0
    }

    /// Like `start`, with `concurrency` orders at once, and with `output` the pods' logs sent as
    /// each order's output; also hands back the carrier.
    #[allow(clippy::too_many_arguments)]
    pub fn start_with(
        s: &TestServer,
        k: &Client,
        agent_id: &str,
        token: &str,
        ns: &str,
        lease: u32,
        concurrency: usize,
        output: bool,
    ) -> (Self, Arc<KubeCarrier>) {
        Self::run(s, agent_id, token, lease, concurrency, |api, agent_id| {
            let carrier = KubeCarrier::new(k.clone(), ns.to_string());
            if !output {
                return carrier;
            }
            carrier.with_output(OutputConfig {
                client: api.clone(),
                agent_id,
                buffer_bytes: 8 << 20,
                redactor: Redactor::new([token.to_string()]),
            })
        })
    }

    fn run(
        s: &TestServer,
        agent_id: &str,
        token: &str,
        lease: u32,
        concurrency: usize,
        carrier: impl FnOnce(&PullClient, uuid::Uuid) -> KubeCarrier,
    ) -> (Self, Arc<KubeCarrier>) {
        let shutdown = Shutdown::default();
        let api = PullClient::new(&s.base, token).unwrap();
        let agent_id = agent_id.parse().unwrap();
        let carrier = Arc::new(carrier(&api, agent_id));
        let config = LoopConfig {
            agent_id,
            work_types: vec![],
            lease_seconds: lease,
            concurrency,
            max_wait_seconds: 5,
            heartbeat_every: None,
        };
        let task = tokio::spawn(pull::run(api, config, carrier.clone(), shutdown.clone()));
        (Executor { shutdown, task }, carrier)
    }

    /// Like `kill -9`: nothing reported, nothing cleaned up.
    pub fn kill(self) {
        self.task.abort();
    }

    pub async fn stop(self) {
        self.shutdown.drain.cancel();
        self.shutdown.abandon.cancel();
        let _ = self.task.await;
    }
}
