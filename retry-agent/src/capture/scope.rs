//! The part of the machine an agent observes (`--capture-cgroup`, `--capture-netns`): resolved
//! once into what the kernel compares (cgroup v2 ids with their level, namespace inodes), and
//! what userspace asks of a pid for the connections and Go programs it finds in /proc.
//!
//! The kernel checks the scope at connect and accept only (`retry-ebpf` `config::in_scope`):
//! a socket made outside it never enters `CONNS`, so its I/O costs one failed lookup. With both
//! kinds given, a task must be inside both.
use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use retry_common::MAX_CGROUP_LEVELS;

/// `statfs` magic of a cgroup v2 mount.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// One cgroup v2 subtree in scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopedCgroup {
    /// The kernel's cgroup id: the directory's inode number.
    pub id: u64,
    /// Depth below the cgroup v2 root (the root is 0).
    pub level: u32,
    /// The path below the mount, as `/proc/PID/cgroup` shows it (`/kubepods.slice/…`).
    pub rel: String,
}

/// The resolved scope; empty lists mean "the whole machine" for that kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    pub cgroups: Vec<ScopedCgroup>,
    pub netns: Vec<u32>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScopeError {
    #[error("cgroup {path}: {reason}")]
    Cgroup { path: PathBuf, reason: String },
    #[error(
        "network namespace {spec:?}: {reason} (give an inode as /proc/PID/ns/net shows it, e.g. 4026532281 or net:[4026532281], or a namespace file such as /run/netns/NAME)"
    )]
    Netns { spec: String, reason: String },
}

impl Scope {
    /// Resolves the flags' values (stat calls only).
    pub fn resolve(cgroups: &[PathBuf], netns: &[String]) -> Result<Scope, Vec<ScopeError>> {
        let mut errors = Vec::new();
        let mut scope = Scope::default();
        for p in cgroups {
            match resolve_cgroup(p) {
                Ok(c) => scope.cgroups.push(c),
                Err(e) => errors.push(e),
            }
        }
        for s in netns {
            match resolve_netns(s) {
                Ok(n) => scope.netns.push(n),
                Err(e) => errors.push(e),
            }
        }
        // The root cgroup holds every process: as good as no cgroup scope.
        if scope.cgroups.iter().any(|c| c.level == 0) {
            scope.cgroups.clear();
        }
        if errors.is_empty() {
            Ok(scope)
        } else {
            Err(errors)
        }
    }

    pub fn is_whole_machine(&self) -> bool {
        self.cgroups.is_empty() && self.netns.is_empty()
    }

    /// The deepest level the kernel's ancestor walk must reach.
    pub fn cgroup_levels(&self) -> u32 {
        self.cgroups.iter().map(|c| c.level).max().unwrap_or(0)
    }

    /// Whether process `pid` is inside the scope, from `proc_root`. A process whose files
    /// cannot be read (gone, or hidden) is outside: it would not be tracked by the kernel either
    /// once its scope is unknown.
    pub fn contains_pid(&self, proc_root: &Path, pid: u32) -> bool {
        if self.is_whole_machine() {
            return true;
        }
        let dir = proc_root.join(pid.to_string());
        if !self.netns.is_empty() {
            let ino = std::fs::metadata(dir.join("ns/net")).map(|m| m.ino());
            match ino {
                Ok(i) if u32::try_from(i).is_ok_and(|i| self.netns.contains(&i)) => {}
                _ => return false,
            }
        }
        if !self.cgroups.is_empty() {
            let Ok(text) = std::fs::read_to_string(dir.join("cgroup")) else {
                return false;
            };
            return self.contains_cgroup_file(&text);
        }
        true
    }

    /// `text` is a `/proc/PID/cgroup`: is its v2 (`0::`) path inside a scoped subtree?
    pub fn contains_cgroup_file(&self, text: &str) -> bool {
        let Some(path) = text.lines().find_map(|l| l.strip_prefix("0::")) else {
            return false;
        };
        self.cgroups.iter().any(|c| within(path.trim_end(), &c.rel))
    }
}

/// `path` is `dir` or below it, by whole components.
fn within(path: &str, dir: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    path == dir
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
        || dir.is_empty()
}

fn resolve_cgroup(p: &Path) -> Result<ScopedCgroup, ScopeError> {
    let err = |reason: String| ScopeError::Cgroup {
        path: p.to_path_buf(),
        reason,
    };
    let canon = p.canonicalize().map_err(|e| err(e.to_string()))?;
    let meta = std::fs::metadata(&canon).map_err(|e| err(e.to_string()))?;
    if !meta.is_dir() || !is_cgroup2(&canon) {
        return Err(err("not a directory of a cgroup v2 (unified) mount".into()));
    }
    // Up to the mount's root: the last ancestor on the same filesystem.
    let mut root = canon.as_path();
    let mut level = 0u32;
    while let Some(parent) = root.parent() {
        match std::fs::metadata(parent) {
            Ok(m) if m.dev() == meta.dev() && is_cgroup2(parent) => {
                root = parent;
                level += 1;
            }
            _ => break,
        }
    }
    if level > MAX_CGROUP_LEVELS {
        return Err(err(format!(
            "{level} levels deep; the kernel walks at most {MAX_CGROUP_LEVELS}"
        )));
    }
    let rel = canon
        .strip_prefix(root)
        .map(|r| format!("/{}", r.display()))
        .unwrap_or_else(|_| "/".into());
    Ok(ScopedCgroup {
        id: meta.ino(),
        level,
        rel: if rel == "/" { String::new() } else { rel },
    })
}

