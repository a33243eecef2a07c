//! A request in flight and what is known of its response, how it becomes an [`Exchange`], and
//! the failure of what was still in flight when its connection ended.
use crate::capture::{ConnId, Role, Tuple};

use super::{
    super::{
        classify::{Signals, classify, classify_http},
        exchange::{Exchange, ExchangeId, Failure, Method, Protocol, RetryMarkers},
        msg::{Ctx, ReqInfo, RespInfo},
    },
    ConnInfo,
};

/// A request in flight and what is known of its response.
#[derive(Clone, Debug, Default)]
pub(crate) struct Pending {
    pub(super) seq: u64,
    pub(super) req: ReqInfo,
    /// No request was seen at all (response without request, or an unseen request).
    pub(super) no_request: bool,
    pub(super) req_start: Ctx,
    pub(super) req_end_ts: u64,
    pub(super) body_hash: Option<u64>,
    pub(super) req_bytes: u64,
    pub(super) resp: Option<RespInfo>,
    pub(super) resp_start: Option<Ctx>,
    pub(super) resp_end_ts: Option<u64>,
    pub(super) resp_bytes: u64,
    pub(super) unknown: bool,
    pub(super) stream_id: Option<u32>,
    /// When the connection ended with this request still in flight (close or reset).
    pub(super) conn_ended: Option<u64>,
    /// HTTP/2: the request context a Go probe bound this stream to (`ConnEventKind::Stream`),
    /// which wins over the goroutines that happened to move its frames, and when.
    pub(super) bound: Option<(u64, u64)>,
}

impl Pending {
    pub(super) fn new(seq: u64, req: ReqInfo, start: &Ctx) -> Self {
        Pending {
            seq,
            unknown: req.unknown,
            req,
            req_start: *start,
            req_end_ts: start.ts_end,
            ..Default::default()
        }
    }

    /// A placeholder for a request we know exists but could not read.
    pub(super) fn unseen(seq: u64, ctx: &Ctx) -> Self {
        Pending {
            no_request: true,
            unknown: true,
            ..Pending::new(seq, ReqInfo::default(), ctx)
        }
    }

    pub(super) fn response_started(&self) -> bool {
        self.resp.is_some() || self.resp_bytes > 0
    }

    pub(super) fn into_exchange(mut self, info: &ConnInfo, failure: Option<Failure>) -> Exchange {
        self.take_exchange(info, failure)
    }

