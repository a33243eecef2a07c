//! The shim's retry logic, without IO: recognise retries, remember failures, apply budgets.
//!
//! A request is a *retry* when it carries a retry marker, or when a request with the same
//! [`RequestKey`] failed within the window. First attempts are always forwarded (at-least-once).
//! A retry is answered locally when the agent found the callee's errors unclaimed, when the
//! callee's last failure came back `x-error-claim: unclaimed` (the decision matrix), or when a
//! retry budget or adaptive throttling says no. "The same request" includes its body and the
//! caller's credentials (as keyed digests: never stored plain), so another user's call, or
//! another message to the same gRPC method, is never taken for a retry; and a suppressed retry
//! is answered with a synthetic response (status or grpc-status, `x-retry-suppressed`), never
//! with the headers or body another attempt got. An edge the agent flags over budget or amplifying
//! still leads to an owner (or may): its retries pass up to a budget rather than stopping, so the
//! chain keeps one retry where it helps (at-least-once).
use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use http::{HeaderMap, HeaderName};

use crate::{decide::Reason, l7::Claim};

/// Who sent a request: the connection's source address, or on loopback (where every workload
/// shares 127.0.0.1) the uid owning the client socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallerId {
    Addr(IpAddr),
    Uid(u32),
}

/// What identifies "the same request again".
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RequestKey {
    pub caller: CallerId,
    pub method: http::Method,
    /// Original destination (the callee as the caller addressed it).
    pub dst: SocketAddr,
    /// Host/:authority as sent (empty if none).
    pub authority: String,
    /// Path and query.
    pub target: String,
    /// The propagated trace id (`traceparent`, B3, `x-request-id`… as the engine reads it, a
    /// keyed hash): calls of distinct traces are distinct logical requests, a retry keeps its
    /// first attempt's.
    pub trace: Option<u64>,
    /// Keyed digest of the request body's first [`BODY_DIGEST_LIMIT`] bytes (`None`: no body).
    pub body: Option<u64>,
    /// Keyed digest of the caller's credentials ([`credential_digest`]); 0 when it sent none.
    pub credential: u64,
}

/// Request-body bytes the body digest covers: enough to tell messages apart.
pub const BODY_DIGEST_LIMIT: usize = 4096;

/// Whether a request header carries a caller's identity or secret: the standard ones, and the
/// names custom ones take (`x-auth-token` gRPC metadata, `x-api-key`, session ids...).
pub fn is_credential(name: &HeaderName) -> bool {
    let n = name.as_str();
    matches!(n, "authorization" | "proxy-authorization" | "cookie")
        || [
            "auth",
            "token",
            "key",
            "session",
            "secret",
            "password",
            "credential",
            "signature",
            "jwt",
        ]
        .iter()
        .any(|w| n.contains(w))
}

/// Keyed digest of every credential header (name and value, in order): two callers with
/// different tokens never share a key, and no token is kept.
pub fn credential_digest(h: &HeaderMap) -> u64 {
    let mut d = crate::l7::domain_hasher(crate::l7::Domain::ShimCredential);
    let mut any = false;
    for (n, v) in h.iter().filter(|(n, _)| is_credential(n)) {
        any = true;
        d.write(n.as_str().as_bytes());
        d.write(&[0]);
        d.write(v.as_bytes());
        d.write(&[0]);
    }
    if any { d.finish() } else { 0 }
}

/// Keyed digest of a request body prefix, fed in pieces.
#[derive(Clone, Debug)]
pub struct BodyDigest {
    h: crate::l7::Keyed,
    n: usize,
}

impl Default for BodyDigest {
    fn default() -> Self {
        BodyDigest {
            h: crate::l7::domain_hasher(crate::l7::Domain::ShimBody),
            n: 0,
        }
    }
}

impl BodyDigest {
    /// Feed bytes; returns false once the limit is reached (nothing more is needed).
    pub fn feed(&mut self, b: &[u8]) -> bool {
        let take = b.len().min(BODY_DIGEST_LIMIT - self.n);
        if let Some(p) = b.get(..take) {
            self.h.write(p);
            self.n += take;
        }
        self.n < BODY_DIGEST_LIMIT
    }
    pub fn finish(&self) -> Option<u64> {
        (self.n > 0).then(|| self.h.finish())
    }
}

