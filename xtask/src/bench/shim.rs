//! `cargo xtask bench shim`.
pub fn run() -> anyhow::Result<()> {
    anyhow::bail!("bench shim is not implemented yet")
}
