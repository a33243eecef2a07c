//! `cargo xtask bench recorder`.
pub fn run() -> anyhow::Result<()> {
    anyhow::bail!("bench recorder is not implemented yet")
}
