//! `cargo xtask fuzz <target> [--seconds N]`: cargo-fuzz targets (not in CI's default path).
use anyhow::Result;
use clap::Args;

#[derive(Debug, Args)]
pub struct FuzzArgs {}

pub fn run(_args: FuzzArgs) -> Result<()> {
    anyhow::bail!("fuzz is not implemented yet")
}
