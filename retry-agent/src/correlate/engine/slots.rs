//! Slot tables: edges (caller pid → peer) and served (pid, port) slots, bounded by `max_edges`
//! (idle slots reused, then overflow), the process table swept of exited processes, and the
//! processes' histories held within `max_history` all together.
use std::net::SocketAddr;

use super::{
    ADDRS_PER_ENTRY, Baseline, EdgeBucket, EdgeState, Engine, Hist, HistTotals, OVERFLOW_EDGE,
    PORTS_PER_PROCESS, Peer, ProcState, SvcState, push_bounded,
};
use crate::correlate::table::{Map, Ring, map};

impl Engine {
    /// Bounded: forget exited processes no edge or service slot refers to any more.
    pub(super) fn sweep_procs(&mut self) {
        let mut referenced: Map<u32, ()> = map();
        for e in &self.edges {
            referenced.insert(e.caller, ());
            if let Peer::Local { pid, .. } = e.peer {
                referenced.insert(pid, ());
            }
        }
        for s in &self.svcs {
            referenced.insert(s.pid, ());
        }
        let before = self.procs.len();
        self.procs
            .retain(|pid, p| !p.exited || referenced.contains_key(pid));
        self.stats.evictions += (before - self.procs.len()) as u64;
    }

    pub(super) fn new_edge(&self, caller: u32, peer: Peer) -> EdgeState {
        EdgeState {
            caller,
            peer,
            addrs: Vec::new(),
            ring: Ring::new(self.window as usize + 1),
            baseline: Baseline::default(),
            requests_total: 0,
            retries_total: 0,
            mismatches_total: 0,
            mem_child_fail: 0.0,
            mem_parent_fail: 0.0,
            last_ns: self.now,
        }
    }

    /// How long an edge or service slot must be idle before it can be reused at the cap:
    /// well past every window that could still read it.
    pub(super) fn idle_ns(&self) -> u64 {
        (2 * self.window * self.bucket_ns)
            .max(self.retry_window_ns)
            .saturating_add(self.grace_ns)
    }

    /// An idle edge slot to reuse (never the overflow edge), forgetting its old key.
    pub(super) fn reuse_edge_slot(&mut self) -> Option<u32> {
        let idle = self.idle_ns();
        let (i, _) = self
            .edges
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(_, e)| self.now.saturating_sub(e.last_ns) > idle)
            .min_by_key(|(_, e)| e.last_ns)?;
        let old = self.edges.get(i)?;
        let key = (old.caller, old.peer);
        self.edge_index.remove(&key);
        Some(i as u32)
    }

    pub(super) fn reuse_svc_slot(&mut self) -> Option<u32> {
        let idle = self.idle_ns();
        let (i, _) = self
            .svcs
            .iter()
            .enumerate()
            .filter(|(_, s)| self.now.saturating_sub(s.last_ns) > idle)
            .min_by_key(|(_, s)| s.last_ns)?;
        let old = self.svcs.get(i)?;
        let key = (old.pid, old.port);
        self.svc_index.remove(&key);
        Some(i as u32)
    }

    pub(super) fn edge_for(&mut self, caller: u32, remote: Option<SocketAddr>) -> u32 {
        let peer = match remote {
            Some(addr) => match self.listeners.get(&self.ns_key(caller, addr)) {
                Some(&(pid, port)) => Peer::Local { pid, port },
                None => Peer::Remote(addr),
            },
            None => Peer::Overflow,
        };
        self.edge_key(caller, peer, remote)
    }

    pub(super) fn edge_key(&mut self, caller: u32, peer: Peer, addr: Option<SocketAddr>) -> u32 {
        let idx = match self.edge_index.get(&(caller, peer)) {
            Some(&i) => i,
            None if peer == Peer::Overflow => OVERFLOW_EDGE,
            None => {
                let fresh = self.new_edge(caller, peer);
                let i = if self.edges.len() <= self.cfg.max_edges {
                    self.edges.push(fresh);
                    self.edges.len() as u32 - 1
                } else if let Some(i) = self.reuse_edge_slot() {
                    if let Some(slot) = self.edges.get_mut(i as usize) {
                        *slot = fresh;
                    }
                    i
                } else {
                    self.stats.overflowed += 1;
                    return OVERFLOW_EDGE;
                };
                self.edge_index.insert((caller, peer), i);
                // Register the names now: the service cap is first come, first served.
                self.name(caller, 0);
                self.peer_name(peer);
                i
            }
        };
        let now = self.now;
        if let Some(e) = self.edges.get_mut(idx as usize) {
            e.last_ns = now;
            if let Some(a) = addr {
                push_bounded(&mut e.addrs, a, ADDRS_PER_ENTRY);
            }
        }
        idx
    }

    pub(super) fn svc_for(&mut self, pid: u32, local: Option<SocketAddr>) -> u32 {
        let port = local.map_or(0, |a| a.port());
        let idx = match self.svc_index.get(&(pid, port)) {
            Some(&i) => i,
            None => {
                let fresh = SvcState {
                    pid,
                    port,
                    addrs: Vec::new(),
                    ring: Ring::new(self.window as usize + 1),
                    baseline: Baseline::default(),
                    last_ns: self.now,
                };
                let i = if self.svcs.len() < self.cfg.max_edges {
                    self.svcs.push(fresh);
                    self.svcs.len() as u32 - 1
                } else if let Some(i) = self.reuse_svc_slot() {
                    if let Some(slot) = self.svcs.get_mut(i as usize) {
                        *slot = fresh;
                    }
                    i
                } else {
                    // Bounded: the newest services share the last slot's figures.
                    self.stats.overflowed += 1;
                    return self.svcs.len().saturating_sub(1) as u32;
                };
                self.svc_index.insert((pid, port), i);
                let p = self.procs.entry(pid).or_default();
                if port != 0 && !p.ports.contains(&port) && p.ports.len() < PORTS_PER_PROCESS {
                    p.ports.push(port);
                    // A process's caller-side name depends on its first served port.
                    p.names.retain(|(k, _)| *k != 0);
                }
                self.name(pid, port);
                i
            }
        };
        let now = self.now;
        if let Some(s) = self.svcs.get_mut(idx as usize) {
            s.last_ns = now;
            if let Some(a) = local {
                push_bounded(&mut s.addrs, a, ADDRS_PER_ENTRY);
            }
        }
        idx
    }

    pub(super) fn edge_bucket(&mut self, edge: u32, t: u64) -> Option<&mut EdgeBucket> {
        let ep = self.epoch(t);
        self.edges.get_mut(edge as usize)?.ring.at(ep)
    }
}

