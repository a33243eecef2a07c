//! `cargo xtask test`: the whole suite, as CI runs it. Lint first (`cargo xtask lint`), unit
//! tests next (fast, no kernel), then the integration tests that load real programs and drive
//! real traffic (root needed).
use std::process::Command;

use anyhow::{Result, bail};
use clap::Args;

use crate::{
    build, lint, setup,
    sh::{machine_lock, run},
};

#[derive(Debug, Args)]
pub struct TestArgs {
    /// Only the unit tests (no kernel, no root).
    #[arg(long)]
    unit: bool,
    /// Only these integration test files (e.g. --only capture --only shim).
    #[arg(long)]
    only: Vec<String>,
    /// Skip `cargo xtask lint` (rustfmt and clippy), which runs first otherwise.
    #[arg(long)]
    no_lint: bool,
}

pub fn run_tests(args: TestArgs) -> Result<()> {
    if !args.unit {
        setup::all()?;
    }
    let obj = build::ebpf()?;
    // Lint first: a minute, and a formatting slip fails here rather than after the suite.
    if !args.no_lint {
        lint::run_lint()?;
    }
    let root = setup::root();
    run(Command::new("cargo")
        .args(["test", "--workspace", "--exclude", "integration-tests"])
        .current_dir(&root)
        .env("RETRY_EBPF_OBJECT", &obj))?;
    if args.unit {
        return Ok(());
    }
    if !setup::is_root() {
        bail!("integration tests load eBPF programs and create network namespaces: run as root");
    }
    let _machine = machine_lock("the integration tests")?;
    // The integration tests run the agent binary itself (trace, shim, the lab's agent modes):
    // build it now, with this object embedded, so no test runs a stale or partial build. The
    // memory test holds the release build (what users run) to the budget.
    build::agent(false)?;
    build::agent(true)?;
    let mut cmd = Command::new("cargo");
    // Every integration file runs even after one fails: a failure in the lab must not hide
    // what the files after it would say.
    cmd.args(["test", "--no-fail-fast", "-p", "integration-tests"])
        .current_dir(&root)
        .env("RETRY_EBPF_OBJECT", &obj);
    for t in &args.only {
        cmd.args(["--test", t]);
    }
    // Tests create namespaces, iptables rules and servers: one at a time keeps them from
    // contending for 2 cores and for the shared iptables tables.
    cmd.args(["--", "--test-threads=1"]);
    run(&mut cmd)
}
