//! `pullman agents …`: agents by name, id or unique id prefix (issue #15).

use std::collections::{BTreeMap, HashMap};

use anyhow::{Context, bail};
use serde_json::Value;
use uuid::Uuid;

use super::args::{AgentsCommand, Connection, Output};
use super::render::{opt, print_document, print_list, relative, when};
use super::{MAX_PAGE, collect_pages, query};
use crate::client::Client;
use crate::wire::{Agent, AgentHealth, NewAgent};

/// Every agent (all pages), for name look-ups and the AGENT column of order tables.
pub async fn all_agents(client: &Client) -> anyhow::Result<Vec<Agent>> {
    let (agents, _) = collect_pages(usize::MAX, true, MAX_PAGE, |size, cursor| {
        let q = query(&[("limit", Some(size.to_string())), ("cursor", cursor)]);
        async move { client.list_agents(&q).await }
    })
    .await?;
    Ok(agents)
}

/// Agent id → name, to show names where the API gives ids.
pub async fn agent_names(client: &Client) -> anyhow::Result<HashMap<Uuid, String>> {
    Ok(all_agents(client)
        .await?
        .into_iter()
        .map(|a| (a.id, a.name))
        .collect())
}

/// Resolves what the user typed to one agent id: a full id, an agent's name, or a unique prefix
/// of an id (as git and docker take). Names win over prefixes: `cafe` is the agent named `cafe`
/// if there is one. A name freed by retirement may be reused (names are unique among live
/// agents, docs/design.md §5): a name means its live agent, else the newest retired one. Errors:
/// no agent matches; the prefix matches several (they are listed).
pub async fn resolve_agent(client: &Client, given: &str) -> anyhow::Result<Uuid> {
    if let Ok(id) = Uuid::parse_str(given) {
        return Ok(id);
    }
    let agents = all_agents(client).await?;
    if let Some(a) = by_name(&agents, given) {
        return Ok(a.id);
    }
    let prefix = given.replace('-', "").to_ascii_lowercase();
    let matches: Vec<&Agent> =
        if !prefix.is_empty() && prefix.chars().all(|c| c.is_ascii_hexdigit()) {
            agents
                .iter()
                .filter(|a| a.id.simple().to_string().starts_with(&prefix))
                .collect()
        } else {
            Vec::new()
        };
    match matches.as_slice() {
        [] => bail!("no agent is named {given:?} or has an id starting with it"),
        [one] => Ok(one.id),
        many => bail!(
            "{given:?} is ambiguous: {} agents' ids start with it:\n{}",
            many.len(),
            many.iter()
                .map(|a| format!("  {}  {}", a.id, a.name))
                .collect::<Vec<_>>()
                .join("\n")
        ),
    }
}

/// The agent a name means: the live one, else the newest retired one.
fn by_name<'a>(agents: &'a [Agent], name: &str) -> Option<&'a Agent> {
    agents
        .iter()
        .filter(|a| a.name == name)
        .max_by_key(|a| (a.health != AgentHealth::Retired, a.created_at))
}

fn health(a: &Agent) -> String {
    serde_json::to_value(a.health)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

fn agent_rows(agents: &[Agent], wide: bool) -> Vec<Vec<String>> {
    let now = chrono::Utc::now();
    agents
        .iter()
        .map(|a| {
            let mut row = vec![
                a.id.to_string(),
                a.name.clone(),
                health(a),
                a.active_claims.to_string(),
                a.labels.join(","),
                a.last_seen_at
                    .map(|t| relative(t, now))
                    .unwrap_or_else(|| "never".into()),
            ];
            if wide {
                row.extend([
                    opt(&a.tenant),
                    if a.work_types.is_empty() {
                        "all".into()
                    } else {
                        a.work_types
                            .iter()
                            .map(|w| w.to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    },
                    a.max_concurrency
                        .map(|m| m.to_string())
                        .unwrap_or_else(|| "unlimited".into()),
                    a.annotations
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(","),
                    when(a.created_at),
                ]);
            }
            row
        })
        .collect()
}

const AGENT_HEADERS: &[&str] = &["ID", "NAME", "HEALTH", "CLAIMS", "LABELS", "LAST SEEN"];
const AGENT_WIDE_HEADERS: &[&str] = &[
    "ID",
    "NAME",
    "HEALTH",
    "CLAIMS",
    "LABELS",
    "LAST SEEN",
    "TENANT",
    "WORK TYPES",
    "MAX CLAIMS",
    "ANNOTATIONS",
    "CREATED",
];

fn print_agents(output: Output, agents: &[Agent]) -> anyhow::Result<()> {
    print_list(
        output,
        agents,
        |a| a.name.clone(),
        (AGENT_HEADERS, AGENT_WIDE_HEADERS),
        |wide| agent_rows(agents, wide),
        2,
    );
    Ok(())
}

/// A token file being written (`--token-out`): made before the server is asked for the token,
/// so a path that cannot be written fails before an agent is registered or a token rotated
/// (either would otherwise leave a token nobody has). The token goes to a temporary file created
/// 0600 next to the target and is renamed over it, so the file ends 0600 whatever existed there
/// before (README: "mode 0600").
pub struct TokenOut {
    path: std::path::PathBuf,
    temp: std::path::PathBuf,
    file: Option<std::fs::File>,
}

impl TokenOut {
    /// Checks `path` and creates the temporary file. Errors: the folder is missing or not
    /// writable, or `path` is a directory.
    pub fn prepare(path: &std::path::Path) -> anyhow::Result<TokenOut> {
        use std::os::unix::fs::OpenOptionsExt;
        if path.is_dir() {
            bail!(
                "--token-out {} is a directory; give a file path",
                path.display()
            );
        }
        let name = path
            .file_name()
            .with_context(|| format!("--token-out {} names no file", path.display()))?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        };
        if !dir.is_dir() {
            bail!(
                "--token-out {}: the folder {} does not exist; create it first",
                path.display(),
                dir.display()
            );
        }
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".tmp-{}", std::process::id()));
        let temp = dir.join(temp_name);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
            .with_context(|| {
                format!(
                    "--token-out {}: cannot write in {}",
                    path.display(),
                    dir.display()
                )
            })?;
        Ok(TokenOut {
            path: path.to_path_buf(),
            temp,
            file: Some(file),
        })
    }

    /// Writes the token and moves it into place (mode 0600).
    pub fn commit(mut self, token: &str) -> anyhow::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::PermissionsExt;
        let mut file = self.file.take().expect("committed once");
        file.write_all(format!("{token}\n").as_bytes())?;
        // A umask never adds bits, but say it outright: only the owner reads a token.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.sync_all()?;
        std::fs::rename(&self.temp, &self.path)
            .with_context(|| format!("writing {}", self.path.display()))?;
        Ok(())
    }
}