fn is_cgroup2(p: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a valid C string and an out struct the call fills.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    r == 0 && st.f_type as i64 == CGROUP2_SUPER_MAGIC
}

/// An inode (`4026532281`, `net:[4026532281]`) or a namespace file to stat.
pub fn parse_netns_inode(spec: &str) -> Option<u32> {
    let s = spec.trim();
    let s = s
        .strip_prefix("net:[")
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(s);
    s.parse::<u32>().ok().filter(|&i| i != 0)
}

fn resolve_netns(spec: &str) -> Result<u32, ScopeError> {
    let err = |reason: String| ScopeError::Netns {
        spec: spec.to_string(),
        reason,
    };
    if let Some(i) = parse_netns_inode(spec) {
        return Ok(i);
    }
    if !spec.starts_with('/') {
        return Err(err("neither an inode number nor an absolute path".into()));
    }
    let m = std::fs::metadata(spec).map_err(|e| err(e.to_string()))?;
    u32::try_from(m.ino()).map_err(|_| err("inode out of range for a namespace".into()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
    use super::*;

    fn scope(rels: &[&str]) -> Scope {
        Scope {
            cgroups: rels
                .iter()
                .map(|r| ScopedCgroup {
                    id: 1,
                    level: 1,
                    rel: r.to_string(),
                })
                .collect(),
            netns: vec![],
        }
    }

    #[test]
    fn cgroup_file_inside_by_whole_components() {
        let s = scope(&["/kubepods.slice/app"]);
        assert!(s.contains_cgroup_file("0::/kubepods.slice/app\n"));
        assert!(s.contains_cgroup_file("0::/kubepods.slice/app/pod1/c1\n"));
        assert!(!s.contains_cgroup_file("0::/kubepods.slice/apple\n"));
        assert!(!s.contains_cgroup_file("0::/system.slice/x\n"));
        // Hybrid hierarchies list v1 controllers first; only the unified line counts.
        assert!(s.contains_cgroup_file("4:cpu:/x\n0::/kubepods.slice/app/p\n"));
        assert!(!s.contains_cgroup_file("4:cpu:/kubepods.slice/app\n"));
        assert!(!s.contains_cgroup_file(""));
    }

    #[test]
    fn netns_specs() {
        assert_eq!(parse_netns_inode("4026532281"), Some(4026532281));
        assert_eq!(parse_netns_inode("net:[4026532281]"), Some(4026532281));
        assert_eq!(parse_netns_inode("0"), None);
        assert_eq!(parse_netns_inode("net:[x]"), None);
        assert!(matches!(
            resolve_netns("ralab-a"),
            Err(ScopeError::Netns { .. })
        ));
        assert!(resolve_netns("/nonexistent/netns").is_err());
    }

    #[test]
    fn bad_cgroups_are_named_and_reported_together() {
        let errs = Scope::resolve(
            &[PathBuf::from("/nonexistent/cg"), PathBuf::from("/tmp")],
            &["bogus".to_string()],
        )
        .unwrap_err();
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert!(errs[1].to_string().contains("cgroup v2"), "{}", errs[1]);
    }

    #[test]
    fn own_netns_and_cgroup_contain_this_process() {
        let me = std::process::id();
        let proc_root = Path::new("/proc");
        let Ok(m) = std::fs::metadata("/proc/self/ns/net") else {
            return;
        };
        let s = Scope::resolve(&[], &[m.ino().to_string()]).expect("own netns");
        assert!(s.contains_pid(proc_root, me));
        let other = Scope {
            netns: vec![1],
            ..Scope::default()
        };
        assert!(!other.contains_pid(proc_root, me));
        // The process's own cgroup, when the unified hierarchy is mounted at the usual place.
        let Ok(text) = std::fs::read_to_string("/proc/self/cgroup") else {
            return;
        };
        let Some(rel) = text.lines().find_map(|l| l.strip_prefix("0::")) else {
            return;
        };
        let dir = PathBuf::from(format!("/sys/fs/cgroup{rel}"));
        if rel == "/" || !is_cgroup2(&dir) {
            return;
        }
        let s = Scope::resolve(&[dir], &[]).expect("own cgroup");
        assert_eq!(s.cgroups[0].rel, rel);
        assert_eq!(s.cgroup_levels() as usize, rel.matches('/').count());
        assert!(s.contains_pid(proc_root, me));
    }
}
