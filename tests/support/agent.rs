//! An agent as the API tests drive it: its id and token kept together with the server they were
//! registered on, so that a claim, a complete or a heartbeat names only the order and the body
//! (the repeated `agent_id`/token arguments made up much of the tests' repeated code).

use serde_json::{Value, json};

use super::ApiClient;

/// A registered agent: the server's API, the agent's id and its token.
pub struct Agent<'a> {
    pub api: &'a ApiClient,
    pub id: String,
    pub token: String,
}

impl<'a> Agent<'a> {
    /// Registers an agent with `body` (`{"name": …, "labels": …}`) on `api`.
    pub async fn register(api: &'a ApiClient, body: Value) -> Self {
        let (id, token) = api.agent(body).await;
        Agent { api, id, token }
    }

    /// `claim-next` as this agent, long-polling up to `max_wait_seconds`; status and body.
    pub async fn claim_next(&self, max_wait_seconds: u64) -> (u16, Value) {
        let body = json!({ "max_wait_seconds": max_wait_seconds });
        self.api.claim_next(&self.id, &self.token, Some(body)).await
    }

    /// Claims `order` by id as this agent; status and body.
    pub async fn claim(&self, order: &str) -> (u16, Value) {
        self.api.claim(order, &self.id, &self.token).await
    }

    /// Completes `order` with `body`, this agent's id added as `agent_id`; status and body.
    pub async fn complete(&self, order: &str, body: Value) -> (u16, Value) {
        self.api
            .complete(order, &self.token, self.with_id(body))
            .await
    }

    /// Heartbeats `order` with `body`, this agent's id added as `agent_id`; status and body.
    pub async fn heartbeat(&self, order: &str, body: Value) -> (u16, Value) {
        self.api
            .heartbeat(order, &self.token, self.with_id(body))
            .await
    }

    fn with_id(&self, mut body: Value) -> Value {
        body["agent_id"] = json!(self.id);
        body
    }
}
