//! A typed client of the REST API (docs/design.md §5), shared by `pullman worker`, `pullman executor`
//! and the admin commands. Errors keep the server's status and JSON error code.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use uuid::Uuid;

use crate::wire::{
    Agent, AgentWithToken, Explanation, Heartbeat, LogEntry, NewAgent, Page, WorkOrder,
};
use crate::wire::{
    ClaimNextBody, ClaimWaiting, ClaimedOrders, CompleteBody, CompleteManyBody, CompletedMany,
    ErrorBody, HeartbeatBody, OutputAccepted, OutputChunk, OutputPage, OutputQuery, RetryScheduled,
    WhoAmI,
};

/// Reads a bearer token from a file (surrounding whitespace ignored), naming the file in errors.
/// Errors: the file cannot be read, or holds only whitespace.
pub fn read_token_file(path: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context;
    let token = std::fs::read_to_string(path)
        .with_context(|| format!("reading token file {}", path.display()))?;
    let token = token.trim().to_string();
    anyhow::ensure!(!token.is_empty(), "token file {} is empty", path.display());
    Ok(token)
}

/// Checks a `--server` value (docs/design.md §7) and returns it without a trailing slash: an `http`
/// or `https` URL naming a host, with no path, query or fragment (the client adds `/api/v1`).
/// Errors: a sentence saying what is wrong and what to give instead. A bad URL is a
/// configuration error, reported at once, never retried as "not reachable".
pub fn parse_server_url(given: &str) -> Result<String, String> {
    let example = |host: &str| format!("http://{host}");
    let trimmed = given.trim();
    if !trimmed.contains("://") {
        let host = trimmed.trim_end_matches('/');
        return Err(format!(
            "{given:?} is not a server URL: give the scheme too, e.g. {}",
            example(if host.is_empty() {
                "127.0.0.1:8080"
            } else {
                host
            })
        ));
    }
    let url = reqwest::Url::parse(trimmed).map_err(|e| format!("{given:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "{given:?}: the scheme must be http or https, not {:?}",
            url.scheme()
        ));
    }
    let Some(host) = url.host_str() else {
        return Err(format!("{given:?} names no host"));
    };
    let root = match url.port() {
        Some(port) => format!("{}://{host}:{port}", url.scheme()),
        None => format!("{}://{host}", url.scheme()),
    };
    if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
        return Err(format!(
            "{given:?} has a path: give the server's root URL ({root}); Pullman adds /api/v1 \
             itself"
        ));
    }
    Ok(trimmed.trim_end_matches('/').to_string())
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error body.
    #[error("{status}: {message} ({code})")]
    Api {
        status: StatusCode,
        code: String,
        message: String,
        /// The server's `Retry-After` (seconds), sent with `429` and `503` (docs/design.md §9).
        retry_after: Option<Duration>,
    },
    /// The server could not be reached or the connection broke.
    #[error("cannot reach the Pullman server at {url}")]
    Transport {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The answer was not what the API promises.
    #[error("unexpected answer from the server: {0}")]
    Protocol(String),
    /// The server URL is wrong (no scheme, a path, https against plain HTTP): retrying cannot
    /// help; the message says what to give instead.
    #[error("{0}")]
    Config(String),
}

impl ClientError {
    /// The JSON error code, when the server sent one (`cancelled`, `reclaimed`, …).
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// `409 Conflict`: for heartbeat and complete, the claim is no longer ours.
    pub fn is_conflict(&self) -> bool {
        matches!(self, ClientError::Api { status, .. } if *status == StatusCode::CONFLICT)
    }

    /// `401`/`403`: the token is unknown, revoked, or its agent retired; retrying cannot help.
    pub fn is_unauthorized(&self) -> bool {
        matches!(self, ClientError::Api { status, .. }
            if *status == StatusCode::UNAUTHORIZED || *status == StatusCode::FORBIDDEN)
    }

    /// `400`/`422`: the server refused the body (a field it does not know, a value out of
    /// bounds); retrying the same cannot help.
    pub fn is_refused_body(&self) -> bool {
        matches!(self, ClientError::Api { status, .. }
            if *status == StatusCode::BAD_REQUEST || *status == StatusCode::UNPROCESSABLE_ENTITY)
    }

    /// `429 Too Many Requests`: the server is behind; send later ([`ClientError::retry_after`]).
    pub fn is_too_many_requests(&self) -> bool {
        matches!(self, ClientError::Api { status, .. } if *status == StatusCode::TOO_MANY_REQUESTS)
    }

    /// How long the server asked to wait before the next attempt (`Retry-After`), if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ClientError::Api { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Worth retrying later: transport failures and 5xx.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Transport { .. } => true,
            ClientError::Api { status, .. } => status.is_server_error(),
            ClientError::Protocol(_) | ClientError::Config(_) => false,
        }
    }
}

