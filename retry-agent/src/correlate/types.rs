//! What correlation produces: services, edges, verdicts.
use std::{fmt, sync::Arc};

use serde::{Deserialize, Serialize};

use crate::l7::{Claim, ExchangeId, OutcomeClass};

/// A service identity: process identity by default (comm), overridable by config
/// (e.g. `python3:8080=orders`). Cheap to clone; bounded in number by the engine.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ServiceId(pub Arc<str>);

impl ServiceId {
    pub fn new(s: &str) -> Self {
        ServiceId(Arc::from(s))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The Kubernetes namespace of a workload's name (`namespace/workload`). Namespaces are DNS
    /// labels, so the first `/` splits them; `comm:port` names have none (an override written
    /// `ns/name` is read as a workload in `ns`, as its author meant).
    pub fn namespace(&self) -> Option<&str> {
        self.0
            .split_once('/')
            .map(|(ns, _)| ns)
            .filter(|ns| !ns.is_empty())
    }
}

impl fmt::Display for ServiceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A directed caller → callee edge.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Edge {
    pub caller: ServiceId,
    pub callee: ServiceId,
}

impl fmt::Display for Edge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}->{}", self.caller, self.callee)
    }
}

/// A failed child call that explains an unclaimed verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildFailure {
    pub exchange: ExchangeId,
    pub callee: ServiceId,
    pub outcome: OutcomeClass,
    pub status: Option<u16>,
}

/// Ownership verdict for one failed inbound exchange.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// The failed inbound (server-role) exchange.
    pub exchange: ExchangeId,
    pub service: ServiceId,
    /// Who called it, if known.
    pub caller: Option<ServiceId>,
    pub claim: Claim,
    pub outcome: OutcomeClass,
    pub status: Option<u16>,
    /// The child failures behind an unclaimed verdict.
    pub caused_by: Vec<ChildFailure>,
    pub ts_ns: u64,
    /// How the request's outbound calls were tied to it (absent in dumps of older agents).
    #[serde(default)]
    pub link: Link,
}

/// How a verdict's outbound calls were tied to its request: what the claim rests on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Link {
    /// The thread that read the request made its calls.
    Thread,
    /// The Go uprobes traced its calls to the request's goroutine (or ones it spawned).
    GoUprobes,
    /// Its calls carried the trace id the request brought in.
    TraceHeader,
    /// The one failed call that completed just before the response (an event loop).
    Timing,
    /// The only request its process served meanwhile.
    SoleInbound,
    /// Context lost, but no call of the process to a fail-close dependency failed meanwhile.
    ProcessQuiet,
    /// Nothing tied its calls to it (a `missing` verdict).
    #[default]
    Unlinked,
}

/// Why nothing placed a failed request's calls (its verdict `missing`): what stopped the trace
/// link, the one link that can place calls of a request served among others.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unlinked {
    /// The request brought no trace id (or the process does not forward one).
    NoTrace,
    /// Another request of the process with the same trace id overlapped it (a caller's hedge
    /// or retry after its timeout, a fan-out of one trace).
    TraceShared,
    /// A failed call meanwhile carried no trace id (a database, an SDK that lost the context).
    UntracedCall,
    /// A failed call carried the id of a request never seen answered within the wait.
    WaitExpired,
    /// The process's histories no longer reach back to the request (a busy process).
    HistoryLost,
    /// Its calls were placed, but capture did not see how one ended (a lost response record, an
    /// HTTP/2 connection picked up mid-life): it may have failed, or not.
    OutcomeUnseen,
}

impl Unlinked {
    pub const ALL: [Unlinked; 6] = [
        Unlinked::NoTrace,
        Unlinked::TraceShared,
        Unlinked::UntracedCall,
        Unlinked::WaitExpired,
        Unlinked::HistoryLost,
        Unlinked::OutcomeUnseen,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Unlinked::NoTrace => "no_trace",
            Unlinked::TraceShared => "trace_shared",
            Unlinked::UntracedCall => "untraced_call",
            Unlinked::WaitExpired => "wait_expired",
            Unlinked::HistoryLost => "history_lost",
            Unlinked::OutcomeUnseen => "outcome_unseen",
        }
    }

    /// Index into [`Unlinked::ALL`] (and into `EngineStats::unlinked`).
    pub fn index(self) -> usize {
        self as usize
    }
}

