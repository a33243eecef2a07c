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
use std::{collections::VecDeque, net::SocketAddr};

use self::{history::History, inbound::in_flight_until};
use retry_common::GOROUTINE_ROOTED;

use super::{
    config::CorrelateConfig,
    table::{GenMap, Map, Ring, hash_one, map},
    types::{ClaimCounts, EngineStats, ServiceId, Verdict},
};
use crate::{
    capture::{ProcessInfo, Role},
    l7::{Claim, Exchange, ExchangeId, OutcomeClass},
};

mod claim;
mod history;
mod inbound;
mod naming;
mod outbound;
mod readout;
mod slots;
mod time;
mod verdict;

#[cfg(test)]
mod tests;

const NS_PER_MS: u64 = 1_000_000;
/// Children remembered per thread (a request with more outbound calls than this that fails is
/// judged from the process-wide failure record instead).
const CHILDREN_PER_THREAD: usize = 16;
const INBOUND_PER_THREAD: usize = 8;
/// Responses a process keeps (a cap), and failed calls and inbound requests it keeps whatever
/// their age (past it, only those a waiting verdict may still need stay).
const FAILURES_PER_PROCESS: usize = 256;
/// Failed outbound calls remembered per process: in a storm a busy process's calls fail by the
/// thousand a second, and a failed request's links need every failed call since it started
/// (256 lasted a quarter of a second there). Bounded all together by the engine-wide cap.
const FAILED_CALLS_PER_PROCESS: usize = 4_096;
/// Inbound requests remembered per process: a verdict that waits to place a failed call (up to
/// `MAX_WAIT_NS`) needs its own and its neighbours' entries for as long (256 lasted 5 s at
/// the lab's Node hop and lost 4 verdicts to `missing`; 1,024 lasted under a second at a
/// process serving 1,500 requests a second, where a long failed request was then `missing`).
/// Past `FAILURES_PER_PROCESS` entries only those a verdict may still wait on stay, so a quiet
/// process keeps no more than before (48 bytes an entry); the engine-wide cap
/// (`--correlate-max-history`) bounds all processes' together, and this only keeps one
/// process from holding more than a busy one can use.
const INBOUND_PER_PROCESS: usize = 16_384;
/// How long a waiting verdict may still need a process's history entries.
const HISTORY_KEEP_NS: u64 = verdict::MAX_WAIT_NS + verdict::TRACE_WAIT_NS;
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
    Local {
        pid: u32,
        port: u16,
    },
    Remote(SocketAddr),
    Overflow,
}

#[derive(Default)]
struct ProcState {
    info: Option<ProcessInfo>,
    /// The process exited: its entry may go once nothing names it.
    exited: bool,
    /// Capture time of the exit: its histories go one keep horizon later (no verdict waits
    /// longer), even while its names keep the entry.
    exited_at: u64,
    /// Ports the process served on (first seen first; bounded).
    ports: Vec<u16>,
    /// Resolved names by port (0 = the process as a caller); cleared when naming inputs change.
    names: Vec<(u16, ServiceId)>,
    /// Recent failed outbound calls, process-wide, with the thread that made them.
    failures: History<history::FailEntry>,
    /// Recent inbound responses of the process: (first response byte written, exchange).
    responses: VecDeque<(u64, ExchangeId)>,
    /// Recent inbound requests of the process: (start, end, exchange, propagated trace id,
    /// failed), found by trace id too.
    inbound: History<history::InEntry>,
    /// End of the newest failure evicted from `failures`: spans older than this are not covered.
    failures_lost_until: u64,
    /// End of the latest-ending request evicted from `inbound`: a request that began before
    /// this may have overlapped one the history no longer holds (a rival, a trace sharer).
    inbound_lost_until: u64,
    /// Newest response start evicted from `responses`.
    responses_lost_until: u64,
}

/// One of a process's histories.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hist {
    Failures,
    Responses,
    Inbound,
}

/// Entries in all processes' histories, within the caps `--correlate-max-history` gives
/// (counted as entries come and go, recounted once a bucket).
#[derive(Clone, Copy, Debug, Default)]
struct HistTotals {
    failures: usize,
    responses: usize,
    inbound: usize,
}

