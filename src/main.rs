// Printing to stdout goes through `pullman::stdout` (a closed pipe must not panic).
#![deny(clippy::print_stdout)]

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

use pullman::cli::{Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    pullman::memory::return_large_blocks();
    let cli = Cli::parse();
    pullman::telemetry::init_logging(cli.log_format());
    let done = |r: anyhow::Result<()>| r.map(|()| ExitCode::SUCCESS);
    let result = match cli.command {
        Command::Serve { args, .. } => done(pullman::serve::serve(args).await),
        Command::Migrate { args, .. } => done(pullman::serve::migrate(args).await),
        Command::Crdgen => {
            pullman::stdout::write_all(pullman::crd::crds_yaml().as_bytes());
            Ok(ExitCode::SUCCESS)
        }
        Command::Executor { args, .. } => done(pullman::executor::run(args).await),
        Command::Worker { args, .. } => done(pullman::worker::run(args).await),
        Command::Agents { conn, command } => done(pullman::admin::agents(&conn, command).await),
        Command::WorkOrders { conn, command } => pullman::admin::work_orders(&conn, command).await,
        Command::Log { conn, command } => done(pullman::admin::log(&conn, command).await),
        Command::Completion { shell } => {
            // Into memory first: clap_complete panics on a failed write.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "pullman", &mut script);
            pullman::stdout::write_all(&script);
            Ok(ExitCode::SUCCESS)
        }
    };
    result.unwrap_or_else(|error| {
        eprintln!("error: {error:#}");
        ExitCode::FAILURE
    })
}
