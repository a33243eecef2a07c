//! Helpers for the storm-lab tests: run `lab/lab.py` (the orchestrator) and read its result file.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// The workspace root (the lab and its scenarios live there).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Why the lab cannot run here, if it cannot: not root, or a runtime/tool is missing.
pub fn skip_reason() -> Option<String> {
    let uid_zero = std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    if !uid_zero {
        return Some("not root: the lab needs network namespaces".into());
    }
    for tool in ["ip", "python3", "go", "node", "iptables"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !found {
            return Some(format!("{tool} is not installed"));
        }
    }
    None
}

/// The machine-wide lab lock (`/run/ralab.lock`, the one lab/lab.py takes): one fleet per
/// machine, and another lab run (`cargo xtask lab` by someone else) must not be mistaken for
/// leftovers of ours. Hold it for the whole test; runs started meanwhile skip their own locking.
pub fn lock() -> Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/run/ralab.lock")
        .context("opening /run/ralab.lock")?;
    f.lock().context("locking /run/ralab.lock")?;
    Ok(f)
}

fn lab_command(args: &[&str]) -> Command {
    let mut c = Command::new("python3");
    c.arg(repo().join("lab/lab.py"))
        .args(args)
        .current_dir(repo())
        .env("RALAB_LOCK_HELD", "1");
    c
}

/// Run a scenario in the given modes; returns the parsed result.json.
pub fn run(scenario: &str, modes: &str, out: &str, extra: &[&str]) -> Result<Value> {
    let out_dir = repo().join("lab-out").join(out);
    let scenario = repo().join("lab/scenarios").join(scenario);
    let scenario = scenario.to_string_lossy();
    let out_s = out_dir.to_string_lossy();
    let mut args = vec!["run", &scenario, "--modes", modes, "--out", &out_s];
    args.extend_from_slice(extra);
    let status = lab_command(&args).status().context("starting lab/lab.py")?;
    if !status.success() {
        bail!("lab/lab.py {args:?} failed: {status}");
    }
    let text =
        std::fs::read_to_string(out_dir.join("result.json")).context("reading result.json")?;
    serde_json::from_str(&text).context("parsing result.json")
}

/// Start a run in the background (for the interruption test).
pub fn spawn(scenario: &str, modes: &str, out: &str) -> Result<Child> {
    let out_dir = repo().join("lab-out").join(out);
    let scenario = repo().join("lab/scenarios").join(scenario);
    lab_command(&[
        "run",
        &scenario.to_string_lossy(),
        "--modes",
        modes,
        "--out",
        &out_dir.to_string_lossy(),
    ])
    .spawn()
    .context("starting lab/lab.py")
}

/// What of the lab still exists: namespaces, links, iptables rules, processes.
pub fn leftovers() -> Result<Value> {
    let out = lab_command(&["leftovers"])
        .output()
        .context("lab/lab.py leftovers")?;
    serde_json::from_slice(&out.stdout).context("parsing leftovers")
}

/// True when nothing of the lab is left.
pub fn is_clean(v: &Value) -> bool {
    ["namespaces", "links", "rules", "pids"].iter().all(|k| {
        v.get(*k)
            .and_then(Value::as_array)
            .is_some_and(|a| a.is_empty())
    })
}

/// The result block of one mode, unless the lab skipped it (returns the reason then).
pub fn mode<'a>(result: &'a Value, name: &str) -> std::result::Result<&'a Value, String> {
    let m = result
        .get("modes")
        .and_then(Value::as_array)
        .and_then(|ms| {
            ms.iter()
                .find(|m| m.get("mode").and_then(Value::as_str) == Some(name))
        })
        .ok_or_else(|| format!("mode {name} missing from the result"))?;
    match m.get("skipped").and_then(Value::as_str) {
        Some(why) => Err(why.to_string()),
        None => Ok(m),
    }
}

/// Requests served by `node` in the fault window, as a multiple of the root rate.
pub fn served_x(mode: &Value, node: &str) -> f64 {
    mode.pointer(&format!("/nodes/{node}/served_x"))
        .and_then(Value::as_f64)
        .unwrap_or(f64::NAN)
}

/// Availability seen by the load generator at the root over the whole run.
pub fn availability(mode: &Value) -> f64 {
    mode.pointer("/root/availability")
        .and_then(Value::as_f64)
        .unwrap_or(f64::NAN)
}
