//! `cargo xtask bench l7`.
pub fn run() -> anyhow::Result<()> {
    anyhow::bail!("bench l7 is not implemented yet")
}
