use clap::Parser;

use pullman::cli::{Cli, Command};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    pullman::telemetry::init_logging(cli.log_format);
    let result = match cli.command {
        Command::Serve(args) => pullman::serve::serve(args).await,
        Command::Migrate(args) => pullman::serve::migrate(args).await,
        Command::Crdgen => {
            print!("{}", pullman::crd::crds_yaml());
            Ok(())
        }
        Command::Executor(args) => pullman::executor::run(args).await,
        Command::Worker(args) => pullman::worker::run(args).await,
        Command::Agents { conn, command } => pullman::admin::agents(&conn, command).await,
        Command::WorkOrders { conn, command } => pullman::admin::work_orders(&conn, command).await,
        Command::Log { conn, command } => pullman::admin::log(&conn, command).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