impl Link {
    pub const ALL: [Link; 7] = [
        Link::Thread,
        Link::GoUprobes,
        Link::TraceHeader,
        Link::Timing,
        Link::SoleInbound,
        Link::ProcessQuiet,
        Link::Unlinked,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Link::Thread => "thread",
            Link::GoUprobes => "go_uprobes",
            Link::TraceHeader => "trace_header",
            Link::Timing => "timing",
            Link::SoleInbound => "sole_inbound",
            Link::ProcessQuiet => "process_quiet",
            Link::Unlinked => "unlinked",
        }
    }

    /// Index into [`Link::ALL`] (and into per-link counters).
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Verdicts by how they were linked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LinkCounts {
    pub thread: u64,
    pub go_uprobes: u64,
    pub trace_header: u64,
    pub timing: u64,
    pub sole_inbound: u64,
    pub process_quiet: u64,
    pub unlinked: u64,
}

impl LinkCounts {
    pub fn from_array(n: [u32; 7]) -> Self {
        let [
            thread,
            go_uprobes,
            trace_header,
            timing,
            sole_inbound,
            process_quiet,
            unlinked,
        ] = n.map(u64::from);
        LinkCounts {
            thread,
            go_uprobes,
            trace_header,
            timing,
            sole_inbound,
            process_quiet,
            unlinked,
        }
    }

    pub fn get(&self, l: Link) -> u64 {
        match l {
            Link::Thread => self.thread,
            Link::GoUprobes => self.go_uprobes,
            Link::TraceHeader => self.trace_header,
            Link::Timing => self.timing,
            Link::SoleInbound => self.sole_inbound,
            Link::ProcessQuiet => self.process_quiet,
            Link::Unlinked => self.unlinked,
        }
    }

    pub fn total(&self) -> u64 {
        Link::ALL.iter().map(|l| self.get(*l)).sum()
    }

    /// `thread 3, go_uprobes 40` (links with none left out; `-` for none at all).
    pub fn summary(&self) -> String {
        let parts: Vec<String> = Link::ALL
            .iter()
            .filter(|l| self.get(**l) > 0)
            .map(|l| format!("{l} {}", self.get(*l)))
            .collect();
        if parts.is_empty() {
            "-".into()
        } else {
            parts.join(", ")
        }
    }
}

/// Where an edge's callee claims came from: our own verdicts on the callee (and how they were
/// linked) or the claim header on its responses. `EdgeStats::callee_claims` is their sum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClaimSources {
    /// Verdicts this agent gave the callee's failed inbound exchanges from this caller.
    pub verdicts: ClaimCounts,
    /// Those verdicts by how they were linked.
    pub links: LinkCounts,
    /// Claims read off the callee's error responses (`x-error-claim`; `missing`: a callee off
    /// this node that sent none).
    pub header: ClaimCounts,
}

/// Counts of the claims a callee's errors carried (from our own verdicts on the callee's inbound
/// exchanges when it runs on this node, else from the claim header on the response, else missing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimCounts {
    pub claimed: u64,
    pub unclaimed: u64,
    pub missing: u64,
}

impl ClaimCounts {
    pub fn total(&self) -> u64 {
        self.claimed + self.unclaimed + self.missing
    }
    pub fn add(&mut self, claim: Claim) {
        match claim {
            Claim::Claimed => self.claimed += 1,
            Claim::Unclaimed => self.unclaimed += 1,
            Claim::Missing => self.missing += 1,
        }
    }
    pub fn get(&self, claim: Claim) -> u64 {
        match claim {
            Claim::Claimed => self.claimed,
            Claim::Unclaimed => self.unclaimed,
            Claim::Missing => self.missing,
        }
    }
    /// The claim most of the errors carried (ties favour the one that keeps retries: claimed,
    /// then missing), `None` without errors.
    pub fn majority(&self) -> Option<Claim> {
        if self.total() == 0 {
            return None;
        }
        let best = [Claim::Claimed, Claim::Missing, Claim::Unclaimed]
            .into_iter()
            .max_by_key(|c| (self.get(*c), std::cmp::Reverse(*c as u8)))?;
        Some(best)
    }
}

/// Retries after a failure of one class and how many of them succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RetrySuccess {
    /// Class of the failure that was retried.
    pub outcome_class: OutcomeClass,
    pub retries: u64,
    pub succeeded: u64,
    /// succeeded / retries (0 without retries).
    pub ratio: f64,
}

/// Buckets (seconds) the `recent_*` figures of [`EdgeStats`] cover.
pub const RECENT_BUCKETS: u64 = 2;