/// What `complete` led to.
#[derive(Debug, Clone)]
pub enum Completed {
    Finished(Box<LogEntry>),
    RetryScheduled(RetryScheduled),
}

/// Client bound to one server and one bearer token.
#[derive(Clone)]
pub struct Client {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Client {
    /// `base` is the server's root URL, e.g. `http://127.0.0.1:8080`. Requests time out after
    /// 60 s (long-polls wait at most 30 s on the server). Errors: `base` is not such a URL
    /// ([`parse_server_url`]), or the HTTP client cannot be built.
    pub fn new(base: &str, token: &str) -> Result<Self, ClientError> {
        let base = parse_server_url(base).map_err(ClientError::Config)?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(50))
            .build()
            .map_err(|e| ClientError::Protocol(format!("building HTTP client: {e}")))?;
        Ok(Client {
            base,
            token: token.trim().to_string(),
            http,
        })
    }

    /// The bearer token, so an agent can hide it in the output it sends (docs/design.md §9).
    pub fn token(&self) -> &str {
        &self.token
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> Result<(StatusCode, bytes::Bytes), ClientError> {
        let url = format!("{}/api/v1{path}", self.base);
        let mut req = self.http.request(method, &url).bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req
            .send()
            .await
            .map_err(|source| self.transport_error(source))?;
        let status = resp.status();
        let retry_after = retry_after(resp.headers());
        let bytes = resp
            .bytes()
            .await
            .map_err(|source| ClientError::Transport {
                url: self.base.clone(),
                source,
            })?;
        if status.is_success() {
            return Ok((status, bytes));
        }
        Err(self.api_error(status, retry_after, &bytes))
    }

    /// A non-2xx answer as [`ClientError::Api`]: the server's error body, or the first 200
    /// characters of whatever answered (then likely not a Pullman server).
    fn api_error(
        &self,
        status: StatusCode,
        retry_after: Option<Duration>,
        bytes: &[u8],
    ) -> ClientError {
        match serde_json::from_slice::<ErrorBody>(bytes) {
            Ok(e) => ClientError::Api {
                status,
                code: e.error.code,
                message: e.error.message,
                retry_after,
            },
            Err(_) => ClientError::Api {
                status,
                retry_after,
                code: "http_error".into(),
                message: format!(
                    "{} (is {} a Pullman server?)",
                    String::from_utf8_lossy(bytes)
                        .chars()
                        .take(200)
                        .collect::<String>(),
                    self.base
                ),
            },
        }
    }

    /// A failed request as a [`ClientError`]. `https://` against a plain-HTTP port fails in the
    /// TLS handshake ("received corrupt message"): that is a wrong URL, not an outage, so it is
    /// a [`ClientError::Protocol`] (not retried) that says which scheme to use.
    fn transport_error(&self, source: reqwest::Error) -> ClientError {
        let mut cause: Option<&dyn std::error::Error> = Some(&source);
        while let Some(e) = cause {
            let text = e.to_string();
            if text.contains("corrupt message") || text.contains("InvalidContentType") {
                return ClientError::Config(format!(
                    "{} does not answer TLS (https); if it serves plain HTTP, use {}",
                    self.base,
                    self.base.replacen("https://", "http://", 1)
                ));
            }
            cause = e.source();
        }
        ClientError::Transport {
            url: self.base.clone(),
            source,
        }
    }

    async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> Result<T, ClientError> {
        let (_, bytes) = self.send(method, path, body).await?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// [`Self::json`] of a request without a body.
    async fn json_without_body<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
    ) -> Result<T, ClientError> {
        self.json(method, path, None::<&()>).await
    }

    /// `GET /whoami`: which principal the token is.
    pub async fn whoami(&self) -> Result<WhoAmI, ClientError> {
        self.json_without_body(Method::GET, "/whoami").await
    }

    /// `POST /work-orders` with a create body.
    pub async fn create_work_order(&self, body: &Value) -> Result<WorkOrder, ClientError> {
        self.json(Method::POST, "/work-orders", Some(body)).await
    }

    /// `GET /work-orders?…`; `query` is the query string without `?`.
    pub async fn list_work_orders(&self, query: &str) -> Result<Page<WorkOrder>, ClientError> {
        self.json_without_body(Method::GET, &format!("/work-orders?{query}"))
            .await
    }

    /// `GET {path}?{query}` of any list route (`/work-orders`, `/work-order-log`, `/agents`).
    pub async fn list_page<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &str,
    ) -> Result<Page<T>, ClientError> {
        self.json_without_body(Method::GET, &format!("{path}?{query}"))
            .await
    }

