//! Flight recorder: bounded ring of events and derived records; dump format and reader.
use clap::Args;

pub mod forensics;

#[derive(Debug, Args)]
pub struct DumpArgs {}

pub async fn run_dump(_args: DumpArgs) -> anyhow::Result<()> {
    anyhow::bail!("dump is not implemented yet")
}
