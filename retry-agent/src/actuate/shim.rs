//! `retry-agent shim`: the iptables-steered transparent proxy.
use clap::Args;

#[derive(Debug, Args)]
pub struct ShimArgs {}

pub async fn run(_args: ShimArgs) -> anyhow::Result<()> {
    anyhow::bail!("shim is not implemented yet")
}
