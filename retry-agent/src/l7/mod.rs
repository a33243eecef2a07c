//! Stage 2: per-connection reassembly of HTTP/1.x and HTTP/2/gRPC into [`Exchange`]s.
//! Pure logic: no IO, never panics on bytes.
//!
//! Entry point: [`Reassembler`]. Feed it every [`crate::capture::Event`] in kernel order with
//! [`Reassembler::push`], call [`Reassembler::tick`] as time passes; completed exchanges are
//! appended to the caller's vector.
mod classify;
mod conn;
pub mod exchange;
mod http1;
pub mod hpack;
mod http2;
mod msg;
mod trace;
mod util;

use std::num::NonZeroUsize;

use clap::Args;
use lru::LruCache;

pub use exchange::{
    Claim, ERROR_CLAIM_HEADER, Exchange, ExchangeId, Failure, Method, OutcomeClass, Protocol,
    RETRY_SUPPRESSED_HEADER, RetryMarkers, Text,
};

pub use trace::trace_of_headers;
pub use util::{DigestKey, Keyed, digest_key, route_template, set_digest_key};
pub(crate) use util::{Domain, domain_hasher};

use crate::{
    capture::{ConnEvent, ConnEventKind, ConnId, DataEvent, Event, Role},
    settings::{InvalidConfig, Settings},
};
use conn::{Conn, Emitter, EndKind, InboundByThread};
use msg::Ctx;
use util::Routes;

/// Settings of the L7 stage (`--l7-*`). Flattened into the commands that reassemble (`run`, `trace
/// --exchanges`, `forensics`).
#[derive(Args, Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct L7Config {
    /// Bytes buffered per connection at most (unfinished message heads, HTTP/2 header blocks).
    /// A head or header block larger than this is counted as a truncation and its exchange is
    /// marked unknown.
    #[arg(long = "l7-conn-buffer-bytes", env = "RETRY_AGENT_L7_CONN_BUFFER_BYTES", default_value_t = 64 * 1024)]
    pub conn_buffer_bytes: usize,
    /// Connections tracked at once; beyond this the least recently used one is evicted
    /// (default: derived from --memory-budget-mib).
    #[arg(
        long = "l7-max-connections",
        env = "RETRY_AGENT_L7_MAX_CONNECTIONS",
        default_value_t = 2304
    )]
    pub max_connections: usize,
    /// Requests in flight per connection (HTTP/1 pipelining depth, HTTP/2 streams) at most; the
    /// oldest is given up (emitted as unknown) beyond this.
    #[arg(
        long = "l7-max-inflight",
        env = "RETRY_AGENT_L7_MAX_INFLIGHT",
        default_value_t = 256
    )]
    pub max_inflight: usize,
    /// A connection with no event for this long is evicted; its unanswered requests are emitted
    /// as failures.
    #[arg(
        long = "l7-idle-timeout-secs",
        env = "RETRY_AGENT_L7_IDLE_TIMEOUT_SECS",
        default_value_t = 300
    )]
    pub idle_timeout_secs: u64,
}

impl Default for L7Config {
    fn default() -> Self {
        crate::settings::defaults()
    }
}

impl Settings for L7Config {
    fn check(&self, p: &mut InvalidConfig) {
        // A buffer smaller than a request line would mark every exchange unknown.
        p.check(
            self.conn_buffer_bytes >= 1024,
            "l7-conn-buffer-bytes",
            self.conn_buffer_bytes,
            "at least 1024",
        );
        p.check(
            self.max_connections > 0,
            "l7-max-connections",
            self.max_connections,
            "at least 1",
        );
        p.check(
            self.max_inflight > 0,
            "l7-max-inflight",
            self.max_inflight,
            "at least 1",
        );
        p.check(
            self.idle_timeout_secs > 0,
            "l7-idle-timeout-secs",
            self.idle_timeout_secs,
            "at least 1",
        );
    }
}