/// Figures for one edge over the engine's sliding window (rates per second), plus lifetime totals.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EdgeStats {
    pub edge: Edge,
    /// Addresses the callee was reached at (bounded).
    pub callee_addrs: Vec<std::net::SocketAddr>,
    /// Length of the window the figures cover, seconds.
    pub window_seconds: f64,
    /// All attempts, per second.
    pub request_rate: f64,
    pub requests: u64,
    pub first_attempts: u64,
    pub retries: u64,
    pub failures: u64,
    /// requests / first attempts (1 = no retries).
    pub attempts_per_request: f64,
    /// retries / requests.
    pub retry_ratio: f64,
    pub failure_ratio: f64,
    /// Requests and failures of the window's last [`RECENT_BUCKETS`] buckets (the current one
    /// included when the figures are read through now): a fault's onset shows there while the
    /// window still holds the healthy seconds before it (absent in dumps of older agents).
    #[serde(default)]
    pub recent_requests: u64,
    #[serde(default)]
    pub recent_failures: u64,
    pub retry_success: Vec<RetrySuccess>,
    /// Claims the callee's errors carried in the window.
    pub callee_claims: ClaimCounts,
    /// Where those claims came from (absent in dumps of older agents).
    #[serde(default)]
    pub claim_sources: ClaimSources,
    /// Request rate / baseline rate (1 without a baseline yet).
    pub amplification: f64,
    pub baseline_rate: Option<f64>,
    /// A fault is active on the node: the baseline is frozen.
    pub fault_active: bool,
    /// Retries started while the previous attempt was still in flight (hedging, per-try timeouts).
    pub hedged_retries: u64,
    /// Retries of non-idempotent requests without an idempotency key.
    pub non_idempotent_retries: u64,
    /// Retry gaps are aligned (coefficient of variation under 10% over enough samples): no jitter.
    pub no_jitter: bool,
    /// The caller abandoned exchanges the callee was still working on (window / lifetime).
    pub timeout_mismatches: u64,
    pub timeout_mismatches_total: u64,
    pub requests_total: u64,
    pub retries_total: u64,
    /// The caller's own failures whose failed child on this edge was found (fail-close evidence):
    /// learned failure pattern of this dependency.
    pub dependency: DependencyKind,
}

/// What the failure-pattern memory learned about a dependency (caller → callee).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DependencyKind {
    /// Its failures are followed by the caller's failures: they can unclaim the caller's errors.
    FailClose,
    /// The caller survives its failures: coincidental errors must not unclaim.
    FailOpen,
    /// Not enough evidence yet (treated as fail-close).
    Unknown,
}

/// Arrival figures for the services at one depth of the node's call graph (depth 0 = services
/// no local service calls).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DepthStats {
    pub depth: u32,
    pub services: Vec<ServiceId>,
    /// Inbound exchanges per second at these services.
    pub arrival_rate: f64,
    pub baseline_rate: Option<f64>,
    pub amplification: f64,
}

/// Amplification along the call paths on this node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PathStats {
    pub depths: Vec<DepthStats>,
    /// Longest chain of edges with retries active in the window while a fault is active.
    pub storm_radius: u32,
    /// That chain, caller first.
    pub storm_path: Vec<ServiceId>,
    pub fault_active: bool,
}

/// The claim a service's error responses should carry now (for the shim's header), from its
/// recent verdicts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceClaim {
    pub service: ServiceId,
    /// Addresses the service was seen serving on (bounded).
    pub addrs: Vec<std::net::SocketAddr>,
    /// Majority of recent verdicts; `Missing` means: add no header.
    pub claim: Claim,
    pub counts: ClaimCounts,
}

/// Engine counters since start (for metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineStats {
    /// Exchanges pushed, each by its weight (a summary stands for the quiet ones the kernel
    /// counted before it, a tally for those it counted): inbound + outbound.
    pub exchanges: u64,
    pub inbound: u64,
    pub outbound: u64,
    pub verdicts: ClaimCounts,
    pub retries: u64,
    pub hedged_retries: u64,
    pub non_idempotent_retries: u64,
    pub timeout_mismatches: u64,
    /// Per-class retry outcomes since start: (retries, succeeded), indexed like `OutcomeClass::ALL`.
    pub retry_outcomes: [(u64, u64); 5],
    /// Inbound contexts evicted or dropped because a table was full (bounded memory).
    pub evictions: u64,
    /// Services/edges folded into "other" because the cap was reached.
    pub overflowed: u64,
    /// Failed inbound exchanges thread context could not link, linked by response timing.
    pub timing_links: u64,
    /// Failed inbound exchanges thread context could not link, linked as the only request the
    /// process was serving at the time.
    pub sole_links: u64,
    /// Failed inbound exchanges thread context could not link, linked by the trace id the
    /// process forwarded from the request to its calls.
    pub trace_links: u64,
    /// Failed requests served alone (Go, or a thread with no other request in flight) judged
    /// at their answer, not after the grace period (`Engine::judge_at_answer`).
    #[serde(default)]
    pub early_verdicts: u64,
    /// `missing` verdicts by why no link placed their calls, indexed like `Unlinked::ALL`.
    #[serde(default)]
    pub unlinked: [u64; Unlinked::ALL.len()],
}
