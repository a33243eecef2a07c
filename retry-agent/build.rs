//! Embeds the eBPF objects built by `cargo xtask build-ebpf`: the capture's (`retry-ebpf`) and,
//! from the same directory, the shim's kernel steering (`retry-steer`).
//!
//! Pure-logic work (l7, correlate, decide) must not need the BPF toolchain, so a missing object
//! embeds an empty file and the agent says how to build it when `run`/`trace` try to load it.
use std::{env, fs, path::PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=RETRY_EBPF_OBJECT");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let default = manifest.join("../retry-ebpf/target/bpfel-unknown-none/release/retry-ebpf");
    let obj = env::var_os("RETRY_EBPF_OBJECT")
        .map(PathBuf::from)
        .unwrap_or(default);
    println!("cargo:rerun-if-changed={}", obj.display());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap_or_default()).join("retry-ebpf.o");
    let bytes = fs::read(&obj).unwrap_or_default();
    if let Err(e) = fs::write(&out, &bytes) {
        panic!("writing {}: {e}", out.display());
    }
    let steer = obj.with_file_name("retry-steer");
    println!("cargo:rerun-if-changed={}", steer.display());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap_or_default()).join("retry-steer.o");
    if let Err(e) = fs::write(&out, fs::read(&steer).unwrap_or_default()) {
        panic!("writing {}: {e}", out.display());
    }
}
