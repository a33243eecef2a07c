//! The correlation engine: one owner, no IO, bounded state.
//!
//! - Thread context: an inbound (server-role) exchange spans [first request byte, last response
//!   byte] on its thread (goroutine when known); outbound exchanges of the same process that
//!   started on that thread inside the span are its children. Verdicts wait `context_grace_ms`
//!   of capture time after the inbound exchange ends, for late children and overlapping requests.
//! - Unknown is said, never guessed: a thread that ever served overlapping requests (an event
//!   loop), a response written by another thread, or a context the tables lost is ambiguous. An
//!   ambiguous failure is still `claimed` when no outbound call of the whole process to a
//!   fail-close dependency failed during it (then none of its own calls can have failed), else
//!   `missing`.
//! - Figures live in rings of time buckets per internal edge (caller pid → callee pid:port or
//!   remote address) and per served (pid, port); names are resolved when figures are read, so a
//!   process named late (or renamed by config) never splits its history.
use std::{
    collections::{BTreeMap, VecDeque},
    net::SocketAddr,
};

use super::{
    config::{CorrelateConfig, ServiceMatch},
    table::{GenMap, Map, Ring, hash_one, map},
    types::{
        ChildFailure, ClaimCounts, DependencyKind, DepthStats, Edge, EdgeStats, EngineStats, PathStats,
        RetrySuccess, ServiceClaim, ServiceId, Verdict,
    },
};
use crate::{
    capture::{ProcessInfo, Role},
    l7::{Claim, Exchange, ExchangeId, Failure, OutcomeClass, Protocol},
};

#[cfg(test)]
mod tests;

const NS_PER_MS: u64 = 1_000_000;
/// Children remembered per thread (a request with more outbound calls than this that fails is
/// judged from the process-wide failure record instead).
const CHILDREN_PER_THREAD: usize = 16;
const INBOUND_PER_THREAD: usize = 8;
const FAILURES_PER_PROCESS: usize = 256;
const ADDRS_PER_ENTRY: usize = 4;
const PORTS_PER_PROCESS: usize = 8;
/// Failures in one bucket before its failure ratio can mark a fault.
const FAULT_MIN_FAILURES: u32 = 3;
/// Retry gaps needed before a no-jitter verdict, and the coefficient of variation under which
/// gaps count as aligned.
const JITTER_MIN_SAMPLES: u32 = 10;
const JITTER_MAX_CV: f64 = 0.1;
/// Failure-pattern memory: evidence needed to call a dependency fail-open / fail-close, and how
/// strongly the caller's failures must follow the dependency's.
const MEMORY_MIN_SAMPLES: f32 = 3.0;
const MEMORY_FAIL_CLOSE: f32 = 0.5;
const MEMORY_DECAY_AT: f32 = 1000.0;
const BASELINE_ALPHA: f64 = 0.2;
/// Complete quiet buckets a baseline needs before amplification is measured against it.
const BASELINE_MIN_BUCKETS: u32 = 3;
/// Edge 0 absorbs every edge beyond the cap.
const OVERFLOW_EDGE: u32 = 0;

/// Where an outbound exchange went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Peer {
    /// A process on this node serving on that port.
    Local { pid: u32, port: u16 },
    Remote(SocketAddr),
    Overflow,
}

#[derive(Default)]
struct ProcState {
    info: Option<ProcessInfo>,
    /// The process exited: its entry may go once nothing names it.
    exited: bool,
    /// Ports the process served on (first seen first; bounded).
    ports: Vec<u16>,
    /// Resolved names by port (0 = the process as a caller); cleared when naming inputs change.
    names: Vec<(u16, ServiceId)>,
    /// Recent failed outbound calls, process-wide, with the thread that made them.
    failures: VecDeque<(Child, u64)>,
    /// Recent inbound responses of the process: (first response byte written, exchange).
    responses: VecDeque<(u64, ExchangeId)>,
    /// Recent inbound requests of the process: (start, end, exchange).
    inbound: VecDeque<(u64, u64, ExchangeId)>,
    /// End of the newest failure evicted from `failures`: spans older than this are not covered.
    failures_lost_until: u64,
}

#[derive(Clone, Copy)]
struct Child {
    id: ExchangeId,
    start: u64,
    end: u64,
    edge: u32,
    tuple: u64,
    outcome: OutcomeClass,
    status: Option<u16>,
    claim_header: Option<Claim>,
    retry: bool,
    idempotent: bool,
}

#[derive(Clone, Copy)]
struct Window {
    id: ExchangeId,
    start: u64,
    end: u64,
}

#[derive(Default)]
struct ThreadCtx {
    children: VecDeque<Child>,
    inbound: VecDeque<Window>,
    /// Start of the newest child evicted: contexts starting before this may have lost children.
    children_lost_until: u64,
    /// The thread served overlapping requests (an event loop): its contexts are ambiguous.
    event_loop: bool,
}

#[derive(Default, Clone, Copy)]
struct EdgeBucket {
    requests: u32,
    first: u32,
    retries: u32,
    failures: u32,
    hedged: u32,
    non_idempotent: u32,
    mismatches: u32,
    claims: [u32; 3],
    /// Indexed by failure class (transient, semantic, overload, unknown): retries, successes.
    retry_n: [u32; 4],
    retry_ok: [u32; 4],
    gap_n: u32,
    gap_sum: f64,
    gap_sq: f64,
}

/// Arrival rate outside faults, smoothed. The first bucket an edge or service shows up in is
/// partial (it started mid-bucket) and is skipped; until a few buckets are in there is no
/// baseline, so a ramp-up cannot pass for a storm.
#[derive(Clone, Copy, Debug, Default)]
struct Baseline {
    rate: f64,
    buckets: u32,
    seen: bool,
}

impl Baseline {
    fn fold(&mut self, r: f64) {
        if !self.seen {
            self.seen = true;
            return;
        }
        self.rate = if self.buckets == 0 { r } else { self.rate + BASELINE_ALPHA * (r - self.rate) };
        self.buckets = self.buckets.saturating_add(1);
    }

    fn rate(&self) -> Option<f64> {
        (self.buckets >= BASELINE_MIN_BUCKETS).then_some(self.rate)
    }
}

struct EdgeState {
    caller: u32,
    peer: Peer,
    addrs: Vec<SocketAddr>,
    ring: Ring<EdgeBucket>,
    baseline: Baseline,
    requests_total: u64,
    retries_total: u64,
    mismatches_total: u64,
    /// Failure-pattern memory: child failures seen in a judged context, and how many of those
    /// contexts failed.
    mem_child_fail: f32,
    mem_parent_fail: f32,
    /// Capture time of the last exchange on this edge (idle slots are reused at the cap).
    last_ns: u64,
}

#[derive(Default, Clone, Copy)]
struct SvcBucket {
    served: u32,
    failures: u32,
    claims: [u32; 3],
}

struct SvcState {
    pid: u32,
    port: u16,
    addrs: Vec<SocketAddr>,
    ring: Ring<SvcBucket>,
    baseline: Baseline,
    last_ns: u64,
}

