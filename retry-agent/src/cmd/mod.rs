//! Command line: every setting once, as a flag with an env var and a default. Each subcommand's
//! arguments live beside the code that runs it.
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
    /// Observe the whole node: capture, correlate, decide, actuate, serve metrics and the API
    /// (the default).
    Run(Box<crate::app::RunArgs>),
    /// Print live kernel events (or, with --exchanges, HTTP exchanges) as JSON lines.
    Trace(crate::capture::trace::TraceArgs),
    /// The transparent retry-suppression shim (iptables-steered proxy).
    Shim(crate::actuate::shim::ShimArgs),
    /// Ask a running agent to write a flight-recorder dump.
    Dump(crate::recorder::DumpArgs),
    /// Replay a dump offline into an incident report.
    Forensics(crate::recorder::forensics::ForensicsArgs),
}
