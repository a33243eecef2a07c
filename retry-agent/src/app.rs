//! The live pipeline: capture → l7 → correlate → decide → actuate, with the recorder tapping
//! every stage and metrics/API reading the results.
use clap::Args;

#[derive(Debug, Default, Args)]
pub struct RunArgs {}

pub async fn run(_args: RunArgs) -> anyhow::Result<()> {
    anyhow::bail!("the live pipeline is not wired yet")
}