    /// The exchange, its strings taken: what is left is stale (an HTTP/2 stream's box is
    /// written anew when reused). Read in place, not moved out whole: a `Pending` taken from
    /// its box and moved into this was ~3% of the gRPC reassembly's time.
    pub(super) fn take_exchange(&mut self, info: &ConnInfo, failure: Option<Failure>) -> Exchange {
        let resp = self.resp.take().unwrap_or_default();
        let signals: Signals = resp.signals;
        let unknown = self.unknown || self.req.unknown || resp.unknown;
        // A client that closes after reading an error status line chose not to read the body
        // (urllib raises on a 5xx head and closes): the status is the outcome, not an abandonment.
        // A success head cut off mid-body stays abandoned (the client may have timed out).
        let error_head = signals
            .status
            .is_some_and(|st| classify_http(st, signals.retry_after).is_failure());
        let failure = match failure {
            Some(Failure::Abandoned) if info.role == Role::Client && error_head => None,
            f => f,
        };
        let outcome = classify(failure, &signals);
        let method = self.req.method.take();
        let idempotent =
            method.as_ref().is_some_and(Method::is_idempotent) || self.req.idempotency_key;
        let resp_tid = self
            .resp_start
            .map(|c| c.tid)
            .filter(|&t| t != self.req_start.tid);
        // A Go server's request context is the goroutine that writes its response: the
        // handler's (its request root while ServeHTTP runs, the bare goroutine right after).
        // The request may have been read by another one: net/http reads a keep-alive
        // connection's next request on a background goroutine while the previous handler
        // finishes, and keying the request by that one lost its calls (lab depth4: 10 of 164
        // Go verdicts claimed with their failed calls on the handler's key).
        let goid = self.bound.map(|(ctx, _)| ctx).or(match info.role {
            Role::Server => self.resp_start.and_then(|c| c.goid).or(self.req_start.goid),
            _ => self.req_start.goid,
        });
        Exchange {
            id: ExchangeId(0),
            conn: info.id,
            role: info.role,
            protocol: info.protocol,
            stream_id: self.stream_id,
            local: info.tuple.map(|t| t.local),
            remote: info.tuple.map(|t| t.remote),
            pid: info.pid,
            tid: self.req_start.tid,
            response_tid: resp_tid,
            goid,
            request_start_ns: self.req_start.ts_start,
            request_end_ns: self.req_end_ts,
            response_start_ns: self.resp_start.map(|c| c.ts_start),
            response_end_ns: self.resp_end_ts,
            // Set by `Emitter::emit`, from its memo of recent paths.
            route: None,
            path: self.req.path.take(),
            query_hash: self.req.query_hash,
            authority: self.req.authority.take(),
            method,
            status: signals.status,
            grpc_status: signals.grpc_status,
            outcome,
            failure,
            idempotent,
            idempotency_key: self.req.idempotency_key,
            retry_markers: std::mem::take(&mut self.req.markers),
            trace_id: self.req.trace_source.map(|_| self.req.trace_hash),
            retry_after: signals.retry_after || signals.pushback,
            claim_header: resp.claim,
            body_hash: self.body_hash,
            unknown,
            request_bytes: self.req_bytes,
            response_bytes: self.resp_bytes,
            sole_on_thread: false,
            handler_start_ns: self
                .bound
                .filter(|_| info.role == Role::Server)
                .map(|(_, ts)| ts),
            handler_end_ns: None,
            threads_multiplexed: false,
            ended_ns: self.conn_ended,
            weight: 1,
            tally: false,
        }
    }
}

/// How a connection ended, for the failure of what was still in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EndKind {
    /// The observed process closed its fd.
    Close,
    /// The connection was reset (peer RST, ECONNRESET/EPIPE).
    Reset,
    /// Idle past the timeout (or the process exited).
    Idle,
    /// Evicted for room: we simply stop knowing.
    Evicted,
}

/// When a connection that ended this way ended, for what was still in flight: a close or a
/// reset is an event of the connection; idleness and eviction are our own bookkeeping.
pub(super) fn ended_at(kind: EndKind, ctx: &Ctx) -> Option<u64> {
    matches!(kind, EndKind::Close | EndKind::Reset).then_some(ctx.ts_start)
}

/// The failure of an exchange still in flight when its connection ended.
pub(super) fn end_failure(role: Role, kind: EndKind, started: bool) -> Option<Failure> {
    use Failure::*;
    Some(match (kind, role) {
        (EndKind::Evicted, _) => return None,
        (_, _) if started && kind != EndKind::Close => ResetMidResponse,
        // The client closed while waiting: it gave up (a timeout, usually).
        (EndKind::Close, Role::Client) => Abandoned,
        (EndKind::Close, _) if started => ResetMidResponse,
        (EndKind::Close, _) => ClosedNoResponse,
        // The server sees the client reset with the request unanswered: the caller gave up.
        (EndKind::Reset, Role::Server) => Abandoned,
        (EndKind::Reset, _) => Reset,
        (EndKind::Idle, _) => ClosedNoResponse,
    })
}

/// A connect that failed: a client exchange with no request (no bytes were exchanged).
pub(crate) fn connect_failure(
    id: ConnId,
    pid: u32,
    tid: u32,
    tuple: Option<Tuple>,
    ts: u64,
    failure: Failure,
) -> Exchange {
    let ctx = Ctx {
        ts_start: ts,
        ts_end: ts,
        tid,
        goid: None,
        interleaved: false,
    };
    let info = ConnInfo {
        id,
        pid,
        role: Role::Client,
        tuple,
        protocol: Protocol::Opaque,
    };
    let mut p = Pending::new(0, ReqInfo::default(), &ctx);
    p.req.markers = RetryMarkers::default();
    p.into_exchange(&info, Some(failure))
}
