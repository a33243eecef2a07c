//! Recognising the agent's own processes (its shims, CLI calls) by their executable, not by a
//! name any workload could take to hide from capture: a process is the agent's when its
//! `/proc/PID/exe` is the agent's own file, or a byte-identical copy (the same image in another
//! container, where device and inode differ).
use std::{
    collections::HashMap,
    fs::File,
    hash::{BuildHasher, Hasher},
    io::Read,
    os::unix::fs::MetadataExt,
    path::Path,
};

/// Executables larger than this are never hashed (a copy of the agent is not that large).
const MAX_HASHED_BYTES: u64 = 512 << 20;
/// Verdicts kept per file identity; cleared when full (a node runs few distinct executables).
const MAX_CACHED: usize = 4096;

/// A file as `stat` names it, with what tells a rewritten file apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i64,
}

impl FileId {
    fn of(path: &Path) -> Option<FileId> {
        let m = std::fs::metadata(path).ok()?;
        Some(FileId {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: m.mtime(),
        })
    }
}

/// The agent's executable and the verdicts reached so far.
pub(super) struct OwnExe {
    own: Option<FileId>,
    /// Keyed hash of the agent's own file, computed on first need (random keys: a file cannot be
    /// crafted to collide with it).
    own_digest: Option<Option<u64>>,
    own_path: std::path::PathBuf,
    hasher: std::collections::hash_map::RandomState,
    cache: HashMap<FileId, bool>,
}

impl OwnExe {
    /// The running process's executable.
    pub(super) fn current() -> OwnExe {
        OwnExe::of(Path::new("/proc/self/exe"))
    }

    pub(super) fn of(exe: &Path) -> OwnExe {
        // Resolved once: /proc/self/exe of a later caller would be that caller.
        let own_path = std::fs::canonicalize(exe).unwrap_or_else(|_| exe.to_path_buf());
        OwnExe {
            own: FileId::of(&own_path),
            own_digest: None,
            own_path,
            hasher: Default::default(),
            cache: HashMap::new(),
        }
    }

    /// Whether `exe` (a `/proc/PID/exe` link or a path) is the agent's executable. Unknown
    /// (unreadable, gone) is "no": a workload is observed rather than hidden.
    pub(super) fn is_ours(&mut self, exe: &Path) -> bool {
        let (Some(own), Some(id)) = (self.own, FileId::of(exe)) else {
            return false;
        };
        if (id.dev, id.ino) == (own.dev, own.ino) {
            return true;
        }
        if id.size != own.size {
            return false;
        }
        if let Some(&v) = self.cache.get(&id) {
            return v;
        }
        let own_digest = match self.own_digest {
            Some(d) => d,
            None => *self.own_digest.insert(digest(&self.hasher, &self.own_path)),
        };
        let ours = own_digest.is_some() && digest(&self.hasher, exe) == own_digest;
        if self.cache.len() >= MAX_CACHED {
            self.cache.clear();
        }
        self.cache.insert(id, ours);
        ours
    }
}

fn digest(keys: &std::collections::hash_map::RandomState, path: &Path) -> Option<u64> {
    let mut f = File::open(path).ok()?;
    if f.metadata().ok()?.len() > MAX_HASHED_BYTES {
        return None;
    }
    let mut h = keys.build_hasher();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match f.read(&mut buf) {
            Ok(0) => return Some(h.finish()),
            Ok(n) => h.write(buf.get(..n)?),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_or_a_copy_is_ours_a_namesake_is_not() {
        let dir = std::env::temp_dir().join(format!("ra-own-exe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let agent = dir.join("agent");
        std::fs::write(&agent, b"\x7fELF the agent's bytes").unwrap();
        let mut own = OwnExe::of(&agent);
        assert!(own.is_ours(&agent));
        // The same image elsewhere (another container's layer): same bytes, other inode.
        let copy = dir.join("copy");
        std::fs::copy(&agent, &copy).unwrap();
        assert!(own.is_ours(&copy));
        // A workload that took the agent's name, even one of the same size.
        let namesake = dir.join("retry-agent");
        std::fs::write(&namesake, b"\x7fELF the rogue's bytes").unwrap();
        assert_eq!(
            std::fs::metadata(&namesake).unwrap().len(),
            std::fs::metadata(&agent).unwrap().len()
        );
        assert!(!own.is_ours(&namesake));
        assert!(!own.is_ours(&dir.join("gone")));
        // The running test binary is not the fake agent.
        assert!(!own.is_ours(Path::new("/proc/self/exe")));
        assert!(OwnExe::current().is_ours(Path::new("/proc/self/exe")));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