/// Counters of the L7 stage (monotonic except `connections`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct L7Stats {
    /// Connections tracked now.
    pub connections: u64,
    /// Connections that ended: closed, reset, or their process exited. Not evictions: their
    /// state was finished, not dropped.
    pub closed: u64,
    /// Connections evicted because the table was full (least recently used first).
    pub evictions_lru: u64,
    /// Connections evicted because they were idle past the timeout.
    pub evictions_idle: u64,
    /// Requests (HTTP/1 pipelining) or streams (HTTP/2) given up because their connection had
    /// `max_inflight` in flight.
    pub evictions_inflight: u64,
    /// Message heads / header blocks cut short (capture prefix or buffer cap).
    pub truncations: u64,
    /// Bytes that did not parse as the protocol the connection was detected as.
    pub parse_errors: u64,
    /// Exchanges emitted.
    pub exchanges: u64,
    /// Of which marked `unknown` (decoder out of sync).
    pub unknown_exchanges: u64,
    /// Of which made from a kernel summary (`--capture-summarize`): no headers were read.
    pub summarised_exchanges: u64,
    /// Quiet exchanges the kernel counted and did not send (`--capture-summary-every`): in
    /// the weights of summaries and tallies, not in `exchanges`.
    pub counted_exchanges: u64,
    /// Bytes seen on connections that are not HTTP (counted, not parsed).
    pub opaque_bytes: u64,
    /// HTTP/2 streams bound to a request context by a Go probe (`ConnEventKind::Stream`).
    pub stream_bindings: u64,
    /// Bindings for a connection not tracked or not (yet) HTTP/2: dropped.
    pub stream_bindings_unmatched: u64,
}

impl L7Stats {
    /// State a bound dropped: connections (table full, idle) and requests or streams (in-flight
    /// cap). An ordinary close is not an eviction.
    pub fn evictions(&self) -> u64 {
        self.evictions_lru + self.evictions_idle + self.evictions_inflight
    }
}

/// Connection keys are the kernel's (pid, fd, generation), not attacker-chosen: a fast hash
/// (SipHash was 3% of reassembly time) with a per-process seed.
type ConnHasher = foldhash::fast::RandomState;

/// How stale a connection's place in the recency order may be. Idle eviction runs on ticks of
/// a second with timeouts of seconds, so it is at most this late; eviction for room takes a
/// connection used at most this long before the least recently used one.
const PROMOTE_NS: u64 = 100_000_000;

/// Turns capture events into exchanges. One per pipeline; owns all per-connection state.
pub struct Reassembler {
    cfg: L7Config,
    stats: L7Stats,
    next_id: u64,
    /// Connections by recency of use, to within [`PROMOTE_NS`] (LRU eviction when full, idle
    /// eviction from the old end).
    conns: LruCache<ConnId, Conn, ConnHasher>,
    /// Server requests each thread has read and not answered.
    inbound: InboundByThread,
    routes: Routes,
    handlers: conn::HandlerStarts,
}

impl Reassembler {
    pub fn new(cfg: L7Config) -> Self {
        let cap = NonZeroUsize::new(cfg.max_connections).unwrap_or(NonZeroUsize::MIN);
        Reassembler {
            cfg,
            stats: L7Stats::default(),
            next_id: 0,
            conns: LruCache::with_hasher(cap, ConnHasher::default()),
            inbound: InboundByThread::default(),
            routes: Routes::default(),
            handlers: conn::HandlerStarts::default(),
        }
    }

    pub fn config(&self) -> &L7Config {
        &self.cfg
    }

