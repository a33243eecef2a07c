//! The per-node digest key: generated at first start, kept 0600 in the agent's state directory,
//! so digests (query strings, bodies) in dumps are keyed and stay comparable across restarts of
//! one node, but cannot be brute-forced by whoever reads a dump without the key.
use std::{
    io::{Read, Write},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use crate::l7::DigestKey;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read or create the digest key {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the digest key {path} is not {len} bytes, or is readable by others (mode {mode:o}); remove it to make a new one"
    )]
    Bad {
        path: PathBuf,
        len: usize,
        mode: u32,
    },
}

/// Read the key at `path`, or create it (0600, parent 0700) if it does not exist.
pub fn load_or_create(path: &Path) -> Result<DigestKey, KeyError> {
    let io = |source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::File::open(path) {
        Ok(mut f) => {
            let mode = f.metadata().map_err(io)?.permissions().mode() & 0o777;
            let mut b = Vec::new();
            f.read_to_end(&mut b).map_err(io)?;
            let key: Option<[u8; DigestKey::LEN]> = b.as_slice().try_into().ok();
            match key {
                Some(k) if mode & 0o077 == 0 => Ok(DigestKey::from_bytes(k)),
                _ => Err(KeyError::Bad {
                    path: path.to_path_buf(),
                    len: DigestKey::LEN,
                    mode,
                }),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent() {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(io)?;
            }
            let key = DigestKey::random();
            // create_new: two agents starting at once never overwrite each other's key.
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
            {
                Ok(mut f) => {
                    f.write_all(key.as_bytes()).map_err(io)?;
                    f.sync_all().map_err(io)?;
                    Ok(key)
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => load_or_create(path),
                Err(e) => Err(io(e)),
            }
        }
        Err(e) => Err(io(e)),
    }
}

/// Load (or create) the node key and make it the process's digest key. Never fatal: without
/// it digests are keyed by a process-random key (still secret; not comparable across restarts).
pub fn install(path: &Path) {
    match load_or_create(path) {
        Ok(k) => {
            if !crate::l7::set_digest_key(k) {
                tracing::warn!(
                    "digest key already in use; the node key at {} was not installed",
                    path.display()
                );
            }
        }
        Err(e) => tracing::warn!(error = %e, "digests keyed by a process-random key instead"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_once_private_and_read_back() {
        let dir = crate::testkit::temp_dir("key");
        let path = dir.join("state/digest.key");
        let a = load_or_create(&path).expect("create");
        assert_eq!(
            std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            load_or_create(&path).expect("read"),
            a,
            "the same key at the next start"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert!(
            matches!(load_or_create(&path), Err(KeyError::Bad { .. })),
            "a key others can read is refused"
        );
        std::fs::write(&path, b"short").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert!(matches!(load_or_create(&path), Err(KeyError::Bad { .. })));
        let _ = std::fs::remove_dir_all(dir);
    }
}