/// A failed inbound exchange waiting for its verdict.
struct Pending {
    deadline: u64,
    id: ExchangeId,
    pid: u32,
    thread: u64,
    start: u64,
    end: u64,
    svc: u32,
    /// Client side's (local, remote) tuple hash, i.e. ours reversed.
    tuple: u64,
    remote: Option<SocketAddr>,
    outcome: OutcomeClass,
    status: Option<u16>,
    /// The response was written by another thread than the one that read the request.
    cross_thread: bool,
    /// Context as seen when the exchange arrived (children usually arrive first; the thread's
    /// ring may have moved on by the time the grace period ends).
    ambiguous: bool,
    children: Vec<Child>,
    /// Process-wide checks as of arrival: (a fail-close call failed meanwhile, one failed on a
    /// thread serving no request).
    process_failed: bool,
    orphan_failed: bool,
    /// First response byte written (for linking by timing).
    resp_start: Option<u64>,
    req_end: u64,
}

#[derive(Clone, Copy)]
struct RetryState {
    start: u64,
    end: u64,
    outcome: OutcomeClass,
    attempt: u32,
    thread: u64,
}

#[derive(Clone, Copy)]
struct RecentVerdict {
    claim: Claim,
    start: u64,
    end: u64,
}

pub struct Engine {
    cfg: CorrelateConfig,
    stats: EngineStats,
    bucket_ns: u64,
    window: u64,
    grace_ns: u64,
    retry_window_ns: u64,
    /// Capture time: the newest end seen or ticked to.
    now: u64,
    /// Epochs before this have been checked for faults and folded into baselines.
    rolled_epoch: Option<u64>,
    fault_epoch: Option<u64>,
    procs: Map<u32, ProcState>,
    threads: GenMap<(u32, u64), ThreadCtx>,
    edges: Vec<EdgeState>,
    edge_index: Map<(u32, Peer), u32>,
    svcs: Vec<SvcState>,
    svc_index: Map<(u32, u16), u32>,
    /// (netns-if-loopback, local address) of served sockets → (pid, port).
    listeners: GenMap<u64, (u32, u16)>,
    /// (netns-if-loopback, local address) of client sockets → caller pid.
    client_socks: GenMap<u64, u32>,
    /// Client tuple → the callee's latest verdict on that connection.
    recent_verdicts: GenMap<u64, RecentVerdict>,
    /// Client tuple → (abandoned at, edge).
    abandoned: GenMap<u64, (u64, u32)>,
    /// Client tuples already counted as a timeout mismatch.
    mismatched: GenMap<u64, ()>,
    /// Client tuples whose failure a local callee's claim header already counted on the edge
    /// (so the callee's own verdict does not count it twice).
    header_claimed: GenMap<u64, ()>,
    retry_keys: GenMap<u64, RetryState>,
    pending: VecDeque<Pending>,
    names_issued: Map<ServiceId, ()>,
    other: ServiceId,
}

fn class_index(c: OutcomeClass) -> Option<usize> {
    match c {
        OutcomeClass::Success => None,
        OutcomeClass::Transient => Some(0),
        OutcomeClass::Semantic => Some(1),
        OutcomeClass::Overload => Some(2),
        OutcomeClass::Unknown => Some(3),
    }
}

const FAILURE_CLASSES: [OutcomeClass; 4] =
    [OutcomeClass::Transient, OutcomeClass::Semantic, OutcomeClass::Overload, OutcomeClass::Unknown];

fn claim_index(c: Claim) -> usize {
    match c {
        Claim::Claimed => 0,
        Claim::Unclaimed => 1,
        Claim::Missing => 2,
    }
}

fn counts(c: [u32; 3]) -> ClaimCounts {
    ClaimCounts { claimed: u64::from(c[0]), unclaimed: u64::from(c[1]), missing: u64::from(c[2]) }
}

fn thread_key(tid: u32, goid: Option<u64>) -> u64 {
    // Goroutines are the unit of context in Go; tag them so they never collide with a tid.
    goid.map_or(u64::from(tid), |g| g | (1 << 63))
}

fn tuple_key(local: Option<SocketAddr>, remote: Option<SocketAddr>) -> u64 {
    hash_one((local, remote))
}

fn push_bounded<T: PartialEq>(v: &mut Vec<T>, x: T, cap: usize) {
    if v.len() < cap && !v.contains(&x) {
        v.push(x);
    }
}

fn ratio(n: u64, d: u64) -> f64 {
    if d == 0 { 0.0 } else { n as f64 / d as f64 }
}

impl Engine {
    pub fn new(cfg: CorrelateConfig) -> Self {
        let bucket_ns = cfg.stats_bucket_ms.max(1).saturating_mul(NS_PER_MS);
        let window = u64::from(cfg.stats_window_buckets.clamp(1, super::config::MAX_WINDOW_BUCKETS));
        let mut e = Engine {
            bucket_ns,
            window,
            grace_ns: cfg.context_grace_ms.saturating_mul(NS_PER_MS),
            retry_window_ns: cfg.retry_window_ms.saturating_mul(NS_PER_MS),
            stats: EngineStats::default(),
            now: 0,
            rolled_epoch: None,
            fault_epoch: None,
            procs: map(),
            threads: GenMap::new(cfg.max_threads.max(2)),
            edges: Vec::new(),
            edge_index: map(),
            svcs: Vec::new(),
            svc_index: map(),
            listeners: GenMap::new(cfg.max_threads.max(2)),
            client_socks: GenMap::new(cfg.max_threads.max(2)),
            recent_verdicts: GenMap::new(cfg.max_threads.max(2)),
            abandoned: GenMap::new(cfg.max_threads.max(2)),
            mismatched: GenMap::new(cfg.max_threads.max(2)),
            header_claimed: GenMap::new(cfg.max_threads.max(2)),
            retry_keys: GenMap::new(cfg.max_retry_keys.max(2)),
            pending: VecDeque::new(),
            names_issued: map(),
            other: ServiceId::new("other"),
            cfg,
        };
        e.edges.push(e.new_edge(0, Peer::Overflow));
        e
    }

    pub fn config(&self) -> &CorrelateConfig {
        &self.cfg
    }

    /// Process metadata (names services). A pid reused by another program starts afresh.
    pub fn on_process(&mut self, info: &ProcessInfo) {
        if self.procs.len() >= self.cfg.max_threads && !self.procs.contains_key(&info.pid) {
            self.sweep_procs();
        }
        let p = self.procs.entry(info.pid).or_default();
        if p.info.as_ref().is_some_and(|old| old.comm != info.comm || old.exe != info.exe) {
            *p = ProcState::default();
        }
        p.info = Some(info.clone());
        p.exited = false;
        p.names.clear();
    }

    /// Bounded: forget exited processes no edge or service slot refers to any more.
    fn sweep_procs(&mut self) {
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
        self.procs.retain(|pid, p| !p.exited || referenced.contains_key(pid));
        self.stats.evictions += (before - self.procs.len()) as u64;
    }

    pub fn on_process_exit(&mut self, pid: u32) {
        // Figures keyed by the pid stay until they age out (their names with them); the
        // context goes now, the entry when nothing refers to it.
        if let Some(p) = self.procs.get_mut(&pid) {
            p.failures.clear();
            p.exited = true;
        }
    }

    /// Feed one completed exchange; verdicts for failed inbound exchanges are appended to `out`
    /// (possibly later, once the context window closes, from `tick` or a later `push`).
    pub fn push(&mut self, ex: &Exchange, out: &mut Vec<Verdict>) {
        self.stats.exchanges += 1;
        match ex.role {
            Role::Client => self.push_client(ex),
            Role::Server => self.push_server(ex, out),
            // Unresolved side: nothing sound to say about it.
            Role::Unknown => {}
        }
        self.advance(last_ns(ex), out);
    }

