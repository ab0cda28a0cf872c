//! Connecting an agent to the server: the token file, the `whoami` that names the agent, and the
//! retry policy when the server is not there yet (shared by the worker and the executor).

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::client::{Client, ClientError};

/// First wait after a failed call to the server; doubled per failure up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// Longest wait between two attempts to reach the server.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Capped exponential backoff: [`FIRST_BACKOFF`], doubled per failure, at most [`MAX_BACKOFF`].
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    failures: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: FIRST_BACKOFF,
            failures: 0,
        }
    }
}

impl Backoff {
    /// Records a failure; returns how long to wait before the next attempt.
    pub fn failed(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(MAX_BACKOFF);
        self.failures += 1;
        wait
    }

    /// Failures since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Records a success; returns how many failures came before it (0 if none).
    pub fn succeeded(&mut self) -> u32 {
        let failures = self.failures;
        *self = Backoff::default();
        failures
    }
}

/// Why an agent cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The server refused the token (401/403): the agent was retired or its token revoked or
    /// rotated. Retrying cannot help.
    #[error(
        "the server refused this agent's token ({0}); the agent was retired or its token revoked \
         or rotated: give a current token (pullman agents rotate-token) and start again"
    )]
    Unauthorized(#[source] ClientError),
    /// Stopped by a signal before connecting.
    #[error("stopped before connecting")]
    Stopped,
    /// The deadline passed before the server answered.
    #[error("the server did not answer in time")]
    DeadlinePassed,
    /// Anything else (unreadable token file, admin token, protocol error).
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// Connects with the token and learns which agent it belongs to. While the server cannot be
/// reached (or answers 5xx) it retries with [`Backoff`] until `stop` fires or `deadline` passes
/// (ending it with [`ConnectError::Stopped`] or
/// [`ConnectError::DeadlinePassed`]), logging each failure; a refused token ends at
/// once with [`ConnectError::Unauthorized`]. `stop` and `deadline` also cut short a request in
/// flight, so a server that accepts and never answers cannot hold a stopping agent for the
/// HTTP timeout (60 s). "connected" is logged when the server first answers.
pub async fn connect_as_agent(
    server: &str,
    token_file: &Path,
    stop: &CancellationToken,
    deadline: Option<tokio::time::Instant>,
) -> Result<(Client, Uuid), ConnectError> {
    let client = Client::new(server, &crate::client::read_token_file(token_file)?)
        .map_err(anyhow::Error::from)?;
    let mut backoff = Backoff::default();
    // A deadline that never comes when there is none.
    let until = async {
        match deadline {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(until);
    let me = loop {
        let answer = tokio::select! {
            _ = stop.cancelled() => return Err(ConnectError::Stopped),
            _ = &mut until => return Err(ConnectError::DeadlinePassed),
            r = client.whoami() => r,
        };
        match answer {
            Ok(me) => break me,
            Err(e) if e.is_unauthorized() => return Err(ConnectError::Unauthorized(e)),
            Err(e) if e.is_transient() => {
                let wait = backoff.failed();
                tracing::warn!(error = %e, server, retry_in = ?wait, "server not reachable; retrying");
                tokio::select! {
                    _ = stop.cancelled() => return Err(ConnectError::Stopped),
                    _ = &mut until => return Err(ConnectError::DeadlinePassed),
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            Err(e) => {
                return Err(ConnectError::Other(anyhow::Error::from(e).context(
                    format!(
                        "checking the token from {} against {server}",
                        token_file.display()
                    ),
                )));
            }
        }
    };
    let agent_id = me.agent_id.with_context(|| {
        format!(
            "the token in {} is the admin token; give an agent token (pullman agents create)",
            token_file.display()
        )
    })?;
    tracing::info!(agent = %agent_id, name = me.agent_name.as_deref().unwrap_or(""), server, "connected");
    Ok((client, agent_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_and_counts_failures() {
        let mut b = Backoff::default();
        let waits: Vec<_> = (0..10).map(|_| b.failed()).collect();
        assert_eq!(waits[0], FIRST_BACKOFF);
        assert_eq!(waits[1], FIRST_BACKOFF * 2);
        assert_eq!(*waits.last().unwrap(), MAX_BACKOFF);
        assert!(waits.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(b.succeeded(), 10);
        assert_eq!(b.succeeded(), 0);
        assert_eq!(b.failed(), FIRST_BACKOFF);
    }
}
