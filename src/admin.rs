//! Admin commands over the REST API: `pullman agents …`, `pullman work-orders …`, `pullman log …`.
//! Table output by default, `-o json` for scripts.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::client::Client;
use crate::queue::{Agent, LogEntry, NewAgent, WorkOrder};

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// Server and admin credentials of the admin commands.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// Pullman server URL.
    #[arg(
        long,
        global = true,
        env = "PULLMAN_SERVER",
        default_value = "http://127.0.0.1:8080"
    )]
    pub server: String,
    /// Admin token (prefer the environment variable or --token-file).
    #[arg(
        long,
        global = true,
        env = "PULLMAN_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// File holding the admin token. Default: <PULLMAN_DATA_DIR or ./.pullman>/admin-token, as
    /// written by `pullman serve`.
    #[arg(long, global = true, env = "PULLMAN_ADMIN_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value = "table")]
    pub output: Output,
}

impl Connection {
    fn client(&self) -> anyhow::Result<Client> {
        let token = match (&self.token, &self.token_file) {
            (Some(t), _) => t.clone(),
            (None, Some(f)) => crate::worker::read_token(f)?,
            (None, None) => {
                let dir = std::env::var_os("PULLMAN_DATA_DIR")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| PathBuf::from("./.pullman"));
                let path = dir.join("admin-token");
                crate::worker::read_token(&path).with_context(|| {
                    "no admin token: pass --token-file or set PULLMAN_ADMIN_TOKEN (the server \
                     writes a generated one to <data-dir>/admin-token)"
                })?
            }
        };
        Ok(Client::new(&self.server, &token)?)
    }
}

