//! `cargo xtask bench capture`.
pub fn run() -> anyhow::Result<()> {
    anyhow::bail!("bench capture is not implemented yet")
}
