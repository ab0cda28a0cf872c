//! Authentication (docs/design.md §5): `Authorization: Bearer <token>` with two scopes, **admin**
//! (everything) and **agent** (bound to one agent). Missing or bad token: `401`; an agent acting
//! for another agent or on an admin route: `403`.

pub mod cache;
pub mod token;

use std::path::{Path, PathBuf};

use subtle::ConstantTimeEq;
use uuid::Uuid;

use crate::queue::{Queue, QueueError};

pub use cache::VerifiedTokens;

/// Result of checking an agent bearer token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenCheck {
    /// The token is live and bound to this agent.
    Valid { agent_id: Uuid },
    /// Unknown, revoked, its agent retired, or the secret does not match.
    Invalid,
}

/// Checks an agent bearer token (docs/design.md §5) against the queue's stored hash, comparing the
/// secret in constant time. A token verified within the last second is trusted without a
/// database read ([`cache`]); revocation through this process takes effect at once, through
/// another replica within that second.
pub async fn check_agent_token(
    text: &str,
    verified: &VerifiedTokens,
    queue: &Queue,
) -> Result<TokenCheck, QueueError> {
    let Some((token_id, secret)) = token::parse_agent_token(text) else {
        return Ok(TokenCheck::Invalid);
    };
    // Read before the database, so a revocation committed meanwhile voids what we remember.
    let revocations = queue.token_revocations();
    if let Some(agent_id) = verified.agent_for(token_id, secret, revocations) {
        return Ok(TokenCheck::Valid { agent_id });
    }
    Ok(match queue.live_agent_token(token_id).await? {
        Some(stored) if token::verify(secret, &stored.secret_hash) => {
            verified.remember(token_id, secret, stored.agent_id, revocations);
            TokenCheck::Valid {
                agent_id: stored.agent_id,
            }
        }
        _ => TokenCheck::Invalid,
    })
}

/// Who is calling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Principal {
    Admin,
    Agent(Uuid),
}

/// Why a request was not authenticated or not allowed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// `401`: no usable bearer token.
    #[error("{0}")]
    Unauthenticated(&'static str),
    /// `403`: authenticated, but not allowed to do this.
    #[error("{0}")]
    Forbidden(String),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

/// The admin token, held only as its SHA-256 hash.
#[derive(Clone)]
pub struct AdminToken {
    hash: Vec<u8>,
}

/// Where the admin token came from, for the start-up log line (never the token itself).
#[derive(Debug, Clone)]
pub enum AdminTokenSource {
    Environment,
    File(PathBuf),
    Generated(PathBuf),
}

impl AdminToken {
    /// Wraps a token given in the clear; it is hashed at once.
    pub fn from_secret(secret: &str) -> Self {
        AdminToken {
            hash: token::hash(secret),
        }
    }

    /// Loads the admin token (docs/design.md §5, issue: from `PULLMAN_ADMIN_TOKEN`, else
    /// `--admin-token-file`, else the generated `<data_dir>/admin-token`, created with mode 0600
    /// on first start and reused after). Errors name the file that could not be read or written.
    pub fn load(
        from_env: Option<&str>,
        file: Option<&Path>,
        data_dir: &Path,
    ) -> anyhow::Result<(Self, AdminTokenSource)> {
        use anyhow::Context;
        if let Some(secret) = from_env.map(str::trim).filter(|s| !s.is_empty()) {
            return Ok((Self::from_secret(secret), AdminTokenSource::Environment));
        }
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --admin-token-file {}", path.display()))?;
            let secret = text.trim();
            anyhow::ensure!(
                !secret.is_empty(),
                "--admin-token-file {} is empty",
                path.display()
            );
            return Ok((
                Self::from_secret(secret),
                AdminTokenSource::File(path.to_path_buf()),
            ));
        }
        let path = data_dir.join("admin-token");
        if let Ok(text) = std::fs::read_to_string(&path)
            && !text.trim().is_empty()
        {
            return Ok((
                Self::from_secret(text.trim()),
                AdminTokenSource::Generated(path),
            ));
        }
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("creating data directory {}", data_dir.display()))?;
        let secret = format!("pullman_admin_{}", token::random_secret());
        write_private(&path, &format!("{secret}\n"))
            .with_context(|| format!("writing admin token to {}", path.display()))?;
        Ok((
            Self::from_secret(&secret),
            AdminTokenSource::Generated(path),
        ))
    }

    fn matches(&self, presented: &str) -> bool {
        token::hash(presented).ct_eq(&self.hash).into()
    }
}

/// Writes a file readable by its owner only (mode 0600), creating it exclusively.
fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(contents.as_bytes())
}

/// Resolves the `Authorization` header value to a principal. Admin tokens are checked in memory;
/// agent tokens with [`check_agent_token`].
pub async fn authenticate(
    header: Option<&str>,
    admin: &AdminToken,
    verified: &VerifiedTokens,
    queue: &Queue,
) -> Result<Principal, AuthError> {
    let header = header.ok_or(AuthError::Unauthenticated(
        "missing Authorization: Bearer <token> header",
    ))?;
    let presented = header
        .strip_prefix("Bearer ")
        .or_else(|| header.strip_prefix("bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or(AuthError::Unauthenticated(
            "Authorization header must be 'Bearer <token>'",
        ))?;
    if admin.matches(presented) {
        return Ok(Principal::Admin);
    }
    match check_agent_token(presented, verified, queue).await? {
        TokenCheck::Valid { agent_id } => Ok(Principal::Agent(agent_id)),
        TokenCheck::Invalid => Err(AuthError::Unauthenticated(
            "token is not valid (unknown, revoked, or its agent is retired)",
        )),
    }
}

impl Principal {
    /// Admin routes: `403` for agent tokens.
    pub fn require_admin(self) -> Result<(), AuthError> {
        match self {
            Principal::Admin => Ok(()),
            Principal::Agent(_) => Err(AuthError::Forbidden(
                "this route needs the admin token; agent tokens may only list, claim, heartbeat \
                 and complete"
                    .into(),
            )),
        }
    }

    /// Agent routes: the admin may act for any agent; an agent token only for its own agent.
    pub fn require_agent(self, agent_id: Uuid) -> Result<(), AuthError> {
        match self {
            Principal::Admin => Ok(()),
            Principal::Agent(own) if own == agent_id => Ok(()),
            Principal::Agent(_) => Err(AuthError::Forbidden(format!(
                "this token belongs to another agent, not to agent_id {agent_id}"
            ))),
        }
    }
}
