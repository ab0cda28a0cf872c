//! Process signals shared by every long-running subcommand.

/// Resolves on the first SIGINT or SIGTERM, logging which arrived.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received; shutting down"),
        _ = term.recv() => tracing::info!("SIGTERM received; shutting down"),
    }
}
