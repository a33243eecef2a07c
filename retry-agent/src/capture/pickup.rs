//! Connections that predate the agent: found in /proc ([`super::procfs`]), put into the
//! kernel's table so their I/O is traced from now on, and reported as `Existing`.
use std::path::Path;

use aya::maps::{HashMap as BpfHashMap, MapData};
use retry_common::{ConnInfo, ConnKey};

use super::{ConnEvent, ConnEventKind, ConnId, Event, Role, decode, monotonic_ns, procfs};

/// Inserts connections that predate the agent into the kernel map and returns their events.
pub(super) fn pick_up_existing(
    proc_root: &Path,
    agent_tgid: u32,
    scope: &super::Scope,
    conns: &mut BpfHashMap<MapData, ConnKey, ConnInfo>,
) -> Vec<Event> {
    let now = monotonic_ns();
    let mut out = Vec::new();
    for c in procfs::scan_existing(proc_root, agent_tgid) {
        // Outside the scope: left untracked, as the kernel leaves its new sockets.
        if !scope.contains_pid(proc_root, c.pid) {
            continue;
        }
        let key = ConnKey {
            tgid: c.pid,
            fd: c.fd,
        };
        // A connection the programs saw being made meanwhile is already there, with its real role.
        if conns.get(&key, 0).is_ok() {
            continue;
        }
        let role = match c.role {
            Role::Client => retry_common::role::CLIENT,
            Role::Server => retry_common::role::SERVER,
            Role::Unknown => retry_common::role::UNKNOWN,
        };
        let info = ConnInfo {
            generation: now,
            skaddr: 0,
            role,
            fd: c.fd,
            tuple: decode::sock_tuple(&c.tuple),
            // Picked up mid-connection: the HTTP/2 preface went by unseen.
            flags: 0,
            _pad: 0,
        };
        if let Err(e) = conns.insert(&key, &info, 0) {
            tracing::debug!(pid = c.pid, fd = c.fd, error = %e, "cannot track existing connection");
            continue;
        }
        out.push(Event::Conn(ConnEvent {
            conn: ConnId {
                pid: c.pid,
                fd: c.fd,
                generation: now,
            },
            role: c.role,
            tuple: Some(c.tuple),
            pid: c.pid,
            tid: c.pid,
            ts_ns: now,
            kind: ConnEventKind::Existing,
        }));
    }
    tracing::info!(
        connections = out.len(),
        "picked up existing TCP connections"
    );
    out
}
