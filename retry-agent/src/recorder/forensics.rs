//! `retry-agent forensics`: offline replay of a dump through the live l7 + correlate code.
use clap::Args;

#[derive(Debug, Args)]
pub struct ForensicsArgs {}

pub fn run(_args: ForensicsArgs) -> anyhow::Result<()> {
    anyhow::bail!("forensics is not implemented yet")
}
