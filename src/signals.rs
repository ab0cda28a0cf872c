//! Process signals shared by every long-running subcommand.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// SIGINT and SIGTERM, caught from the moment [`Signals::install`] returns.
///
/// Installed before a process says it is ready, and kept for its life: a signal that arrives
/// before anyone waits for it is kept for the next [`Signals::recv`]. Waiting with a handler made
/// on the spot left a window after readiness in which SIGTERM still had its default action, and
/// `serve` died of it without its shutdown (seen in CI).
pub struct Signals {
    int: Signal,
    term: Signal,
}

impl Signals {
    /// Installs the handlers. Must run inside the tokio runtime. Errors: the OS refused a handler.
    pub fn install() -> std::io::Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }

    /// Resolves on the next SIGINT or SIGTERM (one already delivered counts), logging which.
    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => tracing::info!("SIGINT received; shutting down"),
            _ = self.term.recv() => tracing::info!("SIGTERM received; shutting down"),
        }
    }
}
