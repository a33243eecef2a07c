//! Builds: the eBPF object (pinned nightly, matched bpf-linker) and the agent that embeds it.
use std::{env, path::PathBuf, process::Command};

use anyhow::Result;

use crate::{setup, sh::run};

/// Builds retry-ebpf; returns the object's path.
pub fn ebpf() -> Result<PathBuf> {
    let tc = setup::ebpf_toolchain()?;
    setup::nightly(&tc)?;
    setup::bpf_linker(&tc)?;
    let dir = setup::root().join("retry-ebpf");
    let path = env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![setup::bpf_linker_root(&tc).join("bin")];
    paths.extend(env::split_paths(&path));
    run(Command::new("cargo")
        .arg(format!("+{tc}"))
        .args(["build", "--release"])
        .current_dir(&dir)
        .env("PATH", env::join_paths(paths)?)
        // The userspace pin must not leak into the nightly build.
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO_TARGET_DIR"))?;
    Ok(ebpf_object())
}

/// Where [`ebpf`] leaves the object (whether built yet or not).
pub fn ebpf_object() -> PathBuf {
    setup::root().join("retry-ebpf/target/bpfel-unknown-none/release/retry-ebpf")
}

/// Builds the agent with the freshly built object embedded.
pub fn agent(release: bool) -> Result<PathBuf> {
    let obj = ebpf()?;
    let mut cmd = Command::new("cargo");
    cmd.args(["build", "-p", "retry-agent"])
        .current_dir(setup::root())
        .env("RETRY_EBPF_OBJECT", &obj);
    if release {
        cmd.arg("--release");
    }
    run(&mut cmd)?;
    Ok(setup::root().join(if release {
        "target/release/retry-agent"
    } else {
        "target/debug/retry-agent"
    }))
}
