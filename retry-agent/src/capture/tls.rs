//! TLS plaintext: uprobes on OpenSSL's SSL_read/SSL_write (and their _ex variants and the
//! handshake entry points) in the shared libssl the node's processes map. What they report is
//! what the application wrote and read, on the connection of the fd the library did its I/O
//! on; the ciphertext syscalls inside those calls are left out in the kernel.
//!
//! Not covered: TLS libraries linked statically (Go's crypto/tls, rustls, BoringSSL in Envoy) and
//! a libssl inside a container image the node's paths do not reach (add it with `--tls-lib`
//! through /proc/<pid>/root). A library that cannot be instrumented is logged and skipped: TLS
//! connections then stay opaque, nothing else changes.
use std::{collections::BTreeSet, path::PathBuf};

use aya::{
    Ebpf,
    programs::{ProgramError, UProbe, uprobe::UProbeScope},
};

/// Entry programs and the functions each one probes.
const ENTRIES: &[(&str, &[&str])] = &[
    ("ra_ssl_write", &["SSL_write"]),
    ("ra_ssl_read", &["SSL_read"]),
    ("ra_ssl_write_ex", &["SSL_write_ex"]),
    ("ra_ssl_read_ex", &["SSL_read_ex"]),
    ("ra_ssl_handshake", &["SSL_do_handshake", "SSL_connect", "SSL_accept"]),
];
/// The one return program, on every function above.
const RETURN: &str = "ra_ssl_ret";

/// Where distributions put the shared OpenSSL (3.x, then 1.1).
const DEFAULT_LIBS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libssl.so.3",
    "/usr/lib/aarch64-linux-gnu/libssl.so.3",
    "/usr/lib64/libssl.so.3",
    "/usr/lib/libssl.so.3",
    "/lib/x86_64-linux-gnu/libssl.so.3",
    "/usr/lib/x86_64-linux-gnu/libssl.so.1.1",
    "/usr/lib64/libssl.so.1.1",
];

/// The libraries to instrument: the configured ones, or those of the default locations that
/// exist; each file once (distributions link /lib to /usr/lib).
pub fn libraries(configured: &[PathBuf]) -> Vec<PathBuf> {
    let candidates: Vec<PathBuf> =
        if configured.is_empty() { DEFAULT_LIBS.iter().map(PathBuf::from).collect() } else { configured.to_vec() };
    let mut seen = BTreeSet::new();
    candidates.into_iter().filter_map(|p| std::fs::canonicalize(&p).ok()).filter(|p| seen.insert(p.clone())).collect()
}

/// Loads the TLS programs and attaches them to every library; returns the libraries done.
/// Never fails the capture: problems are logged.
pub fn attach(ebpf: &mut Ebpf, libs: &[PathBuf]) -> Vec<PathBuf> {
    if libs.is_empty() {
        tracing::info!("no shared libssl found: TLS connections stay opaque");
        return Vec::new();
    }
    let mut all = Vec::new();
    for (prog, _) in ENTRIES {
        if let Err(e) = load(ebpf, prog) {
            tracing::warn!(program = prog, error = %e, "TLS uprobe does not load: TLS connections stay opaque");
            return Vec::new();
        }
    }
    if let Err(e) = load(ebpf, RETURN) {
        tracing::warn!(program = RETURN, error = %e, "TLS uretprobe does not load: TLS connections stay opaque");
        return Vec::new();
    }
    for lib in libs {
        match attach_lib(ebpf, lib) {
            Ok(()) => all.push(lib.clone()),
            Err(e) => tracing::warn!(lib = %lib.display(), error = %e, "cannot instrument this libssl"),
        }
    }
    if !all.is_empty() {
        tracing::info!(libs = ?all, "TLS plaintext from libssl uprobes");
    }
    all
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe, ProgramError> {
    ebpf.program_mut(name).ok_or(ProgramError::NotLoaded)?.try_into()
}

fn load(ebpf: &mut Ebpf, name: &str) -> Result<(), ProgramError> {
    program(ebpf, name)?.load()
}

/// All or nothing per library: a half-instrumented library would report writes without reads.
fn attach_lib(ebpf: &mut Ebpf, lib: &PathBuf) -> Result<(), ProgramError> {
    let mut links = Vec::new();
    let mut attach_one = |ebpf: &mut Ebpf, prog: &str, sym: &str| -> Result<(), ProgramError> {
        let p = program(ebpf, prog)?;
        let id = p.attach([sym], lib, UProbeScope::AllProcesses)?;
        links.push((prog.to_string(), id));
        Ok(())
    };
    let mut result = Ok(());
    'all: for (prog, syms) in ENTRIES {
        for sym in *syms {
            result = attach_one(ebpf, prog, sym).and_then(|()| attach_one(ebpf, RETURN, sym));
            if result.is_err() {
                break 'all;
            }
        }
    }
    if result.is_err() {
        for (prog, id) in links {
            if let Ok(p) = program(ebpf, &prog) {
                let _ = p.detach(id);
            }
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_are_deduplicated_and_missing_ones_dropped() {
        let dir = std::env::temp_dir().join(format!("ra-tls-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let lib = dir.join("libssl.so.3");
        std::fs::write(&lib, b"").expect("write");
        let link = dir.join("libssl.so");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&lib, &link).expect("symlink");
        let got = libraries(&[lib.clone(), link, dir.join("missing.so")]);
        assert_eq!(got, vec![std::fs::canonicalize(&lib).expect("canonical")]);
        let _ = std::fs::remove_dir_all(dir);
    }
}
