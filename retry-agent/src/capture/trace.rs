//! `retry-agent trace`: live events as JSON lines.
use clap::Args;

#[derive(Debug, Args)]
pub struct TraceArgs {}

pub async fn run(_args: TraceArgs) -> anyhow::Result<()> {
    anyhow::bail!("trace is not implemented yet")
}
