//! `cargo xtask lint`: rustfmt and clippy (warnings are errors) on both sides of the kernel
//! boundary. `cargo xtask test` runs it first, so CI keeps the tree as clean as it is now.
use std::process::Command;

use anyhow::Result;

use crate::{build, setup, sh::run};

pub fn run_lint() -> Result<()> {
    let root = setup::root();
    run(Command::new("cargo")
        .args(["fmt", "--all", "--check"])
        .current_dir(&root))?;
    run(Command::new("cargo")
        .args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ])
        .current_dir(&root)
        // As the builds and tests set it: a different value would rerun the agent's build
        // script and rebuild the agent for them.
        .env("RETRY_EBPF_OBJECT", build::ebpf_object()))?;
    // The eBPF crate: its own pinned nightly, which setup installs with rust-src only.
    let tc = setup::ebpf_toolchain()?;
    setup::nightly(&tc)?;
    run(Command::new("rustup").args([
        "component",
        "add",
        "--toolchain",
        &tc,
        "clippy",
        "rustfmt",
    ]))?;
    let ebpf = root.join("retry-ebpf");
    let nightly = |args: &[&str]| {
        let mut c = Command::new("cargo");
        c.arg(format!("+{tc}"))
            .args(args)
            .current_dir(&ebpf)
            // The userspace pin must not leak into the nightly's commands.
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("CARGO_TARGET_DIR");
        c
    };
    run(&mut nightly(&["fmt", "--check"]))?;
    run(&mut nightly(&[
        "clippy",
        "--release",
        "--",
        "-D",
        "warnings",
    ]))
}
