//! TLS plaintext: uprobes on OpenSSL's SSL_read/SSL_write (and their _ex variants and the
//! handshake entry points) in the shared libssl files the node's processes map. What they report
//! is what the application wrote and read, on the connection of the fd the library did its I/O
//! on; the ciphertext syscalls inside those calls are left out in the kernel.
//!
//! Uprobes attach to files, so each container image's own libssl is a library of its own: they
//! are found through `/proc/<pid>/maps` and reached through `/proc/<pid>/root`, at start and on
//! every rescan. Not covered: TLS linked statically (Go's crypto/tls, rustls, Envoy's
//! BoringSSL). A library that cannot be instrumented is logged and skipped: its TLS connections
//! stay opaque, nothing else changes.
use std::{
    collections::{BTreeSet, HashSet},
    path::{Path, PathBuf},
};

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
    "/usr/lib/x86_64-linux-gnu/libssl.so.1.1",
    "/usr/lib64/libssl.so.1.1",
];

/// The libraries to instrument: the configured ones; or those of the default locations plus
/// every libssl a running process maps.
pub fn candidates(configured: &[PathBuf], proc_root: &Path) -> Vec<PathBuf> {
    if !configured.is_empty() {
        return configured.to_vec();
    }
    let mut v: Vec<PathBuf> = DEFAULT_LIBS.iter().map(PathBuf::from).collect();
    v.extend(mapped_libraries(proc_root));
    v
}

/// libssl files mapped by running processes, as paths through each process's root.
pub fn mapped_libraries(proc_root: &Path) -> Vec<PathBuf> {
    let mut out = BTreeSet::new();
    let Ok(dir) = std::fs::read_dir(proc_root) else { return Vec::new() };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else { continue };
        let Ok(maps) = std::fs::read_to_string(proc_root.join(pid).join("maps")) else { continue };
        for line in maps.lines() {
            // address perms offset dev inode path
            let Some(path) = line.split_whitespace().nth(5) else { continue };
            let file = path.rsplit('/').next().unwrap_or_default();
            if file.starts_with("libssl.so") && path.starts_with('/') {
                out.insert(proc_root.join(pid).join("root").join(path.trim_start_matches('/')));
            }
        }
    }
    out.into_iter().collect()
}

/// A file's identity (uprobes attach to inodes: two paths to one file are one library).
fn identity(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().filter(|m| m.is_file()).map(|m| (m.dev(), m.ino()))
}

/// The TLS probes of one capture: loaded on first use, attached once per library file.
#[derive(Debug, Default)]
pub struct TlsProbes {
    loaded: Option<bool>,
    handled: HashSet<(u64, u64)>,
    instrumented: usize,
}

impl TlsProbes {
    /// Attaches to every library in `libs` not handled yet; returns how many were added.
    /// Never fails the capture: problems are logged, TLS connections then stay opaque.
    pub fn instrument(&mut self, ebpf: &mut Ebpf, libs: &[PathBuf]) -> usize {
        let loaded = *self.loaded.get_or_insert_with(|| {
            for prog in ENTRIES.iter().map(|(p, _)| *p).chain([RETURN]) {
                if let Err(e) = program(ebpf, prog).and_then(|p| p.load()) {
                    tracing::warn!(program = prog, error = %e, "TLS probe does not load: TLS connections stay opaque");
                    return false;
                }
            }
            true
        });
        if !loaded {
            return 0;
        }
        let mut added = 0;
        for lib in libs {
            let Some(id) = identity(lib) else { continue };
            // Remembered whatever the outcome: a library that cannot be probed would only repeat
            // its warning on every rescan.
            if !self.handled.insert(id) {
                continue;
            }
            match attach_lib(ebpf, lib) {
                Ok(()) => {
                    added += 1;
                    tracing::info!(lib = %lib.display(), "TLS plaintext from this libssl");
                }
                Err(e) => tracing::warn!(lib = %lib.display(), error = %e, "cannot instrument this libssl"),
            }
        }
        self.instrumented += added;
        added
    }

    /// Library files instrumented so far.
    pub fn instrumented(&self) -> usize {
        self.instrumented
    }
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe, ProgramError> {
    ebpf.program_mut(name).ok_or(ProgramError::NotLoaded)?.try_into()
}

fn attach_lib(ebpf: &mut Ebpf, lib: &Path) -> Result<(), ProgramError> {
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
#[allow(clippy::expect_used, reason = "tests fail loudly")]
mod tests {
    use super::*;

    #[test]
    fn libssl_mapped_by_processes_is_found_through_their_root() {
        let root = std::env::temp_dir().join(format!("ra-tls-proc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let lib_dir = root.join("42/root/usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&lib_dir).expect("dirs");
        std::fs::write(lib_dir.join("libssl.so.3"), b"").expect("lib");
        for d in ["7", "self"] {
            std::fs::create_dir_all(root.join(d)).expect("dirs");
        }
        let maps = "7f00-7f10 r-xp 00000000 08:01 1234 /usr/lib/x86_64-linux-gnu/libssl.so.3\n\
                    7f10-7f20 r-xp 00000000 08:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6\n\
                    7f20-7f30 rw-p 00000000 00:00 0 [heap]\n";
        std::fs::write(root.join("42/maps"), maps).expect("maps");
        std::fs::write(root.join("self/maps"), maps).expect("maps");
        std::fs::write(root.join("7/maps"), "7f00-7f10 r-xp 00000000 08:01 5 /usr/bin/python3\n").expect("maps");
        let got = mapped_libraries(&root);
        assert_eq!(got, vec![root.join("42/root/usr/lib/x86_64-linux-gnu/libssl.so.3")]);
        // Configured libraries replace discovery.
        assert_eq!(candidates(&[PathBuf::from("/x/libssl.so.3")], &root), vec![PathBuf::from("/x/libssl.so.3")]);
        // One file reached by two paths is one library; a missing one is none.
        let link = root.join("libssl-link.so");
        std::os::unix::fs::symlink(lib_dir.join("libssl.so.3"), &link).expect("symlink");
        assert!(identity(&link).is_some());
        assert_eq!(identity(&link), identity(&got[0]));
        assert_eq!(identity(&root.join("missing.so")), None);
        let _ = std::fs::remove_dir_all(root);
    }
}
