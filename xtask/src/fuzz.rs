//! `cargo xtask fuzz <target> [--seconds N]`: cargo-fuzz targets (not in CI's default path).
//!
//! The fuzz crate (fuzz/) is its own workspace on the pinned nightly (fuzz/rust-toolchain.toml);
//! cargo-fuzz is installed if missing. Targets read dictionaries from fuzz/dict/<target>.dict
//! when present; the corpus and crash artifacts stay under fuzz/ (git-ignored).
use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::{setup, sh};

#[derive(Debug, Args)]
pub struct FuzzArgs {
    /// Target name (a [[bin]] of fuzz/Cargo.toml: http1, http2, ...); `list` lists them.
    pub target: String,
    /// How long to fuzz.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Parallel fuzzing jobs.
    #[arg(long, default_value_t = 1)]
    pub jobs: u32,
}

fn fuzz_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz"))
}

fn targets() -> Result<Vec<String>> {
    let manifest = fuzz_dir().join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .with_context(|| format!("reading {}", manifest.display()))?;
    // Names of the [[bin]] sections, in order.
    let mut names = Vec::new();
    let mut in_bin = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if in_bin && let Some(v) = line.strip_prefix("name") {
            names.push(
                v.trim_start_matches([' ', '='])
                    .trim()
                    .trim_matches('"')
                    .to_string(),
            );
        }
    }
    Ok(names)
}

/// The pinned nightly of fuzz/rust-toolchain.toml.
fn toolchain() -> Result<String> {
    let path = fuzz_dir().join("rust-toolchain.toml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .find_map(|l| {
            l.trim().strip_prefix("channel").map(|v| {
                v.trim_start_matches([' ', '='])
                    .trim()
                    .trim_matches('"')
                    .to_string()
            })
        })
        .context("fuzz/rust-toolchain.toml names no channel")
}

fn ensure_cargo_fuzz() -> Result<()> {
    if sh::ok(
        Command::new("cargo").args(["fuzz", "--version"]),
        "cargo-fuzz",
    ) {
        return Ok(());
    }
    eprintln!("xtask: installing cargo-fuzz");
    sh::run(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))
}

pub fn run(args: FuzzArgs) -> Result<()> {
    let all = targets()?;
    if args.target == "list" {
        for t in all {
            println!("{t}");
        }
        return Ok(());
    }
    if !all.contains(&args.target) {
        bail!(
            "unknown fuzz target {:?}; targets: {}",
            args.target,
            all.join(", ")
        );
    }
    let tc = toolchain()?;
    setup::nightly(&tc)?;
    ensure_cargo_fuzz()?;
    let dir = fuzz_dir();
    let corpus = dir.join("corpus").join(&args.target);
    std::fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
    let mut cmd = Command::new("cargo");
    cmd.current_dir(&dir)
        .env("RUSTUP_TOOLCHAIN", &tc)
        // One target dir for fuzz builds, apart from the main one (different flags, nightly).
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .args(["fuzz", "run", "--release", &args.target])
        .arg(&corpus)
        .arg("--")
        .arg(format!("-max_total_time={}", args.seconds))
        .arg("-rss_limit_mb=2048")
        .arg("-max_len=8192")
        .arg("-print_final_stats=1");
    if args.jobs > 1 {
        cmd.arg(format!("-jobs={}", args.jobs))
            .arg(format!("-workers={}", args.jobs));
    }
    let dict = dir.join("dict").join(format!("{}.dict", args.target));
    if dict.is_file() {
        cmd.arg(format!("-dict={}", dict.display()));
    }
    sh::run(&mut cmd)?;
    // libFuzzer's final stats (executions, peak RSS) are printed above.
    eprintln!(
        "xtask: fuzzed {} for {} s (after the build) without a failure",
        args.target, args.seconds
    );
    Ok(())
}
