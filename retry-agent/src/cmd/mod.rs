//! The commands, above every stage: each subcommand's arguments (every setting once, as a flag
//! with an env var and a default) and the code that wires the stages together for it.
use std::ffi::OsString;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

pub mod budget;
pub mod dump;
pub mod forensics;
pub mod run;
pub mod shim;
pub mod trace;

pub use crate::settings::InvalidConfig;

#[derive(Debug, Parser)]
#[command(
    name = "retry-agent",
    version,
    about = "Kernel-assisted retry-storm detection and suppression"
)]
pub struct Cli {
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "RETRY_AGENT_LOG", default_value = "info", global = true)]
    pub log: String,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Observe the whole node: capture, correlate, decide, actuate, serve metrics and the API
    /// (the default).
    Run(Box<run::RunArgs>),
    /// Print live kernel events (or, with --exchanges, HTTP exchanges) as JSON lines.
    Trace(trace::TraceArgs),
    /// The transparent retry-suppression shim (iptables-steered proxy).
    Shim(shim::ShimArgs),
    /// Ask a running agent to write a flight-recorder dump.
    Dump(dump::DumpArgs),
    /// Replay a dump offline into an incident report.
    Forensics(forensics::ForensicsArgs),
}

impl Command {
    /// Run the subcommand to completion.
    pub async fn run(self) -> anyhow::Result<()> {
        match self {
            Command::Run(args) => run::run(*args).await,
            Command::Trace(args) => trace::run(args).await,
            Command::Shim(args) => shim::run(args).await,
            Command::Dump(args) => dump::run(args).await,
            Command::Forensics(args) => forensics::run(args),
        }
    }
}

/// Parses a command line (and the environment), then derives every bound it did not give from
/// the memory budget (`budget`). `main` calls this rather than `Cli::parse`.
pub fn parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cmd = Cli::command();
    let m = cmd.clone().try_get_matches_from(args)?;
    let mut cli = Cli::from_arg_matches(&m)?;
    let given = |name: &str| {
        let flags = cmd
            .find_subcommand(name)
            .zip(m.subcommand_matches(name))
            .map(|(c, sub)| budget::given_flags(c, sub))
            .unwrap_or_default();
        move |f: &str| flags.iter().any(|g| g == f)
    };
    match cli.command.as_mut() {
        Some(Command::Run(args)) => budget::apply(args, given("run")),
        Some(Command::Shim(args)) => shim::apply_budget(args, given("shim")),
        _ => {}
    }
    Ok(cli)
}

/// Every command line's settings: one default each, one prefix per stage, validation.
#[cfg(test)]
mod settings_tests;