    /// Advance capture time: judge inbound exchanges whose grace has passed, roll buckets.
    pub fn tick(&mut self, now_ns: u64, out: &mut Vec<Verdict>) {
        self.advance(now_ns, out);
    }

    /// Judge everything still pending (end of a replay, shutdown).
    pub fn flush(&mut self, out: &mut Vec<Verdict>) {
        while let Some(p) = self.pending.pop_front() {
            self.judge(p, out);
        }
    }

    /// Latest capture time the engine has seen.
    pub fn now_ns(&self) -> u64 {
        self.now
    }

    pub fn stats(&self) -> EngineStats {
        let mut s = self.stats;
        s.evictions += self.threads.evicted + self.retry_keys.evicted;
        s
    }

    fn advance(&mut self, t: u64, out: &mut Vec<Verdict>) {
        if t > self.now {
            self.now = t;
        }
        while self.pending.front().is_some_and(|p| p.deadline <= self.now) {
            if let Some(p) = self.pending.pop_front() {
                self.judge(p, out);
            }
        }
        self.roll();
    }

    fn epoch(&self, t: u64) -> u64 {
        t / self.bucket_ns
    }

    // ---- naming -------------------------------------------------------------------------

    fn ns_key(&self, pid: u32, addr: SocketAddr) -> u64 {
        // Loopback and wildcard addresses repeat in every network namespace; others are unique.
        let ip = addr.ip();
        let ns = if ip.is_loopback() || ip.is_unspecified() {
            self.procs.get(&pid).and_then(|p| p.info.as_ref()).and_then(|i| i.netns).unwrap_or(0)
        } else {
            0
        };
        hash_one((ns, addr))
    }

