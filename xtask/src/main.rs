//! Project automation: set-up (toolchains, bpf-linker, packages), builds, tests, lab, benches.
//! Every command installs what it is missing first, idempotently.
use anyhow::Result;
use clap::{Parser, Subcommand};

mod bench;
mod fuzz;
mod lab;

#[derive(Debug, Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Benchmarks (figures, not pass/fail).
    Bench(bench::BenchArgs),
    /// The storm lab.
    Lab(lab::LabArgs),
    /// Fuzz the parsers and the dump reader.
    Fuzz(fuzz::FuzzArgs),
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Bench(a) => bench::run(a),
        Command::Lab(a) => lab::run(a),
        Command::Fuzz(a) => fuzz::run(a),
    }
}
