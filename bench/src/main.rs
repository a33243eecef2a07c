//! `retry-bench <what>`: the benchmarks `cargo xtask bench` runs (figures for the issue notes,
//! never pass/fail). A crate of its own because they link the agent's library: xtask stays small
//! and builds the agent (with its fresh eBPF object) the same way as every other task, then runs
//! this release binary with `--agent-bin` for the benches that start the agent.
use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Parser, ValueEnum};

mod bpf_stats;
mod capture;
mod correlate;
mod l7;
mod overhead;
mod quiet;
mod recorder;
mod rounds;
mod shim;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum What {
    Capture,
    L7,
    Correlate,
    Shim,
    Recorder,
    Overhead,
    /// Userspace CPU per quiet keep-alive request, from its summary records (decode, pipeline, recorder).
    Quiet,
}

#[derive(Debug, Parser)]
#[command(name = "retry-bench")]
struct Cli {
    what: What,
    /// capture: the same load over HTTPS (haproxy and wrk on the shared OpenSSL), so the figures
    /// include the TLS uprobes.
    #[arg(long)]
    tls: bool,
    /// capture, shim, overhead: the retry-agent binary to start (xtask builds it with the eBPF object).
    #[arg(long)]
    agent_bin: Option<PathBuf>,
    /// overhead: the rows to measure (when not given: haproxy, nginx, go, tls, h2c; the others
    /// are variants of those for a closer look).
    #[arg(long, value_delimiter = ',')]
    rows: Vec<overhead::Server>,
    /// overhead, shim: how many times every row or path runs (overhead: none → floor → agent in
    /// each round); medians and each ratio's range over the rounds' own ratios are printed.
    /// Default: 3 for overhead (one round's ratio moves ±10% on a shared 2-core machine), 1 for
    /// the shim.
    #[arg(long, env = "RA_BENCH_ROUNDS")]
    rounds: Option<usize>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if cfg!(debug_assertions) {
        bail!(
            "figures from an unoptimised build mean nothing: run `cargo xtask bench` (it builds --release)"
        );
    }
    let agent_bin = || match &cli.agent_bin {
        Some(b) => Ok(b.clone()),
        None => {
            bail!("this bench starts the agent: pass --agent-bin (cargo xtask bench builds it)")
        }
    };
    // Zero rounds would measure nothing: one is the least.
    let rounds = |default: usize| cli.rounds.unwrap_or(default).max(1);
    match cli.what {
        What::Capture => capture::run(&agent_bin()?, cli.tls),
        What::L7 => l7::run(),
        What::Correlate => correlate::run(),
        What::Shim => shim::run(&agent_bin()?, rounds(1)),
        What::Recorder => recorder::run(),
        What::Overhead => overhead::run(&agent_bin()?, &cli.rows, rounds(3)),
        What::Quiet => quiet::run(),
    }
}

/// CPU time of the calling thread, in nanoseconds: what the single-core benches divide by.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

/// Whether this process runs as root.
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}