    /// `GET /work-orders/{id}`.
    pub async fn get_work_order(&self, id: Uuid) -> Result<WorkOrder, ClientError> {
        self.json_without_body(Method::GET, &format!("/work-orders/{id}"))
            .await
    }

    /// `GET /work-orders/{id}/explain`: why the order waits (docs/design.md §10).
    pub async fn explain_work_order(&self, id: Uuid) -> Result<Explanation, ClientError> {
        self.json_without_body(Method::GET, &format!("/work-orders/{id}/explain"))
            .await
    }

    /// `DELETE /work-orders/{id}`.
    pub async fn cancel_work_order(&self, id: Uuid) -> Result<LogEntry, ClientError> {
        self.json_without_body(Method::DELETE, &format!("/work-orders/{id}"))
            .await
    }

    /// `POST /work-orders/{id}/rerun`: a new order from a finished one.
    pub async fn rerun_work_order(&self, id: Uuid) -> Result<WorkOrder, ClientError> {
        self.json_without_body(Method::POST, &format!("/work-orders/{id}/rerun"))
            .await
    }

    /// `GET /work-order-log?…`.
    pub async fn list_log(&self, query: &str) -> Result<Page<LogEntry>, ClientError> {
        self.json_without_body(Method::GET, &format!("/work-order-log?{query}"))
            .await
    }

    /// `GET /work-order-log/{id}`.
    pub async fn get_log_entry(&self, id: Uuid) -> Result<LogEntry, ClientError> {
        self.json_without_body(Method::GET, &format!("/work-order-log/{id}"))
            .await
    }

    /// `POST /agents`.
    pub async fn register_agent(&self, body: &NewAgent) -> Result<AgentWithToken, ClientError> {
        self.json(Method::POST, "/agents", Some(body)).await
    }

    /// `GET /agents?…`.
    pub async fn list_agents(&self, query: &str) -> Result<Page<Agent>, ClientError> {
        self.json_without_body(Method::GET, &format!("/agents?{query}"))
            .await
    }

    /// `GET /agents/{id}`.
    pub async fn get_agent(&self, id: Uuid) -> Result<Agent, ClientError> {
        self.json_without_body(Method::GET, &format!("/agents/{id}"))
            .await
    }

    /// `DELETE /agents/{id}`.
    pub async fn retire_agent(&self, id: Uuid) -> Result<Agent, ClientError> {
        self.json_without_body(Method::DELETE, &format!("/agents/{id}"))
            .await
    }

    /// `POST /agents/{id}/token`.
    pub async fn rotate_token(&self, id: Uuid) -> Result<AgentWithToken, ClientError> {
        self.json_without_body(Method::POST, &format!("/agents/{id}/token"))
            .await
    }

