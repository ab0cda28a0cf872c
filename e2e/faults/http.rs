//! The load's HTTP client. Every exchange is recorded with when it was sent, how long it took and
//! what came back, so the report can count answers per fault, time recoveries and quote any `5xx`
//! other than `503` exactly.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::Value;

/// Which call of the API an exchange was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Endpoint {
    Create,
    ClaimNext,
    Heartbeat,
    Complete,
    /// A complete sent with a claim the agent lost when it "died".
    StaleComplete,
}

impl Endpoint {
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Create => "create",
            Endpoint::ClaimNext => "claim-next",
            Endpoint::Heartbeat => "heartbeat",
            Endpoint::Complete => "complete",
            Endpoint::StaleComplete => "stale complete",
        }
    }
}

/// What came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Answer {
    Status(u16),
    /// The connection was refused: the request was never sent.
    Refused,
    /// The connection broke after the request was sent: it may or may not have been applied.
    Lost,
    /// No answer within the client's timeout: it may or may not have been applied.
    TimedOut,
}

impl Answer {
    pub fn is_success(self) -> bool {
        matches!(self, Answer::Status(200..=299))
    }

    /// Whether the server may have applied the request although the client cannot tell: the
    /// answer was lost, or the server failed (a `5xx` may come after a commit).
    pub fn maybe_applied(self) -> bool {
        match self {
            Answer::Status(s) => s >= 500,
            Answer::Refused => false,
            Answer::Lost | Answer::TimedOut => true,
        }
    }
}

/// One request and its answer, times relative to the start of the run.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub endpoint: Endpoint,
    pub sent: Duration,
    pub took: Duration,
    pub answer: Answer,
}

/// A request whose answer is a finding: a `5xx` other than `503`, or a `4xx` the protocol does not
/// explain (the suite only sends valid requests).
#[derive(Debug, Clone)]
pub struct Finding {
    pub at: Duration,
    pub request: String,
    pub answer: String,
}

/// Everything the load saw.
pub struct Recorder {
    start: Instant,
    exchanges: Mutex<Vec<Exchange>>,
    findings: Mutex<Vec<Finding>>,
}

impl Recorder {
    fn new() -> Self {
        Recorder {
            start: Instant::now(),
            exchanges: Mutex::new(Vec::new()),
            findings: Mutex::new(Vec::new()),
        }
    }

    /// Time since the start of the run.
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    pub fn exchanges(&self) -> Vec<Exchange> {
        self.exchanges.lock().unwrap().clone()
    }

    pub fn findings(&self) -> Vec<Finding> {
        self.findings.lock().unwrap().clone()
    }
}

/// A reply: the answer and the JSON body (`Null` when empty or absent).
#[derive(Debug, Clone)]
pub struct Reply {
    pub answer: Answer,
    pub body: Value,
}

impl Reply {
    /// The `error.code` of an error body.
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

/// One request to send.
pub struct Request<'a> {
    pub endpoint: Endpoint,
    pub method: Method,
    pub path: String,
    pub token: &'a str,
    pub body: Option<Value>,
    pub idempotency_key: Option<String>,
    pub timeout: Duration,
}

/// The pull API of every replica, through one connection pool.
pub struct Api {
    http: reqwest::Client,
    replicas: Vec<String>,
    pub rec: Recorder,
}

/// Longest quoted body in a finding.
const QUOTE_LIMIT: usize = 400;

fn quote(text: &str) -> String {
    if text.len() <= QUOTE_LIMIT {
        return text.to_string();
    }
    let mut end = QUOTE_LIMIT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

impl Api {
    pub fn new(replicas: Vec<String>) -> Self {
        Api {
            http: reqwest::Client::builder()
                .pool_idle_timeout(Duration::from_secs(30))
                .build()
                .expect("building the HTTP client"),
            replicas,
            rec: Recorder::new(),
        }
    }

    /// Base URL of replica `replica`.
    pub fn base(&self, replica: usize) -> String {
        self.replicas[replica].clone()
    }

    pub fn replica_count(&self) -> usize {
        self.replicas.len()
    }

    /// Sends `req` to replica `replica` and records the exchange.
    pub async fn send(&self, replica: usize, req: Request<'_>) -> Reply {
        let url = format!("{}{}", self.replicas[replica], req.path);
        let mut builder = self
            .http
            .request(req.method.clone(), &url)
            .bearer_auth(req.token)
            .timeout(req.timeout);
        if let Some(key) = &req.idempotency_key {
            builder = builder.header("Idempotency-Key", key);
        }
        if let Some(body) = &req.body {
            builder = builder.json(body);
        }
        let sent = self.rec.now();
        let (answer, text) = match builder.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                match resp.text().await {
                    Ok(text) => (Answer::Status(status), text),
                    Err(_) => (Answer::Lost, String::new()),
                }
            }
            Err(e) if e.is_timeout() => (Answer::TimedOut, String::new()),
            Err(e) if e.is_connect() => (Answer::Refused, String::new()),
            Err(_) => (Answer::Lost, String::new()),
        };
        let took = self.rec.now() - sent;
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text.clone()))
        };
        let (answer, body) = one_of_a_batch(&req.path, answer, body);
        if let Answer::Status(status) = answer
            && is_finding(req.endpoint, status)
        {
            let request = match &req.body {
                Some(b) => format!("{} {} (replica {replica}) {}", req.method, req.path, b),
                None => format!("{} {} (replica {replica})", req.method, req.path),
            };
            self.rec.findings.lock().unwrap().push(Finding {
                at: sent,
                request: quote(&request),
                answer: quote(&format!("{status} {text}")),
            });
        }
        self.rec.exchanges.lock().unwrap().push(Exchange {
            endpoint: req.endpoint,
            sent,
            took,
            answer,
        });
        Reply { answer, body }
    }
}

/// A batch complete of one item (`POST /agents/{id}/complete`) answered `200`: the item's status
/// and body, what its own `POST /work-orders/{id}/complete` would have answered, so that the
/// checks and the findings read both routes alike. Anything else as it came.
fn one_of_a_batch(path: &str, answer: Answer, body: Value) -> (Answer, Value) {
    let batch = path.starts_with("/api/v1/agents/") && path.ends_with("/complete");
    let item = &body["results"][0];
    let Some(status) = item["status"]
        .as_u64()
        .filter(|_| batch && answer == Answer::Status(200))
    else {
        return (answer, body);
    };
    let inner = match (&item["log_entry"], &item["retry_scheduled"]) {
        (Value::Object(_), _) => item["log_entry"].clone(),
        (_, Value::Object(_)) => item["retry_scheduled"].clone(),
        _ => serde_json::json!({"error": item["error"]}),
    };
    (Answer::Status(status as u16), inner)
}

/// `5xx` other than `503`, and `4xx` answers the protocol does not produce for the suite's
/// requests: a `409` (or `404` for a finished order) is a refusal of a heartbeat or complete, the
/// fencing working as designed.
fn is_finding(endpoint: Endpoint, status: u16) -> bool {
    match status {
        503 => false,
        500..=599 => true,
        409 | 404 => !matches!(
            endpoint,
            Endpoint::Heartbeat | Endpoint::Complete | Endpoint::StaleComplete
        ),
        400..=499 => true,
        _ => false,
    }
}
