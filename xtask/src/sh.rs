//! Running commands: echo them, fail with their name and status.
use std::process::Command;

use anyhow::{Context, Result, bail};

pub fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: $ {}", show(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("starting {}", show(cmd)))?;
    if !status.success() {
        bail!("{} failed: {status}", show(cmd));
    }
    Ok(())
}

/// Whether the command succeeds and its stdout contains `needle`.
pub fn ok(cmd: &mut Command, needle: &str) -> bool {
    cmd.output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(needle))
}

fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}