#[derive(Debug, Subcommand)]
pub enum AgentsCommand {
    /// Register an agent and print its token (shown once).
    Create(CreateAgent),
    /// List agents with their health.
    List,
    /// Show one agent.
    Get { id: Uuid },
    /// Retire an agent: its token is revoked and its claims return to PENDING.
    Retire { id: Uuid },
    /// Issue a new token for an agent, revoking the old one.
    RotateToken {
        id: Uuid,
        /// Write the token to this file (mode 0600) instead of printing it.
        #[arg(long)]
        token_out: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
pub struct CreateAgent {
    /// Unique name of the agent.
    #[arg(long)]
    pub name: String,
    /// Label (repeatable).
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// Annotation KEY=VALUE (repeatable).
    #[arg(long = "annotation", value_parser = parse_key_value)]
    pub annotations: Vec<(String, String)>,
    /// Work type it takes: build or custom (repeatable; default all).
    #[arg(long = "work-type")]
    pub work_types: Vec<String>,
    /// Tenant it serves (default: instance-wide).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Most claims held at once (default unlimited).
    #[arg(long)]
    pub max_concurrency: Option<i64>,
    /// Write the token to this file (mode 0600) instead of printing it.
    #[arg(long)]
    pub token_out: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum WorkOrdersCommand {
    /// Create a work order from a file of Kubernetes YAML (or a Shipwright Build).
    Create(CreateWorkOrder),
    /// List active work orders.
    List {
        /// Only this state: PENDING, CLAIMED or RETRY_PENDING.
        #[arg(long)]
        status: Option<String>,
        /// Only this work type: build or custom.
        #[arg(long)]
        work_type: Option<String>,
        /// Most orders shown (1-1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Show one active work order, with its YAML.
    Get { id: Uuid },
    /// Cancel a work order (it moves to the log as cancelled).
    Cancel { id: Uuid },
}

#[derive(Debug, Args)]
pub struct CreateWorkOrder {
    /// File with the YAML documents to apply (`-` for stdin).
    #[arg(short = 'f', long = "filename")]
    pub file: PathBuf,
    /// build or custom.
    #[arg(long, default_value = "custom")]
    pub work_type: String,
    /// Target agents with this label (repeatable).
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// Target the agent with this name (repeatable).
    #[arg(long = "agent-name")]
    pub agent_names: Vec<String>,
    /// Target the agent with this id (repeatable).
    #[arg(long = "agent-id")]
    pub agent_ids: Vec<Uuid>,
    /// Target agents with this annotation KEY=VALUE (repeatable).
    #[arg(long = "annotation", value_parser = parse_key_value)]
    pub annotations: Vec<(String, String)>,
    #[arg(long)]
    pub tenant: Option<String>,
    #[arg(long)]
    pub max_retries: Option<i64>,
    #[arg(long)]
    pub backoff_seconds: Option<i64>,
    #[arg(long)]
    pub claim_timeout_seconds: Option<i64>,
    #[arg(long)]
    pub max_reclaims: Option<i64>,
}

#[derive(Debug, Subcommand)]
pub enum LogCommand {
    /// List finished work orders, newest first.
    List {
        /// Only this work type: build or custom.
        #[arg(long)]
        work_type: Option<String>,
        /// true: succeeded only; false: failed or cancelled.
        #[arg(long)]
        success: Option<bool>,
        /// Only orders whose last claim was this agent's.
        #[arg(long)]
        agent_id: Option<Uuid>,
        /// Most entries shown (1-1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Show one finished work order.
    Get { id: Uuid },
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

fn print_json(v: &impl Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn print_table(headers: &[&str], rows: Vec<Vec<String>>) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_string()).collect());
    for row in rows {
        line(row);
    }
}

fn when(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref()
        .map(|x| x.to_string())
        .unwrap_or_else(|| "-".into())
}

fn write_token(path: &std::path::Path, token: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(format!("{token}\n").as_bytes())?;
    Ok(())
}

fn agent_rows(agents: &[Agent]) -> Vec<Vec<String>> {
    agents
        .iter()
        .map(|a| {
            vec![
                a.id.to_string(),
                a.name.clone(),
                serde_json::to_value(a.health)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default(),
                a.active_claims.to_string(),
                a.labels.join(","),
                opt(&a.last_seen_at.map(when)),
            ]
        })
        .collect()
}

const AGENT_HEADERS: &[&str] = &["ID", "NAME", "HEALTH", "CLAIMS", "LABELS", "LAST SEEN"];

/// `pullman agents …`.
pub async fn agents(conn: &Connection, cmd: AgentsCommand) -> anyhow::Result<()> {
    let client = conn.client()?;
    let json_out = conn.output == Output::Json;
    match cmd {
        AgentsCommand::Create(c) => {
            let body = NewAgent {
                name: c.name,
                labels: c.labels,
                annotations: c.annotations.into_iter().collect::<BTreeMap<_, _>>(),
                work_types: c.work_types,
                tenant: c.tenant,
                max_concurrency: c.max_concurrency,
                lease_seconds: None,
            };
            let created = client.register_agent(&body).await?;
            if let Some(path) = &c.token_out {
                write_token(path, &created.token)?;
            }
            if json_out {
                let mut v = serde_json::to_value(&created)?;
                if c.token_out.is_some() {
                    v["token"] = Value::Null;
                }
                print_json(&v)?;
            } else {
                print_table(
                    AGENT_HEADERS,
                    agent_rows(std::slice::from_ref(&created.agent)),
                );
                match &c.token_out {
                    Some(p) => println!("\ntoken written to {} (shown nowhere else)", p.display()),
                    None => println!("\ntoken (shown once): {}", created.token),
                }
            }
        }
        AgentsCommand::List => {
            let page = client.list_agents("limit=1000").await?;
            if json_out {
                print_json(&page.items)?;
            } else {
                print_table(AGENT_HEADERS, agent_rows(&page.items));
            }
        }
        AgentsCommand::Get { id } => {
            let page = client.list_agents("limit=1000").await?;
            let agent = page.items.into_iter().find(|a| a.id == id);
            let Some(agent) = agent else {
                bail!("agent {id} not found")
            };
            if json_out {
                print_json(&agent)?;
            } else {
                print_table(AGENT_HEADERS, agent_rows(&[agent]));
            }
        }
        AgentsCommand::Retire { id } => {
            let agent = client.retire_agent(id).await?;
            if json_out {
                print_json(&agent)?;
            } else {
                println!("agent {id} ({}) retired", agent.name);
            }
        }
        AgentsCommand::RotateToken { id, token_out } => {
            let rotated = client.rotate_token(id).await?;
            match &token_out {
                Some(p) => {
                    write_token(p, &rotated.token)?;
                    println!(
                        "new token written to {}; the old one is revoked",
                        p.display()
                    );
                }
                None if json_out => print_json(&rotated)?,
                None => println!(
                    "new token (shown once; the old one is revoked): {}",
                    rotated.token
                ),
            }
        }
    }
    Ok(())
}

fn order_rows(orders: &[WorkOrder]) -> Vec<Vec<String>> {
    orders
        .iter()
        .map(|o| {
            vec![
                o.id.to_string(),
                o.work_type.to_string(),
                o.status.as_str().to_string(),
                o.retry_count.to_string(),
                opt(&o.claimed_by),
                when(o.created_at),
            ]
        })
        .collect()
}

const ORDER_HEADERS: &[&str] = &["ID", "TYPE", "STATUS", "RETRIES", "CLAIMED BY", "CREATED"];

fn log_rows(entries: &[LogEntry]) -> Vec<Vec<String>> {
    entries
        .iter()
        .map(|e| {
            let mut message = e.message.clone().unwrap_or_default().replace('\n', " ");
            if message.chars().count() > 60 {
                message = message.chars().take(57).collect::<String>() + "...";
            }
            vec![
                e.id.to_string(),
                e.work_type.to_string(),
                e.outcome.as_str().to_string(),
                e.retry_count.to_string(),
                opt(&e.claimed_by),
                when(e.completed_at),
                message,
            ]
        })
        .collect()
}

const LOG_HEADERS: &[&str] = &[
    "ID",
    "TYPE",
    "OUTCOME",
    "RETRIES",
    "AGENT",
    "COMPLETED",
    "MESSAGE",
];

fn query(pairs: &[(&str, Option<String>)]) -> String {
    pairs
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", urlencode(v))))
        .collect::<Vec<_>>()
        .join("&")
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `pullman work-orders …`.
pub async fn work_orders(conn: &Connection, cmd: WorkOrdersCommand) -> anyhow::Result<()> {
    let client = conn.client()?;
    let json_out = conn.output == Output::Json;
    match cmd {
        WorkOrdersCommand::Create(c) => {
            let yaml = if c.file.as_os_str() == "-" {
                let mut s = String::new();
                std::io::stdin().read_to_string(&mut s)?;
                s
            } else {
                std::fs::read_to_string(&c.file)
                    .with_context(|| format!("reading {}", c.file.display()))?
            };
            let annotations: BTreeMap<String, String> = c.annotations.into_iter().collect();
            let mut body = json!({
                "work_type": c.work_type,
                "yaml_content": yaml,
                "targeting": {
                    "labels": c.labels, "agent_names": c.agent_names,
                    "agent_ids": c.agent_ids, "annotations": annotations,
                },
            });
            for (k, v) in [
                ("max_retries", c.max_retries),
                ("backoff_seconds", c.backoff_seconds),
                ("claim_timeout_seconds", c.claim_timeout_seconds),
                ("max_reclaims", c.max_reclaims),
            ] {
                if let Some(v) = v {
                    body[k] = json!(v);
                }
            }
            if let Some(t) = c.tenant {
                body["tenant"] = json!(t);
            }
            let mut order = client.create_work_order(&body).await?;
            if json_out {
                print_json(&order)?;
            } else {
                order.yaml_content = None;
                print_table(ORDER_HEADERS, order_rows(&[order]));
            }
        }
        WorkOrdersCommand::List {
            status,
            work_type,
            limit,
        } => {
            let q = query(&[
                ("status", status),
                ("work_type", work_type),
                ("limit", Some(limit.to_string())),
            ]);
            let page = client.list_work_orders(&q).await?;
            if json_out {
                print_json(&page.items)?;
            } else {
                print_table(ORDER_HEADERS, order_rows(&page.items));
                if page.items.is_empty() {
                    println!("(no active work orders; finished ones are in `pullman log list`)");
                }
            }
        }
        WorkOrdersCommand::Get { id } => {
            let order = match client.get_work_order(id).await {
                Err(e) if e.code() == Some("finished") => {
                    bail!("work order {id} already finished; see `pullman log get {id}`")
                }
                other => other?,
            };
            if json_out {
                print_json(&order)?;
            } else {
                print_table(ORDER_HEADERS, order_rows(std::slice::from_ref(&order)));
                if let Some(e) = &order.last_error {
                    println!("\nlast error: {e}");
                }
                println!("\n{}", order.yaml_content.unwrap_or_default());
            }
        }
        WorkOrdersCommand::Cancel { id } => {
            let entry = client.cancel_work_order(id).await?;
            if json_out {
                print_json(&entry)?;
            } else {
                println!("work order {id} cancelled");
            }
        }
    }
    Ok(())
}

/// `pullman log …`.
pub async fn log(conn: &Connection, cmd: LogCommand) -> anyhow::Result<()> {
    let client = conn.client()?;
    let json_out = conn.output == Output::Json;
    match cmd {
        LogCommand::List {
            work_type,
            success,
            agent_id,
            limit,
        } => {
            let q = query(&[
                ("work_type", work_type),
                ("success", success.map(|s| s.to_string())),
                ("agent_id", agent_id.map(|a| a.to_string())),
                ("limit", Some(limit.to_string())),
            ]);
            let page = client.list_log(&q).await?;
            if json_out {
                print_json(&page.items)?;
            } else {
                print_table(LOG_HEADERS, log_rows(&page.items));
            }
        }
        LogCommand::Get { id } => {
            let entry = client.get_log_entry(id).await?;
            if json_out {
                print_json(&entry)?;
            } else {
                print_table(LOG_HEADERS, log_rows(std::slice::from_ref(&entry)));
                println!("\nmessage:\n{}", entry.message.unwrap_or_default());
            }
        }
    }
    Ok(())
}
