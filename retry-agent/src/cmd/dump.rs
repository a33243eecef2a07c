//! `retry-agent dump`: ask a running agent to write a flight-recorder dump; prints its path.
use std::time::Duration;

use clap::Args;

use crate::recorder::client::request_dump;

#[derive(Debug, Args)]
pub struct DumpArgs {
    /// The running agent's private API: `unix:` and its `--api-socket` (dumps are not served on
    /// its TCP address).
    #[arg(
        long,
        env = "RETRY_AGENT_API",
        default_value = "unix:/run/retry-agent/api.sock"
    )]
    pub api: String,
    /// Free-text reason, kept in the dump header.
    #[arg(long)]
    pub reason: Option<String>,
    /// How long to wait for the agent to write the dump, in seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout_secs: u64,
}

pub async fn run(args: DumpArgs) -> anyhow::Result<()> {
    let path = request_dump(
        &args.api,
        args.reason,
        Duration::from_secs(args.timeout_secs),
    )
    .await?;
    println!("{path}");
    Ok(())
}