    /// `POST /agents/{id}/claim`: the orders claimed, empty on `204`. With `body.max_orders`
    /// the server answers a list (`ClaimedOrders`) of up to that many; without, one order.
    pub async fn claim_next(
        &self,
        agent_id: Uuid,
        body: &ClaimNextBody,
    ) -> Result<Vec<WorkOrder>, ClientError> {
        let (status, bytes) = self
            .send(
                Method::POST,
                &format!("/agents/{agent_id}/claim"),
                Some(body),
            )
            .await?;
        if status == StatusCode::NO_CONTENT {
            return Ok(Vec::new());
        }
        let parsed = if body.max_orders.is_some() {
            serde_json::from_slice::<ClaimedOrders>(&bytes).map(|c| c.orders)
        } else {
            serde_json::from_slice::<WorkOrder>(&bytes).map(|o| vec![o])
        };
        parsed.map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// `POST /work-orders/{id}/heartbeat`, saying what holds the order up now (`waiting`,
    /// docs/design.md §12; `None`: nothing).
    pub async fn heartbeat(
        &self,
        order_id: Uuid,
        agent_id: Uuid,
        claim_id: Option<Uuid>,
        waiting: Option<&ClaimWaiting>,
    ) -> Result<Heartbeat, ClientError> {
        let body = HeartbeatBody {
            agent_id,
            claim_id,
            waiting: waiting.cloned(),
        };
        self.json(
            Method::POST,
            &format!("/work-orders/{order_id}/heartbeat"),
            Some(&body),
        )
        .await
    }

    /// `POST /work-orders/{id}/output` (docs/design.md §9): one chunk of the claim's output. A resent
    /// `seq` is answered as the first time. Errors: `409` when the claim is no longer live (stop
    /// sending), `413` for a chunk over 1 MiB, `429`/`503` with `Retry-After` when the server is
    /// behind (send later, keep the lines).
    pub async fn send_output(
        &self,
        order_id: Uuid,
        chunk: &OutputChunk,
    ) -> Result<OutputAccepted, ClientError> {
        self.json(
            Method::POST,
            &format!("/work-orders/{order_id}/output"),
            Some(chunk),
        )
        .await
    }

    /// `GET /work-orders/{id}/output` (docs/design.md §9): one page of an order's output, or its last
    /// lines (`query.follow` is ignored: see [`Client::follow_output`]).
    pub async fn read_output(
        &self,
        order_id: Uuid,
        query: &OutputQuery,
    ) -> Result<OutputPage, ClientError> {
        let query = OutputQuery {
            follow: None,
            ..query.clone()
        };
        self.json_without_body(
            Method::GET,
            &format!("/work-orders/{order_id}/output?{}", query.to_query_string()),
        )
        .await
    }

    /// `GET /work-orders/{id}/output?follow=true&…`: the open NDJSON stream of an order's output
    /// (one [`crate::wire::OutputEntry`] per line), ending when the order has finished. Unlike
    /// other requests it may last an hour; a stream cut earlier is resumed with `after=`.
    pub async fn follow_output(
        &self,
        order_id: Uuid,
        query: &OutputQuery,
    ) -> Result<reqwest::Response, ClientError> {
        let query = OutputQuery {
            follow: Some(true),
            limit: None,
            ..query.clone()
        };
        let url = format!(
            "{}/api/v1/work-orders/{order_id}/output?{}",
            self.base,
            query.to_query_string()
        );
        let resp = self
            .http
            .get(&url)
            .bearer_auth(&self.token)
            .timeout(Duration::from_secs(3600))
            .send()
            .await
            .map_err(|source| self.transport_error(source))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let retry_after = retry_after(resp.headers());
        let bytes = resp.bytes().await.unwrap_or_default();
        Err(self.api_error(status, retry_after, &bytes))
    }

    /// `POST /work-orders/{id}/complete`.
    pub async fn complete(
        &self,
        order_id: Uuid,
        body: &CompleteBody,
    ) -> Result<Completed, ClientError> {
        let (status, bytes) = self
            .send(
                Method::POST,
                &format!("/work-orders/{order_id}/complete"),
                Some(body),
            )
            .await?;
        let parsed = if status == StatusCode::ACCEPTED {
            serde_json::from_slice(&bytes).map(Completed::RetryScheduled)
        } else {
            serde_json::from_slice(&bytes).map(|e| Completed::Finished(Box::new(e)))
        };
        parsed.map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// `POST /agents/{agent_id}/complete`: several results in one request (issue #34). The
    /// outer error is the request's (transport, `401`/`403`, `400`, `503` for the whole batch,
    /// `404` from a server without the route); inside, one answer per item of `body`, in its
    /// order, each what [`Client::complete`] would have returned for it.
    pub async fn complete_many(
        &self,
        agent_id: Uuid,
        body: &CompleteManyBody,
    ) -> Result<Vec<Result<Completed, ClientError>>, ClientError> {
        let answer: CompletedMany = self
            .json(
                Method::POST,
                &format!("/agents/{agent_id}/complete"),
                Some(body),
            )
            .await?;
        let sent = body.completes.iter().map(|c| c.work_order_id);
        if answer.results.len() != body.completes.len()
            || !answer.results.iter().map(|r| r.work_order_id).eq(sent)
        {
            return Err(ClientError::Protocol(format!(
                "a batch complete of {} results was answered with {} that do not match",
                body.completes.len(),
                answer.results.len()
            )));
        }
        Ok(answer.results.into_iter().map(item_answer).collect())
    }
}

/// One item of a batch complete's answer as [`Client::complete`] returns it.
fn item_answer(result: crate::wire::CompleteResult) -> Result<Completed, ClientError> {
    let status = StatusCode::from_u16(result.status)
        .map_err(|_| ClientError::Protocol(format!("item status {}", result.status)))?;
    match (result.log_entry, result.retry_scheduled, result.error) {
        (Some(entry), _, _) if status == StatusCode::OK => Ok(Completed::Finished(entry)),
        (_, Some(retry), _) if status == StatusCode::ACCEPTED => {
            Ok(Completed::RetryScheduled(retry))
        }
        (_, _, Some(error)) if !status.is_success() => Err(ClientError::Api {
            status,
            code: error.code,
            message: error.message,
            // As the server says with a single complete's 503.
            retry_after: (status == StatusCode::SERVICE_UNAVAILABLE)
                .then_some(Duration::from_secs(1)),
        }),
        _ => Err(ClientError::Protocol(format!(
            "item {} answered {} without the body that goes with it",
            result.work_order_id, result.status
        ))),
    }
}

/// `Retry-After` in seconds (the only form the server sends, docs/design.md §9), if present.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    headers
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}