    /// Feed one event (events arrive in kernel order, roughly by time). Completed exchanges are
    /// appended to `out`.
    pub fn push(&mut self, ev: &Event, out: &mut Vec<Exchange>) {
        match ev {
            Event::Data(d) => self.on_conn(d, d.ts_exit_ns, out, |c, em| c.data(d, em)),
            Event::Summary(s) => self.on_conn(&s.request, s.response.ts_exit_ns, out, |c, em| {
                c.summary(s, em)
            }),
            Event::Conn(c) => self.conn_event(c, out),
            Event::ProcessExit { pid, ts_ns } => {
                let dead: Vec<ConnId> = self
                    .conns
                    .iter()
                    .filter(|(_, c)| c.pid() == *pid)
                    .map(|(k, _)| *k)
                    .collect();
                let ctx = Ctx {
                    ts_start: *ts_ns,
                    ts_end: *ts_ns,
                    tid: *pid,
                    goid: None,
                    interleaved: false,
                };
                let mut em = Emitter {
                    out,
                    stats: &mut self.stats,
                    next_id: &mut self.next_id,
                    inbound: &mut self.inbound,
                    handlers: &mut self.handlers,
                    routes: &mut self.routes,
                };
                for id in dead {
                    if let Some(mut c) = self.conns.pop(&id) {
                        c.end(EndKind::Close, &ctx, &mut em);
                        em.stats.closed += 1;
                    }
                }
                self.inbound.forget_pid(*pid);
                self.handlers.forget_pid(*pid);
            }
            Event::Process(_) => {}
        }
        self.stats.connections = self.conns.len() as u64;
    }

    /// Gives `f` the connection record `d` is about (made on first sight, mid-life: its bytes
    /// may start mid-message) with an emitter; `ts` is the record's time.
    fn on_conn(
        &mut self,
        d: &DataEvent,
        ts: u64,
        out: &mut Vec<Exchange>,
        f: impl FnOnce(&mut Conn, &mut Emitter<'_>),
    ) {
        let mut em = Emitter {
            out,
            stats: &mut self.stats,
            next_id: &mut self.next_id,
            inbound: &mut self.inbound,
            handlers: &mut self.handlers,
            routes: &mut self.routes,
        };
        // One lookup for a known connection (nearly every event), two for a new one. A known
        // one is looked up without reordering the table, and moved to its recent end at most
        // every PROMOTE_NS: relinking on every event was ~3% of the agent's CPU under a
        // keep-alive load.
        if let Some(c) = self.conns.peek_mut(&d.conn) {
            let promote = ts >= c.promoted_ts.saturating_add(PROMOTE_NS);
            if promote {
                c.promoted_ts = ts;
            }
            f(c, &mut em);
            if promote {
                self.conns.promote(&d.conn);
            }
            return;
        }
        let c = Conn::new(
            d.conn,
            d.pid,
            d.role,
            d.tuple,
            false,
            self.cfg.conn_buffer_bytes,
            self.cfg.max_inflight,
        );
        insert(&mut self.conns, d.conn, c, &mut em);
        if let Some(c) = self.conns.get_mut(&d.conn) {
            f(c, &mut em);
        }
    }

    fn conn_event(&mut self, ev: &ConnEvent, out: &mut Vec<Exchange>) {
        let mut em = Emitter {
            out,
            stats: &mut self.stats,
            next_id: &mut self.next_id,
            inbound: &mut self.inbound,
            handlers: &mut self.handlers,
            routes: &mut self.routes,
        };
        let ctx = Ctx {
            ts_start: ev.ts_ns,
            ts_end: ev.ts_ns,
            tid: ev.tid,
            goid: None,
            interleaved: false,
        };
        let (cap, inflight) = (self.cfg.conn_buffer_bytes, self.cfg.max_inflight);
        let open = |conns: &mut LruCache<ConnId, Conn, ConnHasher>,
                    role: Role,
                    fresh: bool,
                    em: &mut Emitter<'_>| {
            if let Some(c) = conns.get_mut(&ev.conn) {
                c.set_tuple(ev.tuple);
                return;
            }
            let mut c = Conn::new(ev.conn, ev.pid, role, ev.tuple, fresh, cap, inflight);
            c.last_ts = ev.ts_ns;
            insert(conns, ev.conn, c, em);
        };
        match ev.kind {
            ConnEventKind::Connect { errno } | ConnEventKind::Failed { errno } => {
                match connect_failure(errno) {
                    Some(f) => {
                        if let Some(mut c) = self.conns.pop(&ev.conn) {
                            c.end(EndKind::Close, &ctx, &mut em);
                        }
                        em.emit(conn::connect_failure(
                            ev.conn, ev.pid, ev.tid, ev.tuple, ev.ts_ns, f,
                        ));
                    }
                    None if matches!(ev.kind, ConnEventKind::Connect { .. }) => {
                        open(&mut self.conns, Role::Client, true, &mut em)
                    }
                    None => {}
                }
            }
            ConnEventKind::Established => open(&mut self.conns, Role::Client, true, &mut em),
            ConnEventKind::Accept => open(&mut self.conns, Role::Server, true, &mut em),
            ConnEventKind::Existing => open(&mut self.conns, ev.role, false, &mut em),
            ConnEventKind::Stream { id, context } => {
                if ev.role == Role::Server {
                    em.handlers.started(ev.pid, context, ev.ts_ns);
                }
                let bound = self
                    .conns
                    .get_mut(&ev.conn)
                    .is_some_and(|c| c.bind_stream(id, context, ev.ts_ns));
                if bound {
                    em.stats.stream_bindings += 1;
                } else {
                    em.stats.stream_bindings_unmatched += 1;
                }
            }
            ConnEventKind::Close | ConnEventKind::Reset { .. } => {
                if let Some(mut c) = self.conns.pop(&ev.conn) {
                    let kind = if ev.kind == ConnEventKind::Close {
                        EndKind::Close
                    } else {
                        EndKind::Reset
                    };
                    c.end(kind, &ctx, &mut em);
                    em.stats.closed += 1;
                }
            }
        }
        self.stats.connections = self.conns.len() as u64;
    }