/// What kind of failure an attempt got: enough to answer a suppressed retry with a synthetic
/// response of the same status. Headers and body are never kept (they belong to one caller:
/// `Set-Cookie`, error details).
#[derive(Clone, Debug, PartialEq)]
pub enum FailureReply {
    /// An HTTP (or gRPC) response.
    Response {
        status: http::StatusCode,
        /// gRPC status, from trailers or a trailers-only response.
        grpc_status: Option<u32>,
    },
    /// The upstream reset or closed without a response.
    Reset,
}

#[derive(Clone, Debug)]
pub struct RecordedFailure {
    pub reply: FailureReply,
    /// Error claim the callee stamped on it (`Missing` when absent).
    pub claim: Claim,
    pub at: Instant,
}

/// Why a retry was answered locally (value of `x-retry-suppressed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SuppressReason {
    /// The agent's decision for this edge.
    Decision(Reason),
    /// The callee's last error was unclaimed: not its own, so retrying it cannot help.
    CalleeUnclaimed,
    /// The caller's retry budget is spent.
    RetryBudget,
    /// Client-side adaptive throttling.
    AdaptiveThrottle,
}

impl SuppressReason {
    pub fn as_str(self) -> &'static str {
        match self {
            SuppressReason::Decision(r) => r.as_str(),
            SuppressReason::CalleeUnclaimed => "callee_unclaimed",
            SuppressReason::RetryBudget => "retry_budget",
            SuppressReason::AdaptiveThrottle => "adaptive_throttle",
        }
    }
}

/// Outcome for one request.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Forward {
        retry: bool,
    },
    Answer {
        reason: SuppressReason,
        reply: Option<FailureReply>,
    },
}

#[derive(Clone, Debug)]
pub struct PolicyConfig {
    /// How long a failure makes the same request a retry.
    pub window: Duration,
    /// Retries allowed per request (e.g. 0.1); `None` = no budget.
    pub budget_ratio: Option<f64>,
    /// Retries a client may make over the budget's window whatever its volume (Finagle's
    /// `minRetriesPerSec`, Envoy's `min_retry_concurrency`): at tens of requests a second a
    /// transient fault's own noise crosses a 10% budget (a 5% fault read 10.4% over the lab's
    /// first 3 s, and the refused retries cost the root 1% availability).
    pub budget_min_retries: f64,
    /// Adaptive throttling multiplier K (e.g. 2.0); `None` = off.
    pub throttle_k: Option<f64>,
    /// Decay time constant of the adaptive-throttling counters (the technique's ~minutes).
    pub counter_tau: Duration,
    /// Decay time constant of the retry-budget counters: short, so requests from before a
    /// fault do not bank retries for it (Finagle's budget deposits live 10 s).
    pub budget_tau: Duration,
    /// Bound on per-client counters; beyond it new clients go uncounted (fail open).
    pub max_entries: usize,
    /// Bound on the bytes remembered failures take, keys' strings included ([`failure_cost`]);
    /// beyond it a new failure is not remembered (its retry is forwarded: fail open).
    pub max_failure_bytes: usize,
}

/// What one per-client entry costs in the tracker's table (key, counters, hash overhead).
pub const CLIENT_ENTRY_BYTES: usize = 128;

/// What remembering one failure costs: the entry, hash overhead, and the key's strings (a
/// target can be as long as a request line may be, so a count alone bounds nothing).
pub fn failure_cost(key: &RequestKey) -> usize {
    std::mem::size_of::<(RequestKey, RecordedFailure)>()
        + 16
        + key.authority.len()
        + key.target.len()
}

impl PolicyConfig {
    /// The defaults, with tables bounded to `bytes` (half failures, half clients).
    pub fn within(bytes: u64) -> PolicyConfig {
        let half = usize::try_from(bytes / 2).unwrap_or(usize::MAX);
        PolicyConfig {
            max_entries: (half / CLIENT_ENTRY_BYTES).max(1),
            max_failure_bytes: half,
            ..PolicyConfig::default()
        }
    }
}