impl HistTotals {
    fn get_mut(&mut self, h: Hist) -> &mut usize {
        match h {
            Hist::Failures => &mut self.failures,
            Hist::Responses => &mut self.responses,
            Hist::Inbound => &mut self.inbound,
        }
    }
}

impl ProcState {
    fn hist_len(&self, h: Hist) -> usize {
        match h {
            Hist::Failures => self.failures.len(),
            Hist::Responses => self.responses.len(),
            Hist::Inbound => self.inbound.len(),
        }
    }

    /// Let the oldest entry of `h` go, keeping how far back it no longer covers.
    fn pop_oldest(&mut self, h: Hist) -> bool {
        match h {
            Hist::Failures => self.failures.pop_front().map(|(c, _)| {
                self.failures_lost_until = self.failures_lost_until.max(c.end);
            }),
            Hist::Responses => self.responses.pop_front().map(|(rs, _)| {
                self.responses_lost_until = self.responses_lost_until.max(rs);
            }),
            Hist::Inbound => self.inbound.pop_front().map(|x| {
                self.inbound_lost_until = self.inbound_lost_until.max(x.1);
            }),
        }
        .is_some()
    }

    /// The inbound history holds every request of the process that overlapped `[start, _]`.
    fn inbound_covers(&self, start: u64) -> bool {
        self.inbound_lost_until < start
    }

    /// Both histories still hold everything since the request `id` that started at `start`
    /// (they are bounded): its own entry, every request that overlapped it, every failed call.
    fn reaches_back_to(&self, start: u64, id: ExchangeId) -> bool {
        self.failures_lost_until < start && self.inbound_covers(start) && self.inbound.holds(id)
    }

    /// Let the histories go (their memory too), keeping what they covered as lost.
    fn release_histories(&mut self) {
        for h in [Hist::Failures, Hist::Responses, Hist::Inbound] {
            while self.pop_oldest(h) {}
        }
        self.failures = History::default();
        self.inbound = History::default();
        self.responses = VecDeque::new();
    }
}

#[derive(Clone, Copy)]
struct Child {
    id: ExchangeId,
    start: u64,
    end: u64,
    edge: u32,
    tuple: u64,
    outcome: OutcomeClass,
    /// Its outcome went by unseen (`Exchange::outcome_unseen`): `outcome` says unknown, which
    /// is no evidence that it failed.
    unseen: bool,
    status: Option<u16>,
    claim_header: Option<Claim>,
    retry: bool,
    idempotent: bool,
    /// Propagated trace id: the inbound request of the process carrying it made this call.
    trace: Option<u64>,
    /// What makes attempts "the same request" (0: none, opaque bytes).
    retry_key: u64,
    /// When a later retry of this failed attempt succeeded (that retry's start): from then on
    /// the call did not fail, so it caused nothing (the service that fails afterwards fails on
    /// its own). Not for a request answered before then: its retry key may be shared by other
    /// requests' calls (identical calls look like retries), and an answer given while the call
    /// was still failed may have been caused by it.
    recovered_at: Option<u64>,
    /// End of the newest retry of this attempt seen (0: none): the request that made it was
    /// still in flight then, so a verdict waiting to place this failure waits from then.
    retried_until: u64,
}

impl Child {
    /// Failed, as far as capture saw.
    fn failed(&self) -> bool {
        self.outcome.is_failure() && !self.unseen
    }

    /// Recovered by a retry that started by `t`.
    fn recovered_by(&self, t: u64) -> bool {
        self.recovered_at.is_some_and(|r| r <= t)
    }
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
    /// Of `claims`, those read off claim headers (the rest are our verdicts on the callee).
    header: [u32; 3],
    /// Our verdicts on the callee, by how they were linked (indexed like `Link::ALL`).
    links: [u32; 7],
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
        self.rate = if self.buckets == 0 {
            r
        } else {
            self.rate + BASELINE_ALPHA * (r - self.rate)
        };
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
    /// Of `claims`, those whose caller is not seen: it came through a hop capture leaves out
    /// (the shim) or from another node. Every local edge into the service counts them.
    unattributed: [u32; 3],
    /// The same verdicts by how they were linked (indexed like `Link::ALL`), so an edge that
    /// counts them says what they rest on.
    unattributed_links: [u32; 7],
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
    local: Option<SocketAddr>,
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
    /// Propagated trace id the request carried.
    trace: Option<u64>,
}

