//! `cargo xtask bench <what>`: figures for the issue notes, never pass/fail.
use anyhow::Result;
use clap::{Args, ValueEnum};

mod capture;
mod correlate;
mod l7;
mod recorder;
mod shim;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum What {
    Capture,
    L7,
    Correlate,
    Shim,
    Recorder,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    what: What,
    /// capture: the same load over HTTPS (haproxy and wrk on the shared OpenSSL), so the figures
    /// include the TLS uprobes.
    #[arg(long)]
    tls: bool,
}

pub fn run(args: BenchArgs) -> Result<()> {
    if cfg!(debug_assertions) {
        // Figures from an unoptimised build mean nothing: re-run this bench from a release build.
        let what = args.what.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        return crate::sh::run(
            std::process::Command::new(cargo)
                .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
                .args(["run", "--release", "--quiet", "--package", "xtask", "--", "bench", &what])
                .args(args.tls.then_some("--tls")),
        );
    }
    match args.what {
        What::Capture => capture::run(args.tls),
        What::L7 => l7::run(),
        What::Correlate => correlate::run(),
        What::Shim => shim::run(),
        What::Recorder => recorder::run(),
    }
}