/// Retries over the budget's window a client may make whatever its volume: at the budget's
/// 10 s window, 0.3 a second more than the ratio allows (+3% at 10 requests a second).
pub const DEFAULT_BUDGET_MIN_RETRIES: f64 = 3.0;

/// Budget enforced on an edge the agent flags over budget or amplifying when the shim has no
/// `--retry-budget` of its own: the agent's default budget.
pub const DECISION_BUDGET: f64 = 0.1;

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            window: Duration::from_secs(10),
            budget_ratio: None,
            budget_min_retries: DEFAULT_BUDGET_MIN_RETRIES,
            throttle_k: None,
            counter_tau: Duration::from_secs(60),
            budget_tau: Duration::from_secs(10),
            max_entries: 65_536,
            max_failure_bytes: 8 << 20,
        }
    }
}

/// Exponentially decayed counter: recent events weigh most, no buckets to rotate.
#[derive(Clone, Copy, Debug)]
struct Decayed {
    v: f64,
    t: Instant,
}

impl Decayed {
    fn new(now: Instant) -> Self {
        Decayed { v: 0.0, t: now }
    }
    fn get(&self, now: Instant, tau: Duration) -> f64 {
        let dt = now.saturating_duration_since(self.t).as_secs_f64();
        self.v * (-dt / tau.as_secs_f64().max(1e-3)).exp()
    }
    fn add(&mut self, now: Instant, tau: Duration, x: f64) {
        self.v = self.get(now, tau) + x;
        self.t = now;
    }
}

#[derive(Clone, Copy, Debug)]
struct Client {
    /// Over `counter_tau` (throttling).
    requests: Decayed,
    accepts: Decayed,
    /// Over `budget_tau` (budget).
    budget_requests: Decayed,
    budget_retries: Decayed,
}

/// All shim-wide retry state. One per shim, behind a mutex (every operation is O(1)).
#[derive(Debug)]
pub struct Tracker {
    cfg: PolicyConfig,
    failures: HashMap<RequestKey, RecordedFailure>,
    /// What `failures` holds, by [`failure_cost`].
    failure_bytes: usize,
    clients: HashMap<CallerId, Client>,
    /// Failures not remembered and clients not counted because their table was full.
    pub evictions: u64,
    /// Of `evictions`, the failures not remembered.
    failures_refused: u64,
    rng: u64,
}

/// What the tracker holds and what its bounds refused: for the shim's logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub failures: usize,
    /// By [`failure_cost`].
    pub failure_bytes: usize,
    pub clients: usize,
    /// Failures not remembered for want of room (their retries are forwarded).
    pub failures_refused: u64,
    /// Requests whose client went uncounted for want of room (no budget, no throttling).
    pub clients_refused: u64,
}

impl std::fmt::Display for CacheStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "failures={} failure_bytes={} clients={} failures_refused={} clients_refused={}",
            self.failures,
            self.failure_bytes,
            self.clients,
            self.failures_refused,
            self.clients_refused
        )
    }
}