#[derive(Clone, Copy)]
struct RetryState {
    start: u64,
    end: u64,
    outcome: OutcomeClass,
    attempt: u32,
    thread: u64,
    /// The caller gave it up (closed or cancelled while waiting): a hedge's loser.
    given_up: bool,
    /// It failed as far as capture saw (`Exchange::failure_seen`): a repeat after one whose
    /// outcome went unseen (a lost response record) is no evidence of a retry.
    failed: bool,
}

#[derive(Clone, Copy)]
struct RecentVerdict {
    claim: Claim,
    start: u64,
    end: u64,
}

/// A call its caller gave up on: when, on which edge, and whether it was a hedge's loser.
#[derive(Clone, Copy, Debug)]
pub(super) struct AbandonedCall {
    pub(super) at: u64,
    pub(super) edge: u32,
    /// An identical call overlapped it and one of the two was dropped: the caller dropped this
    /// one on purpose once its twin answered, whatever its timeouts.
    pub(super) hedge: bool,
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
    /// The same with the remote address too: exact where `client_socks` is not, as Linux gives
    /// one source port to connections to different destinations (two processes' calls on
    /// loopback can share a local address). See [`Engine::caller_pid`].
    client_conns: GenMap<u64, u32>,
    /// Client tuple → the callee's latest verdict on that connection.
    recent_verdicts: GenMap<u64, RecentVerdict>,
    /// Client tuple → the call given up on it (HTTP/1: its connection closed while waiting).
    abandoned: GenMap<u64, AbandonedCall>,
    /// Client tuples already counted as a timeout mismatch.
    mismatched: GenMap<u64, ()>,
    /// Client tuples whose failure a local callee's claim header already counted on the edge
    /// (so the callee's own verdict does not count it twice).
    header_claimed: GenMap<u64, ()>,
    retry_keys: GenMap<u64, RetryState>,
    /// Entries in all processes' histories (see [`Engine::room_for`]).
    hist: HistTotals,
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

const FAILURE_CLASSES: [OutcomeClass; 4] = [
    OutcomeClass::Transient,
    OutcomeClass::Semantic,
    OutcomeClass::Overload,
    OutcomeClass::Unknown,
];

fn claim_index(c: Claim) -> usize {
    match c {
        Claim::Claimed => 0,
        Claim::Unclaimed => 1,
        Claim::Missing => 2,
    }
}

fn counts(c: [u32; 3]) -> ClaimCounts {
    ClaimCounts {
        claimed: u64::from(c[0]),
        unclaimed: u64::from(c[1]),
        missing: u64::from(c[2]),
    }
}

/// Tags a thread key that is a goroutine (see [`thread_key`]).
const GOROUTINE_KEY: u64 = 1 << 63;
/// The thread key of calls whose thread is no evidence of their caller
/// (`Exchange::threads_multiplexed`): a key no request is ever served on, so a failed one is an
/// orphan to every request of its process that it overlaps (`missing`, never a guess), and
/// trace headers can still link it.
const UNATTRIBUTED_KEY: u64 = 1 << 61;

/// The context key of an outbound call: its goroutine or thread, unless its thread says nothing.
fn call_key(ex: &Exchange) -> u64 {
    if ex.threads_multiplexed && ex.goid.is_none() {
        UNATTRIBUTED_KEY
    } else {
        thread_key(ex.tid, ex.goid)
    }
}

fn thread_key(tid: u32, goid: Option<u64>) -> u64 {
    // Goroutines are the unit of context in Go; tag them so they never collide with a tid.
    goid.map_or(u64::from(tid), |g| (g & !GOROUTINE_ROOTED) | GOROUTINE_KEY)
}

/// A Go call the uprobes traced to a request goroutine: it belongs to that request, wherever it
/// was made (kept on process-wide failure records, which are keyed by thread).
fn rooted(goid: Option<u64>) -> u64 {
    goid.map_or(0, |g| g & GOROUTINE_ROOTED)
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
        let window = u64::from(
            cfg.stats_window_buckets
                .clamp(1, super::config::MAX_WINDOW_BUCKETS),
        );
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
            client_conns: GenMap::new(cfg.max_threads.max(2)),
            recent_verdicts: GenMap::new(cfg.max_threads.max(2)),
            abandoned: GenMap::new(cfg.max_threads.max(2)),
            mismatched: GenMap::new(cfg.max_threads.max(2)),
            header_claimed: GenMap::new(cfg.max_threads.max(2)),
            retry_keys: GenMap::new(cfg.max_retry_keys.max(2)),
            hist: HistTotals::default(),
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

    /// Process metadata (names services). A pid reused by another program starts afresh; a
    /// process described without a name (gone from /proc when read) and named later (by its
    /// exit record) is the same process and keeps its state.
    pub fn on_process(&mut self, info: &ProcessInfo) {
        if self.procs.len() >= self.cfg.max_threads && !self.procs.contains_key(&info.pid) {
            self.sweep_procs();
        }
        let info_pid = info.pid;
        let p = self.procs.entry(info.pid).or_default();
        let mut info = info.clone();
        match &p.info {
            Some(old) if old.comm.is_empty() && !info.comm.is_empty() => {
                // Late name: what the first description did read still holds.
                info.fill_from(old);
                // Its provisional names (`pid:N`) will never be resolved again: give their
                // places under the service cap back, or every short-lived process keeps one.
                let provisional = format!("pid:{}", info.pid);
                for (_, n) in &p.names {
                    let s = n.as_str();
                    if s == provisional
                        || s.strip_prefix(provisional.as_str())
                            .is_some_and(|r| r.starts_with(':'))
                    {
                        self.names_issued.remove(n);
                    }
                }
            }
            Some(old) if old.comm != info.comm || old.exe != info.exe => *p = ProcState::default(),
            _ => {}
        }
        let named_now =
            info.workload.is_some() && p.info.as_ref().is_none_or(|o| o.workload != info.workload);
        p.info = Some(info);
        p.exited = false;
        p.names.clear();
        if named_now {
            // Its forked children (pre-forking servers) are named after it: drop the names
            // they were given before it was, or they keep `comm:port` for as long as they live.
            let pid = info_pid;
            for c in self.procs.values_mut() {
                if c.info.as_ref().is_some_and(|i| i.parent == Some(pid)) {
                    c.names.clear();
                }
            }
        }
    }

    pub fn on_process_exit(&mut self, pid: u32) {
        // Figures keyed by the pid stay until they age out (their names with them); the
        // context goes now, the entry when nothing refers to it.
        if let Some(p) = self.procs.get_mut(&pid) {
            // Its requests still waiting for a verdict must not read the cleared history as
            // "no call failed".
            while p.pop_oldest(Hist::Failures) {
                self.hist.failures = self.hist.failures.saturating_sub(1);
            }
            p.exited = true;
            p.exited_at = self.now;
        }
    }

    /// Feed one completed exchange; verdicts for failed inbound exchanges are appended to `out`
    /// (possibly later, once the context window closes, from `tick` or a later `push`).
    pub fn push(&mut self, ex: &Exchange, out: &mut Vec<Verdict>) {
        self.stats.exchanges += u64::from(ex.weight);
        match ex.role {
            // Quiet exchanges the kernel counted (`Exchange::tally`): counts only.
            Role::Client if ex.tally => self.tally_calls(ex),
            Role::Server if ex.tally => self.tally_served(ex),
            Role::Client => self.push_client(ex),
            Role::Server => self.push_server(ex, out),
            // Unresolved side: nothing sound to say about it.
            Role::Unknown => {}
        }
        self.advance(in_flight_until(ex), out);
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
}
