//! Service names: config overrides first, then the process's Kubernetes workload
//! (`namespace/workload`), then `comm:port` (plus `@netns:<inode>` outside the host's network
//! namespace). Resolved when figures are read or verdicts written, cached per (pid, port), capped
//! by `max_services` (the rest is `other`).
use std::net::SocketAddr;

use super::{Engine, PORTS_PER_PROCESS, Peer};
use crate::{
    correlate::{config::ServiceMatch, table::hash_one, types::ServiceId},
    identity::fallback_name,
};

impl Engine {
    pub(super) fn ns_key(&self, pid: u32, addr: SocketAddr) -> u64 {
        // Loopback and wildcard addresses repeat in every network namespace; others are unique.
        let ip = addr.ip();
        let ns = if ip.is_loopback() || ip.is_unspecified() {
            self.procs
                .get(&pid)
                .and_then(|p| p.info.as_ref())
                .and_then(|i| i.netns)
                .unwrap_or(0)
        } else {
            0
        };
        hash_one((ns, addr))
    }

    /// The local process whose client socket is the other end of a served connection (`pid`'s,
    /// with the served side's `local` and `remote` addresses): the exact connection first, then
    /// any client socket on the remote address (a destination translated on the way, as a
    /// Service VIP or a redirect is, never matches exactly).
    pub(super) fn caller_pid(
        &self,
        pid: u32,
        local: Option<SocketAddr>,
        remote: Option<SocketAddr>,
    ) -> Option<u32> {
        let at = self.ns_key(pid, remote?);
        local
            .and_then(|l| self.client_conns.get(&hash_one((at, l))))
            .or_else(|| self.client_socks.get(&at))
            .copied()
    }

    /// Name of a process serving on `port` (0 = as a caller: its first served port, if any).
    pub(super) fn name(&mut self, pid: u32, port: u16) -> ServiceId {
        if let Some(p) = self.procs.get(&pid)
            && let Some((_, n)) = p.names.iter().find(|(k, _)| *k == port)
        {
            return n.clone();
        }
        let name = self.resolve_name(pid, port);
        let name = if self.names_issued.contains_key(&name) {
            name
        } else if self.names_issued.len() >= self.cfg.max_services {
            self.stats.overflowed += 1;
            self.other.clone()
        } else {
            self.names_issued.insert(name.clone(), ());
            name
        };
        let p = self.procs.entry(pid).or_default();
        if p.names.len() < PORTS_PER_PROCESS + 1 {
            p.names.push((port, name.clone()));
        }
        name
    }

    pub(super) fn resolve_name(&self, pid: u32, port: u16) -> ServiceId {
        let p = self.procs.get(&pid);
        // An empty comm is no name (the process was gone before it was read).
        let comm = p
            .and_then(|p| p.info.as_ref())
            .map(|i| i.comm.as_str())
            .filter(|c| !c.is_empty());
        let ports: Vec<u16> = if port != 0 {
            vec![port]
        } else {
            p.map(|p| p.ports.clone()).unwrap_or_default()
        };
        for o in &self.cfg.service_names {
            if let ServiceMatch::Pid(x) = o.matcher
                && x == pid
            {
                return ServiceId::new(&o.name);
            }
        }
        if let Some(comm) = comm {
            for o in &self.cfg.service_names {
                if let ServiceMatch::CommPort(c, x) = &o.matcher
                    && c == comm
                    && ports.contains(x)
                {
                    return ServiceId::new(&o.name);
                }
            }
            for o in &self.cfg.service_names {
                if let ServiceMatch::Comm(c) = &o.matcher
                    && c == comm
                {
                    return ServiceId::new(&o.name);
                }
            }
        }
        let info = p.and_then(|p| p.info.as_ref());
        // A container identity resolved it (or the parent it was forked from, which a
        // short-lived child outlives only in our tables): the name operators use.
        let parent_workload = || {
            let parent = info?.parent?;
            self.procs.get(&parent)?.info.as_ref()?.workload.as_ref()
        };
        if let Some(w) = info
            .and_then(|i| i.workload.as_ref())
            .or_else(parent_workload)
        {
            return ServiceId::new(&w.service_name());
        }
        match comm {
            // `@netns:<inode>` outside the host's namespace: two containers on one port differ.
            Some(comm) => ServiceId::new(&fallback_name(
                comm,
                ports.first().copied(),
                info.and_then(|i| i.netns),
                info.and_then(|i| i.host_netns),
            )),
            None => match ports.first() {
                Some(port) => ServiceId::new(&format!("pid:{pid}:{port}")),
                None => ServiceId::new(&format!("pid:{pid}")),
            },
        }
    }

    pub(super) fn peer_name(&mut self, peer: Peer) -> ServiceId {
        match peer {
            Peer::Local { pid, port } => self.name(pid, port),
            Peer::Remote(addr) => {
                // Resolve late: the callee may have been seen serving since the edge was made.
                if let Some(&(pid, port)) = self.listeners.get(&hash_one((0u64, addr))) {
                    return self.name(pid, port);
                }
                ServiceId::new(&addr.to_string())
            }
            Peer::Overflow => self.other.clone(),
        }
    }

    pub(super) fn lookup_name(&self, pid: u32, port: u16) -> ServiceId {
        if let Some(p) = self.procs.get(&pid)
            && let Some((_, n)) = p.names.iter().find(|(k, _)| *k == port)
        {
            return n.clone();
        }
        let n = self.resolve_name(pid, port);
        if self.names_issued.contains_key(&n) || self.names_issued.len() < self.cfg.max_services {
            n
        } else {
            self.other.clone()
        }
    }

    pub(super) fn lookup_peer(&self, peer: Peer) -> ServiceId {
        match peer {
            Peer::Local { pid, port } => self.lookup_name(pid, port),
            Peer::Remote(addr) => match self.listeners.get(&hash_one((0u64, addr))) {
                Some(&(pid, port)) => self.lookup_name(pid, port),
                None => ServiceId::new(&addr.to_string()),
            },
            Peer::Overflow => self.other.clone(),
        }
    }
}