impl Tracker {
    pub fn new(cfg: PolicyConfig) -> Tracker {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9e37_79b9_7f4a_7c15);
        Tracker {
            cfg,
            failures: HashMap::new(),
            failure_bytes: 0,
            clients: HashMap::new(),
            evictions: 0,
            failures_refused: 0,
            rng: seed | 1,
        }
    }

    pub fn config(&self) -> &PolicyConfig {
        &self.cfg
    }

    /// xorshift64*: adequate for a rejection coin, no dependency.
    fn coin(&mut self) -> f64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn client(&mut self, c: CallerId, now: Instant) -> Option<&mut Client> {
        if !self.clients.contains_key(&c) && self.clients.len() >= self.cfg.max_entries {
            let tau = self.cfg.counter_tau;
            self.clients.retain(|_, v| v.requests.get(now, tau) > 0.01);
            if self.clients.len() >= self.cfg.max_entries {
                self.evictions += 1;
                return None;
            }
        }
        Some(self.clients.entry(c).or_insert(Client {
            requests: Decayed::new(now),
            accepts: Decayed::new(now),
            budget_requests: Decayed::new(now),
            budget_retries: Decayed::new(now),
        }))
    }

    /// Classifies a request and counts it. `suppressed` is the agent's decision for its edge.
    pub fn on_request(
        &mut self,
        key: &RequestKey,
        marked_retry: bool,
        suppressed: Option<Reason>,
        now: Instant,
    ) -> Verdict {
        let last = self
            .failures
            .get(key)
            .filter(|f| now.saturating_duration_since(f.at) <= self.cfg.window)
            .cloned();
        let retry = marked_retry || last.is_some();
        let (tau, btau) = (self.cfg.counter_tau, self.cfg.budget_tau);
        // Over budget / amplification: the callee may own its errors, so a budget, not a stop.
        let budget_decision = suppressed.filter(|r| *r != Reason::CalleeUnclaimed);
        let budget = match budget_decision {
            Some(_) => Some(self.cfg.budget_ratio.unwrap_or(DECISION_BUDGET)),
            None => self.cfg.budget_ratio,
        };
        let k = self.cfg.throttle_k;
        let reserve = self.cfg.budget_min_retries;
        let coin = self.coin();
        let mut reason = None;
        if retry {
            reason = match (suppressed, &last) {
                (Some(Reason::CalleeUnclaimed), _) => {
                    Some(SuppressReason::Decision(Reason::CalleeUnclaimed))
                }
                (_, Some(f)) if f.claim == Claim::Unclaimed => {
                    Some(SuppressReason::CalleeUnclaimed)
                }
                _ => None,
            };
        }
        if let Some(cl) = self.client(key.caller, now) {
            if retry && reason.is_none() {
                let reqs = cl.requests.get(now, tau);
                if let Some(ratio) = budget {
                    // Counting this retry, retries must stay within ratio × requests, plus
                    // the reserve every client has.
                    if cl.budget_retries.get(now, btau) + 1.0
                        > ratio * (cl.budget_requests.get(now, btau) + 1.0) + reserve
                    {
                        reason = Some(
                            budget_decision
                                .map_or(SuppressReason::RetryBudget, SuppressReason::Decision),
                        );
                    }
                }
                if let (None, Some(k)) = (reason, k) {
                    let p = ((reqs - k * cl.accepts.get(now, tau)) / (reqs + 1.0)).max(0.0);
                    if coin < p {
                        reason = Some(SuppressReason::AdaptiveThrottle);
                    }
                }
            }
            cl.requests.add(now, tau, 1.0);
            // The budget is over what reaches the callee: retries answered here are not load,
            // and counting them would let every tenth of them through as "within budget".
            if reason.is_none() {
                cl.budget_requests.add(now, btau, 1.0);
                if retry {
                    cl.budget_retries.add(now, btau, 1.0);
                }
            }
        }
        match reason {
            Some(reason) => Verdict::Answer {
                reason,
                reply: last.map(|f| f.reply),
            },
            None => Verdict::Forward { retry },
        }
    }

    /// The upstream answered `key`: remember a failure, forget it on success.
    pub fn on_outcome(
        &mut self,
        key: &RequestKey,
        failure: Option<(FailureReply, Claim)>,
        now: Instant,
    ) {
        let tau = self.cfg.counter_tau;
        match failure {
            None => {
                if self.failures.remove(key).is_some() {
                    self.failure_bytes = self.failure_bytes.saturating_sub(failure_cost(key));
                }
                if let Some(c) = self.client(key.caller, now) {
                    c.accepts.add(now, tau, 1.0);
                }
            }
            Some((reply, claim)) => {
                let cost = failure_cost(key);
                let fresh = !self.failures.contains_key(key);
                if fresh && self.failure_bytes + cost > self.cfg.max_failure_bytes {
                    let w = self.cfg.window;
                    self.failures
                        .retain(|_, f| now.saturating_duration_since(f.at) <= w);
                    self.failure_bytes = self.failures.keys().map(failure_cost).sum();
                    if self.failure_bytes + cost > self.cfg.max_failure_bytes {
                        self.evictions += 1;
                        self.failures_refused += 1;
                        return;
                    }
                }
                if fresh {
                    self.failure_bytes += cost;
                }
                self.failures.insert(
                    key.clone(),
                    RecordedFailure {
                        reply,
                        claim,
                        at: now,
                    },
                );
            }
        }
    }

    pub fn remembered_failures(&self) -> usize {
        self.failures.len()
    }

    /// Bytes the remembered failures take (by [`failure_cost`]).
    pub fn failure_bytes(&self) -> usize {
        self.failure_bytes
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            failures: self.failures.len(),
            failure_bytes: self.failure_bytes,
            clients: self.clients.len(),
            failures_refused: self.failures_refused,
            clients_refused: self.evictions.saturating_sub(self.failures_refused),
        }
    }
}

