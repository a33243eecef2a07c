//! What /proc says: process metadata, and TCP connections that existed before the agent started.
//! Parsers are pure functions over the file text (tested without a kernel); the readers around
//! them treat every missing file as "process gone" and carry on.
use std::{
    collections::{HashMap, HashSet},
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::Path,
};

use super::event::{ProcessInfo, Role, Tuple};

/// One row of /proc/net/tcp or /proc/net/tcp6.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcTcpEntry {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// Kernel TCP state (1 = ESTABLISHED, 10 = LISTEN, ...).
    pub state: u8,
    pub inode: u64,
}

pub const TCP_ESTABLISHED: u8 = 1;
pub const TCP_CLOSE_WAIT: u8 = 8;
pub const TCP_LISTEN: u8 = 10;

/// `0100007F:1F90` → 127.0.0.1:8080. The kernel prints each 32-bit word of the address in host
/// (little-endian here) order, and the port in host order.
fn parse_addr(s: &str) -> Option<SocketAddr> {
    let (addr, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(addr.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_le_bytes())
    };
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Parses /proc/net/tcp{,6}; malformed lines are skipped.
pub fn parse_proc_net_tcp(text: &str) -> Vec<ProcTcpEntry> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            Some(ProcTcpEntry {
                local: parse_addr(f.get(1)?)?,
                remote: parse_addr(f.get(2)?)?,
                state: u8::from_str_radix(f.get(3)?, 16).ok()?,
                inode: f.get(9)?.parse().ok()?,
            })
        })
        .collect()
}

/// `socket:[12345]` → 12345.
pub fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// `net:[4026531840]` → 4026531840.
/// The host's network namespace: pid 1's, or, where pid 1's cannot be read (a hardened /proc,
/// a sandbox whose init is not ours to inspect), the agent's own: it runs with the host's
/// network (the DaemonSet's `hostNetwork`), so its namespace is the host's.
pub fn host_netns(proc_root: &Path) -> Option<u64> {
    ["1", "self"].into_iter().find_map(|p| {
        fs::read_link(proc_root.join(p).join("ns/net"))
            .ok()
            .and_then(|l| ns_inode(&l.to_string_lossy()))
    })
}

pub fn ns_inode(link: &str) -> Option<u64> {
    link.split_once(":[")?.1.strip_suffix(']')?.parse().ok()
}

/// cgroup v2 path from /proc/PID/cgroup (`0::/path`); falls back to the first v1 line's path.
pub fn parse_cgroup(text: &str) -> Option<String> {
    let mut first = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (id, _ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
        if id == "0" {
            return Some(path.to_string());
        }
        first.get_or_insert_with(|| path.to_string());
    }
    first
}

/// A 64-hex-digit container id in a cgroup path (docker-<id>.scope, /docker/<id>, cri-containerd-<id>,
/// kubepods .../<id>), the last one if several.
pub fn container_id(cgroup: &str) -> Option<String> {
    cgroup
        .split(['/', '-', '.', ':'])
        .rfind(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_string)
}

/// Reads a process's metadata; a process that is already gone yields what could be read
/// (at least the pid), never an error: metadata is best-effort enrichment.
pub fn process_info(proc_root: &Path, pid: u32) -> ProcessInfo {
    let dir = proc_root.join(pid.to_string());
    let comm = fs::read_to_string(dir.join("comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default();
    let exe = fs::read_link(dir.join("exe"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
    let cgroup = fs::read_to_string(dir.join("cgroup"))
        .ok()
        .and_then(|t| parse_cgroup(&t));
    let container_id = cgroup.as_deref().and_then(container_id);
    let netns = fs::read_link(dir.join("ns/net"))
        .ok()
        .and_then(|p| ns_inode(&p.to_string_lossy()));
    let host_netns = host_netns(proc_root);
    ProcessInfo {
        pid,
        comm,
        exe,
        cgroup,
        container_id,
        netns,
        host_netns,
        workload: None,
        parent: None,
    }
}

/// A TCP connection found in /proc: which process holds it on which fd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExistingConn {
    pub pid: u32,
    pub fd: u32,
    pub role: Role,
    pub tuple: Tuple,
}

/// Role of an existing connection: server when its local port is one the same network namespace
/// listens on (on that address or a wildcard), client otherwise.
pub fn role_for(local: SocketAddr, listening: &HashSet<SocketAddr>) -> Role {
    let wildcard = match local {
        SocketAddr::V4(_) => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), local.port()),
        SocketAddr::V6(_) => SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), local.port()),
    };
    let v6_wild = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), local.port());
    if listening.contains(&local) || listening.contains(&wildcard) || listening.contains(&v6_wild) {
        Role::Server
    } else {
        Role::Client
    }
}

/// Scans every process's fds for open TCP connections (ESTABLISHED or CLOSE_WAIT), skipping
/// `skip_pid` (the agent). Tables are read once per network namespace.
pub fn scan_existing(proc_root: &Path, skip_pid: u32) -> Vec<ExistingConn> {
    struct NsTables {
        by_inode: HashMap<u64, ProcTcpEntry>,
        listening: HashSet<SocketAddr>,
    }
    let mut tables: HashMap<u64, NsTables> = HashMap::new();
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(proc_root) else {
        return out;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == skip_pid {
            continue;
        }
        let dir = entry.path();
        let Ok(fds) = fs::read_dir(dir.join("fd")) else {
            continue;
        };
        let sockets: Vec<(u32, u64)> = fds
            .flatten()
            .filter_map(|fd| {
                let n = fd.file_name().to_str()?.parse::<u32>().ok()?;
                let link = fs::read_link(fd.path()).ok()?;
                Some((n, socket_inode(&link.to_string_lossy())?))
            })
            .collect();
        if sockets.is_empty() {
            continue;
        }
        let Some(ns) = fs::read_link(dir.join("ns/net"))
            .ok()
            .and_then(|p| ns_inode(&p.to_string_lossy()))
        else {
            continue;
        };
        let t = tables.entry(ns).or_insert_with(|| {
            let mut all = Vec::new();
            for f in ["net/tcp", "net/tcp6"] {
                if let Ok(text) = fs::read_to_string(dir.join(f)) {
                    all.extend(parse_proc_net_tcp(&text));
                }
            }
            NsTables {
                listening: all
                    .iter()
                    .filter(|e| e.state == TCP_LISTEN)
                    .map(|e| e.local)
                    .collect(),
                by_inode: all
                    .into_iter()
                    .filter(|e| e.inode != 0)
                    .map(|e| (e.inode, e))
                    .collect(),
            }
        });
        for (fd, inode) in sockets {
            let Some(e) = t.by_inode.get(&inode) else {
                continue;
            };
            if e.state != TCP_ESTABLISHED && e.state != TCP_CLOSE_WAIT {
                continue;
            }
            let role = role_for(e.local, &t.listening);
            let tuple = Tuple {
                local: canonical(e.local),
                remote: canonical(e.remote),
            };
            out.push(ExistingConn {
                pid,
                fd,
                role,
                tuple,
            });
        }
    }
    out
}

/// IPv4-mapped IPv6 → IPv4, as the decoder does for kernel tuples.
fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

#[cfg(test)]
mod tests;