impl Drop for TokenOut {
    fn drop(&mut self) {
        // Not committed (the server refused, or writing failed): leave nothing behind.
        if self.file.is_some() || self.temp.exists() {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// The registration body's fields and the flags of `agents create` that set them.
const AGENT_FLAGS: &[(&str, &str)] = &[
    ("work_types", "--work-type"),
    ("max_concurrency", "--max-concurrency"),
    ("labels", "--label"),
    ("annotations", "--annotation"),
];

/// `pullman agents …`.
pub async fn agents(conn: &Connection, cmd: AgentsCommand) -> anyhow::Result<()> {
    let client = conn.client()?;
    let output = conn.output;
    match cmd {
        AgentsCommand::Create(c) => {
            let body = NewAgent {
                name: c.name,
                labels: c.labels,
                annotations: c.annotations.into_iter().collect::<BTreeMap<_, _>>(),
                work_types: c.work_types.iter().map(|t| t.as_str().into()).collect(),
                tenant: c.tenant,
                max_concurrency: c.max_concurrency,
                lease_seconds: None,
            };
            let token_out = c.token_out.as_deref().map(TokenOut::prepare).transpose()?;
            let created = client
                .register_agent(&body)
                .await
                .map_err(|e| super::in_flag_words(e, AGENT_FLAGS))?;
            if let Some(out) = token_out {
                out.commit(&created.token).with_context(|| {
                    format!(
                        "agent {} was registered but its token could not be saved; issue a new \
                         one with `pullman agents rotate-token {} --token-out FILE`",
                        created.agent.name, created.agent.name
                    )
                })?;
            }
            let mut doc = serde_json::to_value(&created)?;
            if c.token_out.is_some() {
                doc["token"] = Value::Null;
            }
            if !print_document(output, &doc)? {
                print_agents(output, std::slice::from_ref(&created.agent))?;
                if output != Output::Name {
                    match &c.token_out {
                        Some(p) => {
                            crate::outln!("\ntoken written to {} (shown nowhere else)", p.display())
                        }
                        None => crate::outln!("\ntoken (shown once): {}", created.token),
                    }
                }
            }
        }
        AgentsCommand::List { limit } => {
            let (agents, more) = collect_pages(limit, false, MAX_PAGE, |size, cursor| {
                let q = query(&[("limit", Some(size.to_string())), ("cursor", cursor)]);
                let client = &client;
                async move { client.list_agents(&q).await }
            })
            .await?;
            if !print_document(output, &agents)? {
                print_agents(output, &agents)?;
                if more && output != Output::Name {
                    eprintln!("(more agents: raise --limit)");
                }
            }
        }
        AgentsCommand::Get { agent } => {
            let id = resolve_agent(&client, &agent).await?;
            let agent = client.get_agent(id).await?;
            if !print_document(output, &agent)? {
                print_agents(output, std::slice::from_ref(&agent))?;
            }
        }
        AgentsCommand::Retire { agent } => {
            let id = resolve_agent(&client, &agent).await?;
            let agent = client.retire_agent(id).await?;
            if !print_document(output, &agent)? {
                match output {
                    Output::Name => crate::outln!("{}", agent.name),
                    _ => crate::outln!("agent {} ({id}) retired", agent.name),
                }
            }
        }
        AgentsCommand::RotateToken { agent, token_out } => {
            let id = resolve_agent(&client, &agent).await?;
            let out = token_out.as_deref().map(TokenOut::prepare).transpose()?;
            let rotated = client.rotate_token(id).await?;
            match (&token_out, out) {
                (Some(p), Some(out)) => {
                    out.commit(&rotated.token).with_context(|| {
                        format!(
                            "the token of {} was rotated (the old one is revoked) but the new \
                             one could not be saved; rotate again",
                            rotated.agent.name
                        )
                    })?;
                    crate::outln!(
                        "new token for {} written to {}; the old one is revoked",
                        rotated.agent.name,
                        p.display()
                    );
                }
                _ => {
                    if !print_document(output, &rotated)? {
                        crate::outln!(
                            "new token for {} (shown once; the old one is revoked): {}",
                            rotated.agent.name,
                            rotated.token
                        )
                    }
                }
            }
        }
    }
    Ok(())
}
