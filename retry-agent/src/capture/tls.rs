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

use super::programs::{Hook, ProgramSpec, UprobeTarget};

/// The `libssl` uprobe programs of the object and the symbols each probes: (program, symbol)
/// pairs, entry probes and return probes apart.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    pub entries: Vec<(String, String)>,
    pub returns: Vec<(String, String)>,
}

/// The object's `libssl` programs (their sections name the symbols).
pub(crate) fn plan(specs: &[ProgramSpec]) -> Plan {
    let mut plan = Plan::default();
    for s in specs {
        let Hook::Uprobe(u) = &s.hook else { continue };
        if u.target != UprobeTarget::Libssl {
            continue;
        }
        let list = if u.ret {
            &mut plan.returns
        } else {
            &mut plan.entries
        };
        list.extend(u.symbols.iter().map(|sym| (s.name.clone(), sym.clone())));
    }
    plan
}

impl Plan {
    /// Every program of the plan, once.
    pub fn programs(&self) -> BTreeSet<&str> {
        self.entries
            .iter()
            .chain(&self.returns)
            .map(|(p, _)| p.as_str())
            .collect()
    }

    /// Something to attach, and every entry symbol has a return probe (an entry without one
    /// would leave its call pending and hide the thread's I/O until it goes stale).
    pub fn is_complete(&self) -> bool {
        !self.entries.is_empty()
            && self
                .entries
                .iter()
                .all(|(_, sym)| self.returns.iter().any(|(_, r)| r == sym))
    }

    /// (program, symbol) pairs in attach order: each entry probe, then the return probes on its
    /// symbol; return probes on other symbols last.
    fn pairs(&self) -> Vec<(&str, &str)> {
        let mut out = Vec::new();
        for (prog, sym) in &self.entries {
            out.push((prog.as_str(), sym.as_str()));
            out.extend(
                self.returns
                    .iter()
                    .filter(|(_, r)| r == sym)
                    .map(|(p, r)| (p.as_str(), r.as_str())),
            );
        }
        let entry_syms: HashSet<&str> = self.entries.iter().map(|(_, s)| s.as_str()).collect();
        out.extend(
            self.returns
                .iter()
                .filter(|(_, r)| !entry_syms.contains(r.as_str()))
                .map(|(p, r)| (p.as_str(), r.as_str())),
        );
        out
    }
}

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
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(maps) = std::fs::read_to_string(proc_root.join(pid).join("maps")) else {
            continue;
        };
        for line in maps.lines() {
            // address perms offset dev inode path
            let Some(path) = line.split_whitespace().nth(5) else {
                continue;
            };
            let file = path.rsplit('/').next().unwrap_or_default();
            if file.starts_with("libssl.so") && path.starts_with('/') {
                out.insert(
                    proc_root
                        .join(pid)
                        .join("root")
                        .join(path.trim_start_matches('/')),
                );
            }
        }
    }
    out.into_iter().collect()
}

/// A file's identity (uprobes attach to inodes: two paths to one file are one library).
fn identity(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p)
        .ok()
        .filter(|m| m.is_file())
        .map(|m| (m.dev(), m.ino()))
}

/// The TLS probes of one capture: loaded on first use, attached once per library file.
#[derive(Debug)]
pub struct TlsProbes {
    plan: Plan,
    loaded: Option<bool>,
    handled: HashSet<(u64, u64)>,
    instrumented: usize,
}

impl TlsProbes {
    pub fn new(plan: Plan) -> Self {
        TlsProbes {
            plan,
            loaded: None,
            handled: HashSet::new(),
            instrumented: 0,
        }
    }

