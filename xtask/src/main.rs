//! Project automation: set-up (toolchains, bpf-linker, packages), builds, tests, lab, benches.
//! Every command installs what it is missing first, idempotently.
use std::{os::unix::process::CommandExt, process::Command};

use anyhow::{Result, bail};
use clap::{Parser, Subcommand};

mod bench;
mod build;
mod fuzz;
mod image;
mod lab;
mod lint;
mod setup;
mod sh;
mod test;

#[derive(Debug, Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Install what is missing: Debian and Python packages, the eBPF nightly, bpf-linker.
    Setup,
    /// Build the eBPF object.
    BuildEbpf,
    /// Build the agent (release) with the eBPF object embedded.
    Build,
    /// Build the agent's OCI image (an OCI layout tar that `ctr images import` reads).
    Image(image::ImageArgs),
    /// Set up, build, and run the agent on embedded defaults (observing the whole node).
    Run {
        /// Arguments passed to `retry-agent` (default: `run`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up and run the whole test suite (lint, unit, then kernel/network integration tests).
    Test(test::TestArgs),
    /// rustfmt and clippy (warnings are errors), userspace and eBPF crates.
    Lint,
    /// Benchmarks (figures, not pass/fail).
    Bench(bench::BenchArgs),
    /// The storm lab.
    Lab(lab::LabArgs),
    /// Fuzz the parsers and the dump reader.
    Fuzz(fuzz::FuzzArgs),
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Task::Setup => setup::all(),
        Task::BuildEbpf => build::ebpf().map(|p| println!("{}", p.display())),
        Task::Build => build::agent(true).map(|p| println!("{}", p.display())),
        Task::Run { args } => {
            setup::agent()?;
            let bin = build::agent(true)?;
            if !setup::is_root() {
                bail!("the agent loads eBPF programs: run as root (sudo -E cargo xtask run)");
            }
            let args = if args.is_empty() {
                vec!["run".to_string()]
            } else {
                args
            };
            // exec: signals go straight to the agent, which detaches everything on exit.
            Err(Command::new(bin).args(args).exec().into())
        }
        Task::Image(a) => image::run(a),
        Task::Test(a) => test::run_tests(a),
        Task::Lint => lint::run_lint(),
        Task::Bench(a) => bench::run(a),
        Task::Lab(a) => lab::run(a),
        Task::Fuzz(a) => fuzz::run(a),
    }
}