    /// Name of a process serving on `port` (0 = as a caller: its first served port, if any).
    fn name(&mut self, pid: u32, port: u16) -> ServiceId {
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

    fn resolve_name(&self, pid: u32, port: u16) -> ServiceId {
        let p = self.procs.get(&pid);
        let comm = p.and_then(|p| p.info.as_ref()).map(|i| i.comm.as_str());
        let ports: Vec<u16> = if port != 0 { vec![port] } else { p.map(|p| p.ports.clone()).unwrap_or_default() };
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
        let base = comm.map_or_else(|| format!("pid:{pid}"), str::to_string);
        match ports.first() {
            Some(port) => ServiceId::new(&format!("{base}:{port}")),
            None => ServiceId::new(&base),
        }
    }

    fn peer_name(&mut self, peer: Peer) -> ServiceId {
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

    // ---- tables -------------------------------------------------------------------------

    fn new_edge(&self, caller: u32, peer: Peer) -> EdgeState {
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
    fn idle_ns(&self) -> u64 {
        (2 * self.window * self.bucket_ns).max(self.retry_window_ns).saturating_add(self.grace_ns)
    }

    /// An idle edge slot to reuse (never the overflow edge), forgetting its old key.
    fn reuse_edge_slot(&mut self) -> Option<u32> {
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

    fn reuse_svc_slot(&mut self) -> Option<u32> {
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

    fn edge_for(&mut self, caller: u32, remote: Option<SocketAddr>) -> u32 {
        let peer = match remote {
            Some(addr) => match self.listeners.get(&self.ns_key(caller, addr)) {
                Some(&(pid, port)) => Peer::Local { pid, port },
                None => Peer::Remote(addr),
            },
            None => Peer::Overflow,
        };
        self.edge_key(caller, peer, remote)
    }

    fn edge_key(&mut self, caller: u32, peer: Peer, addr: Option<SocketAddr>) -> u32 {
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

    fn svc_for(&mut self, pid: u32, local: Option<SocketAddr>) -> u32 {
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

    fn edge_bucket(&mut self, edge: u32, t: u64) -> Option<&mut EdgeBucket> {
        let ep = self.epoch(t);
        self.edges.get_mut(edge as usize)?.ring.at(ep)
    }

    // ---- outbound -----------------------------------------------------------------------

    fn push_client(&mut self, ex: &Exchange) {
        self.stats.outbound += 1;
        let edge = self.edge_for(ex.pid, ex.remote);
        let tuple = tuple_key(ex.local, ex.remote);
        if let Some(local) = ex.local {
            let k = self.ns_key(ex.pid, local);
            self.client_socks.insert(k, ex.pid);
        }
        let (retry, hedged, prev_class, gap) = self.detect_retry(ex, edge);
        let failed = ex.failed();
        let non_idem = retry && !ex.idempotent && !ex.idempotency_key;
        // The callee's claim, when it cannot come from our own verdict on its inbound side.
        let local_callee = matches!(self.edges.get(edge as usize).map(|e| e.peer), Some(Peer::Local { .. }));
        let no_server_side = matches!(ex.failure, Some(Failure::ConnectRefused | Failure::ConnectTimeout));
        // A loopback callee not seen serving yet is on this node: its verdict will say.
        let loopback = ex.remote.is_some_and(|r| r.ip().is_loopback());
        let header_claim = if failed && ((!local_callee && !loopback) || no_server_side) {
            Some(ex.claim_header.unwrap_or(Claim::Missing))
        } else if failed && let Some(c) = ex.claim_header {
            // A local callee behind a proxy (our shim stamps claims): its verdict cannot find
            // this edge (its inbound peer is the proxy), so the header is the edge's evidence.
            self.header_claimed.insert(tuple, ());
            Some(c)
        } else {
            None
        };
        if retry {
            self.stats.retries += 1;
            if hedged {
                self.stats.hedged_retries += 1;
            }
            if non_idem {
                self.stats.non_idempotent_retries += 1;
            }
            if let Some(i) = prev_class.and_then(class_index)
                && let Some(slot) = self.stats.retry_outcomes.get_mut(i + 1)
            {
                slot.0 += 1;
                slot.1 += u64::from(!failed);
            }
        }
        if let Some(e) = self.edges.get_mut(edge as usize) {
            e.requests_total += 1;
            e.retries_total += u64::from(retry);
        }
        if let Some(b) = self.edge_bucket(edge, ex.request_start_ns) {
            b.requests += 1;
            if retry {
                b.retries += 1;
            } else {
                b.first += 1;
            }
            b.failures += u32::from(failed);
            b.hedged += u32::from(hedged);
            b.non_idempotent += u32::from(non_idem);
            if let Some(i) = prev_class.and_then(class_index) {
                if let Some(n) = b.retry_n.get_mut(i) {
                    *n += 1;
                }
                if !failed && let Some(n) = b.retry_ok.get_mut(i) {
                    *n += 1;
                }
            }
            if let Some(g) = gap {
                b.gap_n += 1;
                b.gap_sum += g;
                b.gap_sq += g * g;
            }
            if let Some(c) = header_claim
                && let Some(n) = b.claims.get_mut(claim_index(c))
            {
                *n += 1;
            }
        }
        if ex.failure == Some(Failure::Abandoned) {
            self.abandoned.insert(tuple, (ex.end_ns(), edge));
        }
        let child = Child {
            id: ex.id,
            start: ex.request_start_ns,
            end: ex.end_ns(),
            edge,
            tuple,
            outcome: ex.outcome,
            status: ex.status,
            claim_header: ex.claim_header,
            retry,
            idempotent: ex.idempotent || ex.idempotency_key,
        };
        if failed {
            let p = self.procs.entry(ex.pid).or_default();
            if p.failures.len() >= FAILURES_PER_PROCESS
                && let Some((old, _)) = p.failures.pop_front()
            {
                p.failures_lost_until = p.failures_lost_until.max(old.end);
            }
            p.failures.push_back((child, thread_key(ex.tid, ex.goid)));
        }
        let ctx = self.threads.get_or_insert_with((ex.pid, thread_key(ex.tid, ex.goid)), ThreadCtx::default);
        if ctx.children.len() >= CHILDREN_PER_THREAD
            && let Some(old) = ctx.children.pop_front()
        {
            ctx.children_lost_until = ctx.children_lost_until.max(old.start);
        }
        ctx.children.push_back(child);
    }

    /// Attempt k+1 of the same request on the same edge: returns (retry, hedged, class of the
    /// failure retried, gap since the previous attempt ended in seconds).
    fn detect_retry(&mut self, ex: &Exchange, edge: u32) -> (bool, bool, Option<OutcomeClass>, Option<f64>) {
        let marker = ex.retry_markers.says_retry();
        // Without a method there is nothing to call "the same request" (opaque bytes).
        if ex.protocol == Protocol::Opaque || ex.method.is_none() {
            return (marker, false, marker.then_some(OutcomeClass::Unknown), None);
        }
        let key = hash_one((
            ex.pid,
            edge,
            &ex.method,
            ex.authority.as_deref(),
            // The path, not the route: /users/1 and /users/2 are different requests.
            ex.path.as_deref().or(ex.route.as_deref()),
            ex.query_hash,
            ex.body_hash,
        ));
        let start = ex.request_start_ns;
        let end = ex.end_ns();
        let window = self.retry_window_ns;
        let prev = self.retry_keys.get(&key).copied();
        let mut out = (false, false, None, None);
        let mut attempt = 1;
        match prev {
            Some(p) if start >= p.start => {
                if p.end > start && start - p.start <= window {
                    // The previous attempt was still in flight: a hedge (or a per-try timeout).
                    out = (true, true, Some(OutcomeClass::Unknown), None);
                    attempt = p.attempt + 1;
                } else if p.outcome.is_failure() && start - p.end <= window && !self.context_ended(ex.pid, p, start) {
                    let gap = (start - p.end) as f64 / 1e9;
                    out = (true, false, Some(p.outcome), Some(gap));
                    attempt = p.attempt + 1;
                }
            }
            Some(p) => {
                // Reported out of order: this attempt started first and was still running when
                // the recorded one started, so the recorded one was its hedge. Fix the books.
                if end > p.start && p.start - start <= window && p.attempt == 1 {
                    let ep = self.epoch(p.start);
                    if let Some(b) = self.edges.get_mut(edge as usize).and_then(|e| e.ring.at(ep)) {
                        b.first = b.first.saturating_sub(1);
                        b.retries += 1;
                        b.hedged += 1;
                    }
                    self.stats.retries += 1;
                    self.stats.hedged_retries += 1;
                    if let Some(r) = self.retry_keys.get_mut(&key) {
                        r.attempt = 2;
                    }
                }
                return if marker { (true, false, Some(OutcomeClass::Unknown), None) } else { (false, false, None, None) };
            }
            None => {}
        }
        if marker && !out.0 {
            out = (true, false, Some(prev.map_or(OutcomeClass::Unknown, |p| p.outcome)), None);
            attempt = 2;
        }
        let thread = thread_key(ex.tid, ex.goid);
        self.retry_keys.insert(key, RetryState { start, end, outcome: ex.outcome, attempt, thread });
        out
    }

    /// The inbound request that made attempt `p` was answered before `start`: a repeat now is
    /// not that request's retry (it is a new request, e.g. our caller's retry reaching us).
    /// Only known for threads that serve one request at a time.
    fn context_ended(&self, pid: u32, p: RetryState, start: u64) -> bool {
        self.threads.get(&(pid, p.thread)).is_some_and(|ctx| {
            !ctx.event_loop && ctx.inbound.iter().any(|w| w.start <= p.start && w.end >= p.end && w.end <= start)
        })
    }

    // ---- inbound ------------------------------------------------------------------------

    fn push_server(&mut self, ex: &Exchange, out: &mut Vec<Verdict>) {
        self.stats.inbound += 1;
        let svc = self.svc_for(ex.pid, ex.local);
        if let Some(local) = ex.local {
            let port = local.port();
            let k = self.ns_key(ex.pid, local);
            self.listeners.insert(k, (ex.pid, port));
            // Also by bare address, for late resolution of remote-keyed edges.
            self.listeners.insert(hash_one((0u64, local)), (ex.pid, port));
        }
        // The caller went away (gave up, reset): a timeout mismatch, not this service's error, so
        // no verdict and no failure in its figures.
        let peer_gone = caller_gone(ex);
        let failed = ex.failed() && !peer_gone;
        let ep = self.epoch(ex.request_start_ns);
        if let Some(b) = self.svcs.get_mut(svc as usize).and_then(|s| s.ring.at(ep)) {
            b.served += 1;
            b.failures += u32::from(failed);
        }
        // Client-side tuple of this connection: (their local, their remote) = (our remote, our local).
        let tuple = tuple_key(ex.remote, ex.local);
        self.timeout_mismatch(ex, tuple);

        let thread = thread_key(ex.tid, ex.goid);
        let cross_thread = ex.goid.is_none() && ex.response_tid.is_some_and(|t| t != ex.tid);
        let window = Window { id: ex.id, start: ex.request_start_ns, end: last_ns(ex) };
        {
            // Process-wide histories, for the links thread context cannot make.
            let p = self.procs.entry(ex.pid).or_default();
            if let Some(rs) = ex.response_start_ns {
                if p.responses.len() >= FAILURES_PER_PROCESS {
                    p.responses.pop_front();
                }
                p.responses.push_back((rs, ex.id));
            }
            if p.inbound.len() >= FAILURES_PER_PROCESS {
                p.inbound.pop_front();
            }
            p.inbound.push_back((window.start, window.end, ex.id));
        }
        // A failed response whose timing was lost (l7 saw the connection end before the
        // response completed): the span of the request is unknown, so is its context.
        let span_unknown = ex.response_start_ns.is_none() && ex.response_end_ns.is_none() && ex.status.is_some();
        let ctx = self.threads.get_or_insert_with((ex.pid, thread), ThreadCtx::default);
        if ctx.inbound.iter().any(|w| w.id != window.id && w.start < window.end && window.start < w.end) {
            ctx.event_loop = true;
        }
        if ctx.inbound.len() >= INBOUND_PER_THREAD {
            ctx.inbound.pop_front();
        }
        ctx.inbound.push_back(window);

        if failed {
            let (ambiguous, children) = self.children_of(ex.pid, thread, window.start, window.end);
            let ambiguous = ambiguous || span_unknown;
            let process_failed = self.process_failed_during(ex.pid, window.start, window.end);
            let orphan_failed = self.orphan_failed_during(ex.pid, thread, window.start, window.end);
            if self.pending.len() >= self.cfg.max_pending
                && let Some(p) = self.pending.pop_front()
            {
                // Bounded: judge the oldest now rather than drop it.
                self.stats.evictions += 1;
                self.judge(p, out);
            }
            self.pending.push_back(Pending {
                deadline: window.end.saturating_add(self.grace_ns),
                id: ex.id,
                pid: ex.pid,
                thread,
                start: ex.request_start_ns,
                end: window.end,
                svc,
                tuple,
                remote: ex.remote,
                outcome: ex.outcome,
                status: ex.status,
                cross_thread,
                ambiguous,
                children,
                process_failed,
                orphan_failed,
                resp_start: ex.response_start_ns,
                req_end: ex.request_end_ns,
            });
        } else if self.cfg.failure_memory && !cross_thread {
            // A success despite failed children: evidence those dependencies are fail-open. A
            // failure a later retry on the same edge recovered is no such evidence: the caller
            // survived it by retrying, not by doing without (a fail-close dependency under a
            // transient fault looks exactly like that). No allocation unless a child failed:
            // this is the hot path.
            let mut failed_edges: Vec<u32> = match self.threads.get(&(ex.pid, thread)) {
                Some(ctx) if !ctx.event_loop && ctx.children_lost_until < window.start => {
                    let in_window = |c: &&Child| c.start >= window.start && c.start <= window.end;
                    ctx.children
                        .iter()
                        .filter(in_window)
                        .filter(|c| c.outcome.is_failure())
                        .filter(|c| {
                            !ctx.children.iter().filter(in_window).any(|r| {
                                r.retry && r.edge == c.edge && r.start > c.start && !r.outcome.is_failure()
                            })
                        })
                        .map(|c| c.edge)
                        .collect()
                }
                _ => Vec::new(),
            };
            failed_edges.sort_unstable();
            failed_edges.dedup();
            for edge in failed_edges {
                self.remember(edge, false);
            }
        }
    }

    fn timeout_mismatch(&mut self, ex: &Exchange, tuple: u64) {
        let abandoned = self.abandoned.get(&tuple).copied();
        let edge = match abandoned {
            // The caller gave up before we finished: our work was wasted.
            Some((at, edge)) if last_ns(ex) > at => Some(edge),
            _ if caller_gone(ex) => {
                // The peer closed or reset while we were still working (caller not on this node,
                // or not captured): attribute to its edge if we know it.
                let caller = ex.remote.and_then(|r| self.client_socks.get(&self.ns_key(ex.pid, r)).copied());
                Some(match caller {
                    Some(c) => {
                        let svc_port = ex.local.map_or(0, |a| a.port());
                        self.edge_key(c, Peer::Local { pid: ex.pid, port: svc_port }, ex.local)
                    }
                    None => OVERFLOW_EDGE,
                })
            }
            _ => None,
        };
        if let Some(edge) = edge {
            // Once per connection: a caller that gave up closes it, and l7 may report both the
            // unanswered request and the late response written into the closed socket.
            if self.mismatched.get(&tuple).is_some() {
                return;
            }
            self.mismatched.insert(tuple, ());
            self.stats.timeout_mismatches += 1;
            if let Some(e) = self.edges.get_mut(edge as usize) {
                e.mismatches_total += 1;
            }
            if let Some(b) = self.edge_bucket(edge, ex.request_start_ns) {
                b.mismatches += 1;
            }
        }
    }

    /// Children of a context on (pid, thread) spanning [start, end]; `true` if the context is
    /// ambiguous (event loop, lost children, unknown thread).
    fn children_of(&mut self, pid: u32, thread: u64, start: u64, end: u64) -> (bool, Vec<Child>) {
        let Some(ctx) = self.threads.get(&(pid, thread)) else {
            return (true, Vec::new());
        };
        let ambiguous = ctx.event_loop || ctx.children_lost_until >= start;
        let children = ctx.children.iter().filter(|c| c.start >= start && c.start <= end).copied().collect();
        (ambiguous, children)
    }

    fn dependency(&self, edge: u32) -> DependencyKind {
        let Some(e) = self.edges.get(edge as usize) else { return DependencyKind::Unknown };
        if e.mem_child_fail < MEMORY_MIN_SAMPLES {
            return DependencyKind::Unknown;
        }
        // Laplace-smoothed share of this dependency's failures the caller did not survive.
        if (e.mem_parent_fail + 1.0) / (e.mem_child_fail + 2.0) >= MEMORY_FAIL_CLOSE {
            DependencyKind::FailClose
        } else {
            DependencyKind::FailOpen
        }
    }

    fn fail_close(&self, edge: u32) -> bool {
        !self.cfg.failure_memory || self.dependency(edge) != DependencyKind::FailOpen
    }

    fn remember(&mut self, edge: u32, parent_failed: bool) {
        if let Some(e) = self.edges.get_mut(edge as usize) {
            if e.mem_child_fail >= MEMORY_DECAY_AT {
                // Halve the evidence so a dependency that changes behaviour is relearned.
                e.mem_child_fail /= 2.0;
                e.mem_parent_fail /= 2.0;
            }
            e.mem_child_fail += 1.0;
            e.mem_parent_fail += f32::from(u8::from(parent_failed));
        }
    }

    /// The callee's claim on a failed child call.
    fn callee_claim(&self, c: &Child) -> Claim {
        if let Some(v) = self.recent_verdicts.get(&c.tuple)
            && v.start >= c.start
            && v.end <= c.end.saturating_add(self.grace_ns)
        {
            return v.claim;
        }
        c.claim_header.unwrap_or(Claim::Missing)
    }

    fn judge(&mut self, p: Pending, out: &mut Vec<Verdict>) {
        // Arrival-time context plus whatever arrived during the grace period.
        let mut children = p.children.clone();
        let mut ambiguous = p.ambiguous || p.cross_thread;
        if let Some(ctx) = self.threads.get(&(p.pid, p.thread)) {
            ambiguous |= ctx.event_loop;
            for c in ctx.children.iter().filter(|c| c.start >= p.start && c.start <= p.end) {
                if !children.iter().any(|k| k.id == c.id) {
                    children.push(*c);
                }
            }
        }
        let covered = self.procs.get(&p.pid).is_none_or(|x| x.failures_lost_until < p.start);
        let (process_failed, orphan_failed) = if covered {
            (
                self.process_failed_during(p.pid, p.start, p.end),
                self.orphan_failed_during(p.pid, p.thread, p.start, p.end),
            )
        } else {
            (p.process_failed, p.orphan_failed)
        };
        let mut caused_by = Vec::new();
        // Thread context cannot tell (or saw a failure it cannot place): try the timing link.
        let mut linked = false;
        if (ambiguous && process_failed) || (!ambiguous && orphan_failed && children.iter().all(|c| !c.outcome.is_failure())) {
            if let Some(c) = self.link_by_timing(&p) {
                children = vec![c];
                ambiguous = false;
                linked = true;
                self.stats.timing_links += 1;
            } else if ambiguous && let Some(cs) = self.link_sole_inbound(&p) {
                children = cs;
                ambiguous = false;
                linked = true;
                self.stats.sole_links += 1;
            }
        }
        let claim = if !ambiguous {
            let failed: Vec<Child> = children.into_iter().filter(|c| c.outcome.is_failure() && c.end <= p.end).collect();
            let mut seen: Vec<u32> = Vec::new();
            for c in &failed {
                // Memory learns only from contexts thread context proved.
                if self.cfg.failure_memory && !linked && !seen.contains(&c.edge) {
                    seen.push(c.edge);
                    self.remember(c.edge, true);
                }
            }
            let causes: Vec<&Child> = failed.iter().filter(|c| self.fail_close(c.edge)).collect();
            if causes.is_empty() {
                if orphan_failed && !linked { Claim::Missing } else { Claim::Claimed }
            } else if self.cfg.at_least_once && causes.iter().all(|c| self.owes_retry(c, &failed)) {
                // The chain must keep one retry: nobody below retried a retryable error and this
                // edge never retries, so our caller's retry is the one.
                Claim::Claimed
            } else {
                for c in causes {
                    let callee = self.edges.get(c.edge as usize).map(|e| e.peer).unwrap_or(Peer::Overflow);
                    let callee = self.peer_name(callee);
                    caused_by.push(ChildFailure { exchange: c.id, callee, outcome: c.outcome, status: c.status });
                }
                Claim::Unclaimed
            }
        } else if process_failed {
            Claim::Missing
        } else {
            // Sound without linking: no outbound call of the whole process failed meanwhile.
            Claim::Claimed
        };
        self.stats.verdicts.add(claim);
        self.recent_verdicts.insert(p.tuple, RecentVerdict { claim, start: p.start, end: p.end });
        let ep = self.epoch(p.start);
        if let Some(b) = self.svcs.get_mut(p.svc as usize).and_then(|s| s.ring.at(ep))
            && let Some(n) = b.claims.get_mut(claim_index(claim))
        {
            *n += 1;
        }
        // The caller's edge learns the claim its callee (us) gave.
        let caller = p.remote.and_then(|r| self.client_socks.get(&self.ns_key(p.pid, r)).copied());
        let (svc_pid, svc_port) = self.svcs.get(p.svc as usize).map_or((p.pid, 0), |s| (s.pid, s.port));
        let caller_name = match caller {
            Some(c) => {
                let edge = self.edge_key(c, Peer::Local { pid: svc_pid, port: svc_port }, None);
                let counted = self.header_claimed.get(&p.tuple).is_some();
                if !counted
                    && let Some(b) = self.edge_bucket(edge, p.start)
                    && let Some(n) = b.claims.get_mut(claim_index(claim))
                {
                    *n += 1;
                }
                Some(self.name(c, 0))
            }
            None => None,
        };
        let service = self.name(svc_pid, svc_port);
        out.push(Verdict {
            exchange: p.id,
            service,
            caller: caller_name,
            claim,
            outcome: p.outcome,
            status: p.status,
            caused_by,
            ts_ns: p.end,
        });
    }

    /// At-least-once: a failed child whose error was retryable and owned (or unowned-unknown)
    /// below, on an edge that never retries, and not retried in this context.
    fn owes_retry(&self, c: &Child, failed: &[Child]) -> bool {
        let retryable = match c.outcome {
            OutcomeClass::Transient => true,
            OutcomeClass::Unknown => c.idempotent,
            _ => false,
        };
        let edge_retries = self.edges.get(c.edge as usize).map_or(0, |e| e.retries_total);
        retryable
            && self.callee_claim(c) != Claim::Unclaimed
            && edge_retries == 0
            && !failed.iter().any(|o| o.edge == c.edge && o.retry)
    }

    /// When this was the only inbound request the process served during its span, every
    /// outbound call the process made inside that span was made for it, whichever thread (or
    /// goroutine, or event-loop turn) did the I/O. None when another known inbound request
    /// overlaps, or the process's failure history does not reach back that far. (A request
    /// still unanswered when we judge is not known yet: the grace period is the margin.)
    fn link_sole_inbound(&self, p: &Pending) -> Option<Vec<Child>> {
        let proc_ = self.procs.get(&p.pid)?;
        // Both histories must reach back to this request (they are bounded).
        if proc_.failures_lost_until >= p.start || !proc_.inbound.iter().any(|x| x.2 == p.id) {
            return None;
        }
        let overlapped = proc_.inbound.iter().any(|&(s, e, id)| id != p.id && s < p.end && p.start < e);
        if overlapped {
            return None;
        }
        let children: Vec<Child> =
            proc_.failures.iter().map(|(c, _)| *c).filter(|c| c.start >= p.start && c.end <= p.end).collect();
        (!children.is_empty()).then_some(children)
    }

    /// The one failed outbound call of the process that completed within `timing_link_ms`
    /// before this response started, after the request was read, and that no other response of
    /// the process followed as closely. An event loop answers right after the call it waited
    /// for returns; when two calls or two responses compete, nothing is linked.
    fn link_by_timing(&self, p: &Pending) -> Option<Child> {
        let gap = self.cfg.timing_link_ms.saturating_mul(NS_PER_MS);
        let resp = p.resp_start?;
        if gap == 0 {
            return None;
        }
        let proc_ = self.procs.get(&p.pid)?;
        let before = |t: u64| t <= resp && resp - t <= gap;
        let mut found = None;
        for (c, _) in &proc_.failures {
            if c.start >= p.req_end && c.end <= resp && before(c.end) {
                if found.is_some() {
                    return None; // two candidates
                }
                found = Some(*c);
            }
        }
        let c = found?;
        // Another response of the process written as soon after the call: it could be the one
        // the call answered.
        let competing_response = proc_
            .responses
            .iter()
            .any(|&(rs, id)| id != p.id && rs >= c.end && rs.saturating_sub(c.end) <= gap);
        if competing_response {
            return None;
        }
        Some(c)
    }

    fn process_failed_during(&self, pid: u32, start: u64, end: u64) -> bool {
        let Some(p) = self.procs.get(&pid) else { return false };
        if p.failures_lost_until >= start {
            return true; // cannot prove otherwise
        }
        p.failures.iter().any(|(c, _)| c.start <= end && c.end >= start && self.fail_close(c.edge))
    }

    /// A fail-close outbound failure of the process during [start, end] on another thread that
    /// was serving no inbound request then: work handed off to a pool, i.e. a context we could
    /// not follow. Its inbound request is somewhere; it may be ours.
    fn orphan_failed_during(&self, pid: u32, thread: u64, start: u64, end: u64) -> bool {
        let Some(p) = self.procs.get(&pid) else { return false };
        p.failures.iter().any(|&(c, t)| {
            let (s, e, edge) = (c.start, c.end, c.edge);
            t != thread
                && s <= end
                && e >= start
                && self.fail_close(edge)
                && !self
                    .threads
                    .get(&(pid, t))
                    .is_some_and(|ctx| ctx.inbound.iter().any(|w| w.start <= s && s <= w.end))
        })
    }

    // ---- time ---------------------------------------------------------------------------

    /// Check complete buckets for faults and fold them into baselines (frozen during faults).
    fn roll(&mut self) {
        let now_epoch = self.epoch(self.now);
        let from = match self.rolled_epoch {
            Some(r) if r >= now_epoch => return,
            Some(r) => r.max(now_epoch.saturating_sub(self.window)),
            None => now_epoch.saturating_sub(1),
        };
        let ratio = self.cfg.fault_failure_ratio;
        let faulty = |failures: u32, total: u32| {
            failures >= FAULT_MIN_FAILURES && f64::from(failures) >= ratio * f64::from(total)
        };
        for ep in from..now_epoch {
            let fault = self.edges.iter().any(|e| e.ring.get(ep).is_some_and(|b| faulty(b.failures, b.requests)))
                || self.svcs.iter().any(|s| s.ring.get(ep).is_some_and(|b| faulty(b.failures, b.served)));
            if fault {
                self.fault_epoch = Some(ep);
            }
            if self.fault_epoch.is_some_and(|f| ep < f + self.window) {
                continue; // frozen
            }
            let secs = self.bucket_ns as f64 / 1e9;
            for e in &mut self.edges {
                if let Some(b) = e.ring.get(ep).filter(|b| b.requests > 0) {
                    let r = f64::from(b.requests) / secs;
                    e.baseline.fold(r);
                }
            }
            for s in &mut self.svcs {
                if let Some(b) = s.ring.get(ep).filter(|b| b.served > 0) {
                    let r = f64::from(b.served) / secs;
                    s.baseline.fold(r);
                }
            }
        }
        self.rolled_epoch = Some(now_epoch);
    }

    fn fault_active(&self) -> bool {
        let now_epoch = self.epoch(self.now);
        self.fault_epoch.is_some_and(|f| now_epoch < f + 1 + self.window)
    }

    /// Complete buckets of the current window: [from, to).
    fn window_epochs(&self) -> (u64, u64) {
        let to = self.epoch(self.now);
        (to.saturating_sub(self.window), to)
    }

    // ---- read-out -----------------------------------------------------------------------

    /// Figures per edge over the window, internal edges merged by service name.
    pub fn edges(&self) -> Vec<EdgeStats> {
        let (from, to) = self.window_epochs();
        let secs = (to - from) as f64 * self.bucket_ns as f64 / 1e9;
        let fault = self.fault_active();
        let mut merged: BTreeMap<Edge, (EdgeBucket, EdgeStats)> = BTreeMap::new();
        // Names: resolving needs &mut for the caches, so use the uncached resolver here.
        for (i, e) in self.edges.iter().enumerate() {
            let mut sum = EdgeBucket::default();
            for b in e.ring.range(from, to) {
                add_bucket(&mut sum, b);
            }
            if sum.requests == 0 && sum.claims.iter().all(|&n| n == 0) && sum.mismatches == 0 {
                continue;
            }
            let edge = if i as u32 == OVERFLOW_EDGE {
                Edge { caller: self.other.clone(), callee: self.other.clone() }
            } else {
                Edge { caller: self.lookup_name(e.caller, 0), callee: self.lookup_peer(e.peer) }
            };
            let fresh = !merged.contains_key(&edge);
            let entry = merged.entry(edge.clone()).or_insert_with(|| {
                (EdgeBucket::default(), empty_stats(edge, secs, fault))
            });
            add_bucket(&mut entry.0, &sum);
            let s = &mut entry.1;
            for a in &e.addrs {
                push_bounded(&mut s.callee_addrs, *a, ADDRS_PER_ENTRY);
            }
            if let Some(b) = e.baseline.rate() {
                s.baseline_rate = Some(s.baseline_rate.unwrap_or(0.0) + b);
            }
            s.timeout_mismatches_total += e.mismatches_total;
            s.requests_total += e.requests_total;
            s.retries_total += e.retries_total;
            // Merged edges: the most cautious learned kind wins (fail-close > unknown > open).
            let kind = self.dependency(i as u32);
            s.dependency = if fresh { kind } else { match (s.dependency, kind) {
                (DependencyKind::FailClose, _) | (_, DependencyKind::FailClose) => DependencyKind::FailClose,
                (DependencyKind::Unknown, _) | (_, DependencyKind::Unknown) => DependencyKind::Unknown,
                _ => DependencyKind::FailOpen,
            } };
        }
        merged.into_values().map(|(b, s)| finish_stats(b, s)).collect()
    }

    fn lookup_name(&self, pid: u32, port: u16) -> ServiceId {
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

    fn lookup_peer(&self, peer: Peer) -> ServiceId {
        match peer {
            Peer::Local { pid, port } => self.lookup_name(pid, port),
            Peer::Remote(addr) => match self.listeners.get(&hash_one((0u64, addr))) {
                Some(&(pid, port)) => self.lookup_name(pid, port),
                None => ServiceId::new(&addr.to_string()),
            },
            Peer::Overflow => self.other.clone(),
        }
    }

    /// Amplification per depth of the node's call graph and the storm radius.
    pub fn paths(&self) -> PathStats {
        let (from, to) = self.window_epochs();
        let secs = (to - from) as f64 * self.bucket_ns as f64 / 1e9;
        let edges = self.edges();
        // Local services with their window arrival and baseline, merged by name.
        let mut svc: BTreeMap<ServiceId, (f64, Option<f64>)> = BTreeMap::new();
        for s in &self.svcs {
            let served: u64 = s.ring.range(from, to).map(|b| u64::from(b.served)).sum();
            if served == 0 && s.baseline.rate().is_none() {
                continue;
            }
            let e = svc.entry(self.lookup_name(s.pid, s.port)).or_insert((0.0, None));
            e.0 += served as f64 / secs;
            if let Some(b) = s.baseline.rate() {
                e.1 = Some(e.1.unwrap_or(0.0) + b);
            }
        }
        let active: Vec<&EdgeStats> = edges.iter().filter(|e| e.requests > 0).collect();
        let has_caller = |s: &ServiceId| active.iter().any(|e| &e.edge.callee == s && svc.contains_key(&e.edge.caller) && &e.edge.caller != s);
        let mut depth_of: BTreeMap<ServiceId, u32> = BTreeMap::new();
        let mut frontier: Vec<ServiceId> = svc.keys().filter(|s| !has_caller(s)).cloned().collect();
        let mut d = 0u32;
        while !frontier.is_empty() && d <= 64 {
            let mut next = Vec::new();
            for s in frontier {
                if depth_of.contains_key(&s) {
                    continue;
                }
                depth_of.insert(s.clone(), d);
                for e in active.iter().filter(|e| e.edge.caller == s) {
                    if svc.contains_key(&e.edge.callee) && !depth_of.contains_key(&e.edge.callee) {
                        next.push(e.edge.callee.clone());
                    }
                }
            }
            frontier = next;
            d += 1;
        }
        let mut depths: BTreeMap<u32, DepthStats> = BTreeMap::new();
        for (s, depth) in &depth_of {
            let Some(&(rate, base)) = svc.get(s) else { continue };
            let ds = depths.entry(*depth).or_insert_with(|| DepthStats {
                depth: *depth,
                services: Vec::new(),
                arrival_rate: 0.0,
                baseline_rate: None,
                amplification: 1.0,
            });
            ds.services.push(s.clone());
            ds.arrival_rate += rate;
            if let Some(b) = base {
                ds.baseline_rate = Some(ds.baseline_rate.unwrap_or(0.0) + b);
            }
        }
        for ds in depths.values_mut() {
            ds.amplification = match ds.baseline_rate {
                Some(b) if b > 0.0 => ds.arrival_rate / b,
                _ => 1.0,
            };
        }
        let fault = self.fault_active();
        let (storm_radius, storm_path) = if fault { storm(&edges) } else { (0, Vec::new()) };
        PathStats { depths: depths.into_values().collect(), storm_radius, storm_path, fault_active: fault }
    }

    /// Per service: the claim its error responses should carry now (majority of the window).
    pub fn service_claims(&self) -> Vec<ServiceClaim> {
        let (from, to) = self.window_epochs();
        let mut by: BTreeMap<ServiceId, ServiceClaim> = BTreeMap::new();
        for s in &self.svcs {
            let mut c = [0u32; 3];
            for b in s.ring.range(from, to) {
                for (x, y) in c.iter_mut().zip(b.claims) {
                    *x += y;
                }
            }
            let name = self.lookup_name(s.pid, s.port);
            let e = by.entry(name.clone()).or_insert_with(|| ServiceClaim {
                service: name,
                addrs: Vec::new(),
                claim: Claim::Missing,
                counts: ClaimCounts::default(),
            });
            for a in &s.addrs {
                push_bounded(&mut e.addrs, *a, ADDRS_PER_ENTRY);
            }
            let add = counts(c);
            e.counts.claimed += add.claimed;
            e.counts.unclaimed += add.unclaimed;
            e.counts.missing += add.missing;
        }
        by.into_values()
            .map(|mut s| {
                s.claim = s.counts.majority().unwrap_or(Claim::Missing);
                s
            })
            .collect()
    }
}

/// The latest instant an exchange is known to span: l7 may lose the response end (a close
/// racing the last write) and keep only its start.
fn last_ns(ex: &Exchange) -> u64 {
    ex.response_end_ns.unwrap_or(0).max(ex.response_start_ns.unwrap_or(0)).max(ex.request_end_ns)
}

/// A server-side exchange the caller ended before it got its answer: it gave up (or reset).
/// Not `ClosedNoResponse` (our own close, or idleness), and not an error response that was
/// written whole before a close raced it (the service did answer, with an error).
fn caller_gone(ex: &Exchange) -> bool {
    match ex.failure {
        Some(Failure::Abandoned | Failure::Reset) => true,
        Some(Failure::ResetMidResponse) => !ex.status.is_some_and(|s| s >= 400),
        _ => false,
    }
}

fn add_bucket(a: &mut EdgeBucket, b: &EdgeBucket) {
    a.requests += b.requests;
    a.first += b.first;
    a.retries += b.retries;
    a.failures += b.failures;
    a.hedged += b.hedged;
    a.non_idempotent += b.non_idempotent;
    a.mismatches += b.mismatches;
    for i in 0..3 {
        if let (Some(x), Some(y)) = (a.claims.get_mut(i), b.claims.get(i)) {
            *x += y;
        }
    }
    for i in 0..4 {
        if let (Some(x), Some(y)) = (a.retry_n.get_mut(i), b.retry_n.get(i)) {
            *x += y;
        }
        if let (Some(x), Some(y)) = (a.retry_ok.get_mut(i), b.retry_ok.get(i)) {
            *x += y;
        }
    }
    a.gap_n += b.gap_n;
    a.gap_sum += b.gap_sum;
    a.gap_sq += b.gap_sq;
}

fn empty_stats(edge: Edge, secs: f64, fault: bool) -> EdgeStats {
    EdgeStats {
        edge,
        callee_addrs: Vec::new(),
        window_seconds: secs,
        request_rate: 0.0,
        requests: 0,
        first_attempts: 0,
        retries: 0,
        failures: 0,
        attempts_per_request: 1.0,
        retry_ratio: 0.0,
        failure_ratio: 0.0,
        retry_success: Vec::new(),
        callee_claims: ClaimCounts::default(),
        amplification: 1.0,
        baseline_rate: None,
        fault_active: fault,
        hedged_retries: 0,
        non_idempotent_retries: 0,
        no_jitter: false,
        timeout_mismatches: 0,
        timeout_mismatches_total: 0,
        requests_total: 0,
        retries_total: 0,
        dependency: DependencyKind::Unknown,
    }
}

fn finish_stats(b: EdgeBucket, mut s: EdgeStats) -> EdgeStats {
    s.requests = u64::from(b.requests);
    s.first_attempts = u64::from(b.first);
    s.retries = u64::from(b.retries);
    s.failures = u64::from(b.failures);
    s.request_rate = if s.window_seconds > 0.0 { s.requests as f64 / s.window_seconds } else { 0.0 };
    s.attempts_per_request = if b.first > 0 { s.requests as f64 / s.first_attempts as f64 } else { 1.0 };
    s.retry_ratio = ratio(s.retries, s.requests);
    s.failure_ratio = ratio(s.failures, s.requests);
    s.retry_success = FAILURE_CLASSES
        .iter()
        .zip(b.retry_n.iter().zip(b.retry_ok.iter()))
        .filter(|(_, (n, _))| **n > 0)
        .map(|(c, (n, ok))| RetrySuccess {
            outcome_class: *c,
            retries: u64::from(*n),
            succeeded: u64::from(*ok),
            ratio: ratio(u64::from(*ok), u64::from(*n)),
        })
        .collect();
    s.callee_claims = counts(b.claims);
    s.amplification = match s.baseline_rate {
        Some(base) if base > 0.0 => s.request_rate / base,
        _ => 1.0,
    };
    s.hedged_retries = u64::from(b.hedged);
    s.non_idempotent_retries = u64::from(b.non_idempotent);
    s.timeout_mismatches = u64::from(b.mismatches);
    if b.gap_n >= JITTER_MIN_SAMPLES && b.gap_sum > 0.0 {
        let n = f64::from(b.gap_n);
        let mean = b.gap_sum / n;
        let var = (b.gap_sq / n - mean * mean).max(0.0);
        s.no_jitter = var.sqrt() / mean < JITTER_MAX_CV;
    }
    s
}

/// Longest chain of edges with retries in the window. Memoised depth-first search; a node on
/// the current path is not re-entered, so cycles end the chain instead of looping.
fn storm(edges: &[EdgeStats]) -> (u32, Vec<ServiceId>) {
    let retrying: Vec<&Edge> = edges.iter().filter(|e| e.retries > 0).map(|e| &e.edge).collect();
    fn longest(
        from: &ServiceId,
        edges: &[&Edge],
        stack: &mut Vec<ServiceId>,
        memo: &mut BTreeMap<ServiceId, Vec<ServiceId>>,
    ) -> Vec<ServiceId> {
        if let Some(m) = memo.get(from) {
            return m.clone();
        }
        let mut best: Vec<ServiceId> = Vec::new();
        if stack.len() <= 64 {
            stack.push(from.clone());
            let next: Vec<ServiceId> =
                edges.iter().filter(|e| &e.caller == from && !stack.contains(&e.callee)).map(|e| e.callee.clone()).collect();
            for callee in next {
                let tail = longest(&callee, edges, stack, memo);
                if tail.len() + 1 > best.len() {
                    best = std::iter::once(callee).chain(tail).collect();
                }
            }
            stack.pop();
        }
        memo.insert(from.clone(), best.clone());
        best
    }
    let mut memo = BTreeMap::new();
    let mut best: Vec<ServiceId> = Vec::new();
    for e in &retrying {
        let tail = longest(&e.caller, &retrying, &mut Vec::new(), &mut memo);
        if tail.len() + 1 > best.len() {
            best = std::iter::once(e.caller.clone()).chain(tail).collect();
        }
    }
    ((best.len().saturating_sub(1)) as u32, best)
}