    /// Attaches to every library in `libs` not handled yet; returns how many were added.
    /// Never fails the capture: problems are logged, TLS connections then stay opaque.
    pub fn instrument(&mut self, ebpf: &mut Ebpf, libs: &[PathBuf]) -> usize {
        let plan = &self.plan;
        let loaded = *self.loaded.get_or_insert_with(|| {
            if !plan.is_complete() {
                tracing::warn!(?plan, "the object's libssl probes are incomplete: TLS connections stay opaque");
                return false;
            }
            for prog in plan.programs() {
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
            match attach_lib(ebpf, &self.plan, lib) {
                Ok(()) => {
                    added += 1;
                    tracing::info!(lib = %lib.display(), "TLS plaintext from this libssl");
                }
                Err(e) => {
                    tracing::warn!(lib = %lib.display(), error = %e, "cannot instrument this libssl")
                }
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
    ebpf.program_mut(name)
        .ok_or(ProgramError::NotLoaded)?
        .try_into()
}

fn attach_lib(ebpf: &mut Ebpf, plan: &Plan, lib: &Path) -> Result<(), ProgramError> {
    let mut links = Vec::new();
    let mut result = Ok(());
    for (prog, sym) in plan.pairs() {
        result = program(ebpf, prog)
            .and_then(|p| p.attach([sym], lib, UProbeScope::AllProcesses))
            .map(|id| links.push((prog, id)));
        if result.is_err() {
            break;
        }
    }
    if result.is_err() {
        // All or nothing: half a library's probes would pair entries with no returns.
        for (prog, id) in links {
            if let Ok(p) = program(ebpf, prog) {
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
        std::fs::write(
            root.join("7/maps"),
            "7f00-7f10 r-xp 00000000 08:01 5 /usr/bin/python3\n",
        )
        .expect("maps");
        let got = mapped_libraries(&root);
        assert_eq!(
            got,
            vec![root.join("42/root/usr/lib/x86_64-linux-gnu/libssl.so.3")]
        );
        // Configured libraries replace discovery.
        assert_eq!(
            candidates(&[PathBuf::from("/x/libssl.so.3")], &root),
            vec![PathBuf::from("/x/libssl.so.3")]
        );
        // One file reached by two paths is one library; a missing one is none.
        let link = root.join("libssl-link.so");
        std::os::unix::fs::symlink(lib_dir.join("libssl.so.3"), &link).expect("symlink");
        assert!(identity(&link).is_some());
        assert_eq!(identity(&link), identity(&got[0]));
        assert_eq!(identity(&root.join("missing.so")), None);
        let _ = std::fs::remove_dir_all(root);
    }

    fn spec(name: &str, symbols: &[&str], ret: bool) -> ProgramSpec {
        let symbols = symbols.iter().map(|s| s.to_string()).collect();
        ProgramSpec {
            name: name.into(),
            hook: Hook::Uprobe(super::super::programs::Uprobe {
                target: UprobeTarget::Libssl,
                symbols,
                ret,
            }),
        }
    }

    #[test]
    fn the_plan_pairs_each_entry_with_its_return_probe() {
        let tp = ProgramSpec {
            name: "ra_x".into(),
            hook: Hook::Tracepoint {
                category: "a".into(),
                name: "b".into(),
            },
        };
        let specs = [
            tp,
            spec("ra_w", &["SSL_write"], false),
            spec("ra_h", &["SSL_connect", "SSL_accept"], false),
            spec("ra_ret", &["SSL_write", "SSL_connect", "SSL_accept"], true),
        ];
        let p = plan(&specs);
        assert!(p.is_complete());
        assert_eq!(
            p.programs().into_iter().collect::<Vec<_>>(),
            vec!["ra_h", "ra_ret", "ra_w"]
        );
        assert_eq!(
            p.pairs(),
            vec![
                ("ra_w", "SSL_write"),
                ("ra_ret", "SSL_write"),
                ("ra_h", "SSL_connect"),
                ("ra_ret", "SSL_connect"),
                ("ra_h", "SSL_accept"),
                ("ra_ret", "SSL_accept"),
            ]
        );
        // An entry probe without a return probe would leave its calls pending: not attached.
        let p = plan(&[
            spec("ra_w", &["SSL_write"], false),
            spec("ra_r", &["SSL_read"], false),
            spec("ra_ret", &["SSL_write"], true),
        ]);
        assert!(!p.is_complete());
        assert!(!plan(&[]).is_complete());
    }
}
