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

/// The machine-wide lock the integration tests and the benches take, held until dropped: both
/// load programs, start servers and saturate the 2 cores, so while one runs the other's
/// timings and figures mean nothing. A run that finds it taken says so and waits.
pub struct MachineLock {
    _held: std::fs::File,
}

const MACHINE_LOCK: &str = "/tmp/ra-integration.lock";

pub fn machine_lock(what: &str) -> Result<MachineLock> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(MACHINE_LOCK)
        .with_context(|| format!("opening {MACHINE_LOCK}"))?;
    match f.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            eprintln!(
                "xtask: {what} waits for {MACHINE_LOCK} (another test or bench run holds it)"
            );
            f.lock()
                .with_context(|| format!("locking {MACHINE_LOCK}"))?;
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {MACHINE_LOCK}"));
        }
    }
    Ok(MachineLock { _held: f })
}