    /// Time passes: connections idle past the timeout are evicted; requests with no response by
    /// then are emitted as failures.
    pub fn tick(&mut self, now_ns: u64, out: &mut Vec<Exchange>) {
        let timeout = self.cfg.idle_timeout_secs.saturating_mul(1_000_000_000);
        let mut em = Emitter {
            out,
            stats: &mut self.stats,
            next_id: &mut self.next_id,
            inbound: &mut self.inbound,
            handlers: &mut self.handlers,
            routes: &mut self.routes,
        };
        // Least recently used first; events arrive roughly by time, so the idle ones are there.
        while let Some((_, c)) = self.conns.peek_lru() {
            if c.last_ts.saturating_add(timeout) > now_ns {
                break;
            }
            if let Some((_, mut c)) = self.conns.pop_lru() {
                let ctx = Ctx {
                    ts_start: now_ns,
                    ts_end: now_ns,
                    tid: 0,
                    goid: None,
                    interleaved: false,
                };
                c.end(EndKind::Idle, &ctx, &mut em);
                em.stats.evictions_idle += 1;
            }
        }
        self.stats.connections = self.conns.len() as u64;
    }

    pub fn stats(&self) -> L7Stats {
        self.stats
    }

    /// Bytes held in per-connection buffers now (bounded by connections × cap).
    pub fn buffered_bytes(&self) -> usize {
        self.conns.iter().map(|(_, c)| c.buffered()).sum()
    }
}

/// Insert a connection, evicting the least recently used one when the table is full.
fn insert(
    conns: &mut LruCache<ConnId, Conn, ConnHasher>,
    id: ConnId,
    c: Conn,
    em: &mut Emitter<'_>,
) {
    if let Some((old_id, mut old)) = conns.push(id, c)
        && old_id != id
    {
        let ctx = Ctx {
            ts_start: old.last_ts,
            ts_end: old.last_ts,
            tid: 0,
            goid: None,
            interleaved: false,
        };
        old.end(EndKind::Evicted, &ctx, em);
        em.stats.evictions_lru += 1;
    }
}

/// The failure a connect errno means, if it means one (0 and EINPROGRESS do not).
fn connect_failure(errno: i32) -> Option<Failure> {
    let e = errno.checked_abs().unwrap_or(0);
    match e {
        libc::ECONNREFUSED | libc::ECONNRESET => Some(Failure::ConnectRefused),
        libc::ETIMEDOUT | libc::EHOSTUNREACH | libc::ENETUNREACH => Some(Failure::ConnectTimeout),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_h2;