impl Engine {
    /// The engine-wide cap of history `h`: `max_history` requests, a quarter as many failed
    /// calls and responses (the per-process caps' proportions).
    fn hist_cap(&self, h: Hist) -> usize {
        let n = self.cfg.max_history.max(1);
        match h {
            Hist::Inbound => n,
            Hist::Failures | Hist::Responses => (n / 4).max(1),
        }
    }

    /// `pid`'s state, with room for one more entry in its history `h`, which the caller pushes
    /// (it is counted here): the process's own oldest entry goes at its per-process cap or at
    /// the engine-wide one; a process holding none when the engine-wide one is reached takes
    /// room from the process holding most (a quarter of its entries at once, so the scan is
    /// rare). Whatever goes is kept as lost, so a link that needed it says so (`missing`).
    pub(super) fn room_for(&mut self, pid: u32, h: Hist, per_process: usize) -> &mut ProcState {
        let at_cap = *self.hist.get_mut(h) >= self.hist_cap(h);
        let own = self.procs.get(&pid).map_or(0, |p| p.hist_len(h));
        if own == 0 && at_cap {
            self.trim_largest(h);
        }
        let (total, evictions) = (self.hist.get_mut(h), &mut self.stats.evictions);
        let p = self.procs.entry(pid).or_default();
        if own > 0 && (own >= per_process || at_cap) && p.pop_oldest(h) {
            *total = total.saturating_sub(1);
            if own < per_process {
                *evictions += 1;
            }
        }
        *total += 1;
        p
    }

    /// A quarter of the largest holder's entries of `h` go (at least one).
    fn trim_largest(&mut self, h: Hist) {
        let Some(victim) = self.procs.values_mut().max_by_key(|p| p.hist_len(h)) else {
            return;
        };
        let mut freed = 0;
        for _ in 0..(victim.hist_len(h) / 4).max(1) {
            freed += usize::from(victim.pop_oldest(h));
        }
        let total = self.hist.get_mut(h);
        *total = total.saturating_sub(freed);
        self.stats.evictions += freed as u64;
    }

    /// Count the histories afresh (entries leave with their processes, at pid reuse...).
    pub(super) fn recount_histories(&mut self) {
        let mut t = HistTotals::default();
        for p in self.procs.values() {
            for h in [Hist::Failures, Hist::Responses, Hist::Inbound] {
                *t.get_mut(h) += p.hist_len(h);
            }
        }
        self.hist = t;
    }
}
