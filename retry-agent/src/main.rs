//! Thin main: parse config, init logs, run, exit.
use anyhow::Result;
use clap::Parser;
use retry_agent::cli::{Cli, Command};

fn main() -> Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&cli.log)?)
        .with_writer(std::io::stderr)
        .init();
    match cli.command.unwrap_or(Command::Run) {
        Command::Run => {
            tracing::info!("retry-agent: nothing wired yet");
            Ok(())
        }
    }
}
