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
}

pub fn run(args: BenchArgs) -> Result<()> {
    match args.what {
        What::Capture => capture::run(),
        What::L7 => l7::run(),
        What::Correlate => correlate::run(),
        What::Shim => shim::run(),
        What::Recorder => recorder::run(),
    }
}
