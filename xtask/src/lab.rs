//! `cargo xtask lab`: the storm lab.
use anyhow::Result;
use clap::Args;

#[derive(Debug, Args)]
pub struct LabArgs {}

pub fn run(_args: LabArgs) -> Result<()> {
    anyhow::bail!("lab is not implemented yet")
}