/// The tracker as the io threads share it. In the steady state (no failure remembered, no
/// per-client policy, no retry marker) requests pass without taking the lock: under CPU
/// contention a preempted lock holder would otherwise stall every other io thread.
#[derive(Debug)]
pub struct SharedTracker {
    inner: std::sync::Mutex<Tracker>,
    /// Mirror of the number of remembered failures (updated under the lock).
    failures: std::sync::atomic::AtomicUsize,
    policies: bool,
}

impl SharedTracker {
    pub fn new(cfg: PolicyConfig) -> SharedTracker {
        let policies = cfg.budget_ratio.is_some() || cfg.throttle_k.is_some();
        SharedTracker {
            inner: std::sync::Mutex::new(Tracker::new(cfg)),
            failures: Default::default(),
            policies,
        }
    }

    /// Some failure is remembered: a request may be a retry the shim answers (unless marked).
    pub fn remembers_failures(&self) -> bool {
        self.failures.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    fn idle(&self) -> bool {
        !self.policies && self.failures.load(std::sync::atomic::Ordering::Relaxed) == 0
    }

    fn with<R>(&self, f: impl FnOnce(&mut Tracker) -> R) -> R {
        let mut t = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let r = f(&mut t);
        self.failures
            .store(t.failures.len(), std::sync::atomic::Ordering::Relaxed);
        r
    }

    pub fn on_request(
        &self,
        key: &RequestKey,
        marked_retry: bool,
        suppressed: Option<Reason>,
        now: Instant,
    ) -> Verdict {
        // A budget decision needs the client's requests counted, so it takes the slow path.
        if !marked_retry && suppressed.is_none() && self.idle() {
            return Verdict::Forward { retry: false };
        }
        self.with(|t| t.on_request(key, marked_retry, suppressed, now))
    }

    pub fn on_outcome(
        &self,
        key: &RequestKey,
        failure: Option<(FailureReply, Claim)>,
        now: Instant,
    ) {
        if failure.is_none() && self.idle() {
            return;
        }
        self.with(|t| t.on_outcome(key, failure, now))
    }

    /// Failures not remembered and clients not counted for want of room.
    pub fn evictions(&self) -> u64 {
        self.with(|t| t.evictions)
    }

    pub fn stats(&self) -> CacheStats {
        self.with(|t| t.stats())
    }
}

/// Whether an HTTP status is a failure worth remembering (what retry policies retry on).
pub fn status_is_failure(s: http::StatusCode) -> bool {
    s.is_server_error()
        || s == http::StatusCode::TOO_MANY_REQUESTS
        || s == http::StatusCode::REQUEST_TIMEOUT
}

/// Retry markers on a request (the same ones l7 reads from the wire).
pub fn retry_markers(h: &HeaderMap) -> crate::l7::RetryMarkers {
    let num = |n: &str| {
        h.get(n)
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.trim().parse::<u32>().ok())
    };
    crate::l7::RetryMarkers {
        envoy_attempt_count: num("x-envoy-attempt-count"),
        retry_attempt: num("x-retry-attempt").or_else(|| num("x-retry-count")),
        grpc_previous_attempts: num("grpc-previous-rpc-attempts"),
    }
}

#[cfg(test)]
mod tests;
