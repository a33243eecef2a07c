//! `cargo xtask bench correlate`.
pub fn run() -> anyhow::Result<()> {
    anyhow::bail!("bench correlate is not implemented yet")
}
