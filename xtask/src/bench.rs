//! `cargo xtask bench <what>`: figures for the issue notes, never pass/fail. The benches are the
//! `retry-bench` crate (they link the agent's library; xtask does not): this builds the eBPF
//! object and, for the benches that start the agent, the agent through `build::agent`, then runs
//! `retry-bench` in release with the same object, so nothing is rebuilt with a different one.
use std::process::Command;

use anyhow::Result;
use clap::{Args, ValueEnum};

use crate::{build, setup, sh};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum What {
    Capture,
    L7,
    Correlate,
    Shim,
    Recorder,
    /// none / floor (empty programs on the same hooks) / agent, for haproxy, nginx, Go and TLS.
    Overhead,
    /// The agent's userspace CPU per quiet keep-alive request, from its kernel summaries.
    Quiet,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    what: What,
    /// capture: the same load over HTTPS (haproxy and wrk on the shared OpenSSL), so the figures
    /// include the TLS uprobes.
    #[arg(long)]
    tls: bool,
    /// overhead: only these rows (default haproxy, nginx, go, tls, h2c; also haproxy-whole,
    /// nginx-whole, nginx-256, go-whole, go-uprobes, go-off).
    #[arg(long)]
    rows: Option<String>,
    /// overhead, shim: rounds (every row or path once per round; default 3 for overhead, 1 for
    /// the shim); medians and the ratios' ranges are printed.
    #[arg(long)]
    rounds: Option<usize>,
}

pub fn run(args: BenchArgs) -> Result<()> {
    let what = args
        .what
        .to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_default();
    let obj = build::ebpf()?;
    let mut cmd = Command::new("cargo");
    cmd.current_dir(setup::root())
        .env("RETRY_EBPF_OBJECT", &obj)
        .args([
            "run",
            "--release",
            "--quiet",
            "--package",
            "retry-bench",
            "--",
            &what,
        ])
        .args(args.tls.then_some("--tls"));
    if let Some(rows) = &args.rows {
        cmd.args(["--rows", rows]);
    }
    if let Some(n) = args.rounds {
        cmd.args(["--rounds", &n.to_string()]);
    }
    if matches!(args.what, What::Overhead) {
        setup::bench_packages()?;
    }
    if matches!(args.what, What::Capture | What::Shim | What::Overhead) {
        // The shim bench can measure a debug build of the agent; the others never do.
        let release = matches!(args.what, What::Capture | What::Overhead)
            || std::env::var("RA_BENCH_PROFILE").map_or(true, |p| p != "debug");
        eprintln!(
            "building the agent ({})…",
            if release { "release" } else { "debug" }
        );
        cmd.arg("--agent-bin").arg(build::agent(release)?);
    }
    if matches!(args.what, What::Shim) {
        setup::envoy()?;
        if let Some(envoy) = setup::envoy_bin() {
            cmd.env("RETRY_AGENT_ENVOY", envoy);
        }
    }
    // Not while the integration tests (or another bench) load the cores.
    let _machine = sh::machine_lock("the bench")?;
    sh::run(&mut cmd)
}
