//! Which container a process runs in, from `/proc/PID/cgroup`.
//!
//! Pure parsing over the file's text. Every line is read (cgroup v1 hierarchies and the v2
//! `0::` line; on a hybrid host the v2 line is often just `/`), and the container id is the
//! deepest path segment that is one, in the forms the runtimes write:
//!
//! | runtime | systemd driver | cgroupfs driver |
//! |---|---|---|
//! | containerd (CRI) | `…/kubepods-besteffort-pod<uid>.slice/cri-containerd-<id>.scope` | `/kubepods/besteffort/pod<uid>/<id>` |
//! | containerd (`ctr`) | — | `/<namespace>/<id>` |
//! | CRI-O | `…/crio-<id>.scope` (not `crio-conmon-<id>.scope`, the monitor) | `/kubepods/…/pod<uid>/crio-<id>` |
//! | Docker | `/system.slice/docker-<id>.scope` | `/docker/<id>` |
//! | Podman | `…/libpod-<id>.scope` | `/libpod_parent/libpod-<id>` |
//!
//! An id is 64 hex digits (every runtime above generates those; a `ctr run` id chosen by hand
//! that is not one is not recognised, rather than mistaking host paths for containers).
use std::fmt;

use serde::{Deserialize, Serialize};

pub use crate::capture::procfs::ns_inode;

/// A runtime container id (64 hex digits).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ContainerId(String);

impl ContainerId {
    /// `Some` for 64 hex digits.
    pub fn parse(s: &str) -> Option<Self> {
        (s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| ContainerId(s.to_ascii_lowercase()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which runtime the cgroup path says started the container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuntimeKind {
    Containerd,
    CriO,
    Docker,
    Podman,
    /// A bare id (kubelet's cgroupfs driver, or `ctr`): containerd or CRI-O.
    Unknown,
}

/// What the cgroup file says about a process's container.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ContainerRef {
    pub id: ContainerId,
    pub runtime: RuntimeKind,
    /// The pod's UID when a kubelet made the cgroup (`pod<uid>`): lets the API index name the
    /// container's pod even when the runtime cannot be asked.
    pub pod_uid: Option<String>,
    /// For a `/<namespace>/<id>` path (containerd's own layout), the containerd namespace.
    pub namespace_hint: Option<String>,
}

/// The container of a process, from the whole text of `/proc/PID/cgroup`; `None` for a host
/// process.
pub fn parse(text: &str) -> Option<ContainerRef> {
    // The v2 line names the process's real place on a v2 or hybrid host; v1 lines follow.
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_by_key(|l| !l.starts_with("0::"));
    lines.into_iter().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        parse_path(path)
    })
}

/// The container in one cgroup path.
pub fn parse_path(path: &str) -> Option<ContainerRef> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (at, id, runtime) = segments.iter().enumerate().rev().find_map(|(i, seg)| {
        let (id, rt) = container_segment(seg)?;
        Some((i, id, rt))
    })?;
    let pod_uid = segments[..at].iter().rev().find_map(|s| pod_uid(s));
    let namespace_hint = match (at, segments.first()) {
        // `/<namespace>/<id>`: containerd's layout outside Kubernetes.
        (1, Some(ns))
            if runtime == RuntimeKind::Unknown && !ns.contains('.') && *ns != "docker" =>
        {
            Some(ns.to_string())
        }
        _ => None,
    };
    let runtime = match runtime {
        RuntimeKind::Unknown if segments[..at].contains(&"docker") => RuntimeKind::Docker,
        RuntimeKind::Unknown if namespace_hint.is_some() => RuntimeKind::Containerd,
        rt => rt,
    };
    Some(ContainerRef {
        id,
        runtime,
        pod_uid,
        namespace_hint,
    })
}

fn container_segment(seg: &str) -> Option<(ContainerId, RuntimeKind)> {
    let seg = seg.strip_suffix(".scope").unwrap_or(seg);
    if seg.starts_with("crio-conmon-") {
        return None;
    }
    const PREFIXES: [(&str, RuntimeKind); 4] = [
        ("cri-containerd-", RuntimeKind::Containerd),
        ("crio-", RuntimeKind::CriO),
        ("docker-", RuntimeKind::Docker),
        ("libpod-", RuntimeKind::Podman),
    ];
    for (prefix, rt) in PREFIXES {
        if let Some(rest) = seg.strip_prefix(prefix) {
            return ContainerId::parse(rest).map(|id| (id, rt));
        }
    }
    ContainerId::parse(seg).map(|id| (id, RuntimeKind::Unknown))
}

/// `kubepods-burstable-pod1b2c_3d4e.slice` or `pod1b2c-3d4e` → `1b2c-3d4e`.
fn pod_uid(seg: &str) -> Option<String> {
    let seg = seg.strip_suffix(".slice").unwrap_or(seg);
    // cgroupfs: `pod<uid>` (the uid has dashes); systemd: `…-pod<uid with underscores>.slice`.
    let uid = match seg.strip_prefix("pod") {
        Some(uid) => uid,
        None => seg.rsplit_once("-pod")?.1,
    };
    let uid = uid.replace('_', "-");
    (!uid.is_empty() && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')).then_some(uid)
}

#[cfg(test)]
mod tests;
