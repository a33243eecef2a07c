//! Command line: every setting once, as a flag with an env var and a default.
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "retry-agent", version, about = "Kernel-assisted retry-storm detection and suppression")]
pub struct Cli {
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "RETRY_AGENT_LOG", default_value = "info", global = true)]
    pub log: String,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Observe the whole node: capture, correlate, decide, serve metrics and the API (default).
    Run,
}
