//! One connection: protocol detection, the two directions' parsers, and the pairing of
//! requests with responses (FIFO for HTTP/1, by stream for HTTP/2).
use std::collections::{HashMap, VecDeque};

use crate::capture::{ConnId, DataEvent, Direction, Role, Syscall, Tuple};

use super::{
    L7Stats,
    classify::{Signals, classify, classify_http},
    exchange::{Exchange, ExchangeId, Failure, Method, Protocol, RetryMarkers},
    http1::{self, Answering, H1Parser, H1Sink, Side},
    http2::{self, Block, H2Dir, H2Sink, PREFACE},
    msg::{Ctx, ReqInfo, RespInfo},
    util::{BodyHasher, route_template},
};

/// Where completed exchanges go: numbered in emission order and counted.
pub(crate) struct Emitter<'a> {
    pub out: &'a mut Vec<Exchange>,
    pub stats: &'a mut L7Stats,
    pub next_id: &'a mut u64,
}

impl Emitter<'_> {
    pub(crate) fn emit(&mut self, mut ex: Exchange) {
        ex.id = ExchangeId(*self.next_id);
        *self.next_id += 1;
        self.stats.exchanges += 1;
        if ex.unknown {
            self.stats.unknown_exchanges += 1;
        }
        self.out.push(ex);
    }
}

/// Identity of the connection as exchanges carry it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnInfo {
    pub id: ConnId,
    pub pid: u32,
    pub role: Role,
    pub tuple: Option<Tuple>,
    pub protocol: Protocol,
}

/// A request in flight and what is known of its response.
#[derive(Clone, Debug, Default)]
pub(crate) struct Pending {
    seq: u64,
    req: ReqInfo,
    /// No request was seen at all (response without request, or an unseen request).
    no_request: bool,
    req_start: Ctx,
    req_end_ts: u64,
    body_hash: Option<u64>,
    req_bytes: u64,
    resp: Option<RespInfo>,
    resp_start: Option<Ctx>,
    resp_end_ts: Option<u64>,
    resp_bytes: u64,
    unknown: bool,
    stream_id: Option<u32>,
}

impl Pending {
    fn new(seq: u64, req: ReqInfo, start: &Ctx) -> Self {
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
    fn unseen(seq: u64, ctx: &Ctx) -> Self {
        Pending { no_request: true, unknown: true, ..Pending::new(seq, ReqInfo::default(), ctx) }
    }

    fn response_started(&self) -> bool {
        self.resp.is_some() || self.resp_bytes > 0
    }

    fn into_exchange(self, info: &ConnInfo, failure: Option<Failure>) -> Exchange {
        let resp = self.resp.unwrap_or_default();
        let signals: Signals = resp.signals;
        let unknown = self.unknown || self.req.unknown || resp.unknown;
        // A client that closes after reading an error status line chose not to read the body
        // (urllib raises on a 5xx head and closes): the status is the outcome, not an abandonment.
        // A success head cut off mid-body stays abandoned (the client may have timed out).
        let error_head = signals.status.is_some_and(|st| classify_http(st, signals.retry_after).is_failure());
        let failure = match failure {
            Some(Failure::Abandoned) if info.role == Role::Client && error_head => None,
            f => f,
        };
        let outcome = classify(failure, &signals);
        let method = self.req.method;
        let idempotent = method.as_ref().is_some_and(Method::is_idempotent) || self.req.idempotency_key;
        let resp_tid = self.resp_start.map(|c| c.tid).filter(|&t| t != self.req_start.tid);
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
            goid: self.req_start.goid,
            request_start_ns: self.req_start.ts_start,
            request_end_ns: self.req_end_ts,
            response_start_ns: self.resp_start.map(|c| c.ts_start),
            response_end_ns: self.resp_end_ts,
            route: self.req.path.as_deref().map(route_template),
            path: self.req.path,
            query_hash: self.req.query_hash,
            authority: self.req.authority,
            method,
            status: signals.status,
            grpc_status: signals.grpc_status,
            outcome,
            failure,
            idempotent,
            idempotency_key: self.req.idempotency_key,
            retry_markers: self.req.markers,
            retry_after: signals.retry_after || signals.pushback,
            claim_header: resp.claim,
            body_hash: self.body_hash,
            unknown,
            request_bytes: self.req_bytes,
            response_bytes: self.resp_bytes,
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

/// The failure of an exchange still in flight when its connection ended.
fn end_failure(role: Role, kind: EndKind, started: bool) -> Option<Failure> {
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

/// Syscall boundaries a connection of unknown start gets to show a message start before it
/// is taken for a non-HTTP protocol.
const MAX_PROBES: u32 = 16;
/// Bytes held per direction while the protocol is undecided (the HTTP/2 preface is 24).
const DETECT_BYTES: usize = 64;

#[derive(Default)]
struct DetectDir {
    buf: Vec<u8>,
    first: Ctx,
}

enum Proto {
    Undetected([DetectDir; 2]),
    Http1(Box<H1Conn>),
    Http2(Box<H2Conn>),
    Opaque,
}

pub(crate) struct Conn {
    info: ConnInfo,
    /// The direction that carries requests, once known.
    req_dir: Option<Direction>,
    /// Connect/accept seen: bytes start at the stream start.
    fresh: bool,
    probes: u32,
    pub(crate) last_ts: u64,
    proto: Proto,
    cap: usize,
    max_inflight: usize,
    /// TLS plaintext has been seen (from the TLS library's probes): only that is parsed from
    /// now on; the connection's syscall bytes are ciphertext.
    tls: bool,
}

fn dir_index(d: Direction) -> usize {
    match d {
        Direction::Egress => 0,
        Direction::Ingress => 1,
    }
}

fn other(d: Direction) -> Direction {
    match d {
        Direction::Egress => Direction::Ingress,
        Direction::Ingress => Direction::Egress,
    }
}

/// What the first bytes of a direction say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Guess {
    /// Could still become something: wait for more bytes.
    NotYet,
    No,
    Http1Request,
    Http1Response,
    Http2Client,
    Http2Server,
    /// Frames without a preface: HTTP/2 joined mid-connection.
    Http2Mid,
}

fn guess(b: &[u8], fresh: bool) -> Guess {
    if b.starts_with(PREFACE) {
        return Guess::Http2Client;
    }
    if PREFACE.starts_with(b) {
        return Guess::NotYet;
    }
    if http1::looks_like_start(Side::Response, b) {
        return Guess::Http1Response;
    }
    if b"HTTP/1.".starts_with(b) {
        return Guess::NotYet;
    }
    if http1::looks_like_start(Side::Request, b) {
        return Guess::Http1Request;
    }
    if b.len() < 18 && http1::could_start_request(b) && !b.is_empty() {
        return Guess::NotYet;
    }
    if fresh {
        if http2::is_server_preface(b) {
            return Guess::Http2Server;
        }
        if b.len() < 9 && b.first() == Some(&0) {
            return Guess::NotYet;
        }
    }
    Guess::No
}

impl Conn {
    pub(crate) fn new(id: ConnId, pid: u32, role: Role, tuple: Option<Tuple>, fresh: bool, cap: usize, max_inflight: usize) -> Self {
        Conn {
            info: ConnInfo { id, pid, role, tuple, protocol: Protocol::Opaque },
            req_dir: req_dir_of(role),
            fresh,
            probes: 0,
            last_ts: 0,
            proto: Proto::Undetected(Default::default()),
            cap,
            max_inflight: max_inflight.max(1),
            tls: false,
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.info.pid
    }

    pub(crate) fn set_tuple(&mut self, t: Option<Tuple>) {
        if t.is_some() {
            self.info.tuple = t;
        }
    }

    /// Bytes held by this connection's buffers (bounded by the cap per buffer).
    pub(crate) fn buffered(&self) -> usize {
        match &self.proto {
            Proto::Undetected(d) => d.iter().map(|d| d.buf.capacity()).sum(),
            Proto::Http1(h) => h.req.buffered() + h.resp.buffered(),
            Proto::Http2(h) => h.dirs.iter().map(H2Dir::buffered).sum(),
            Proto::Opaque => 0,
        }
    }

    pub(crate) fn data(&mut self, d: &DataEvent, em: &mut Emitter<'_>) {
        let plaintext = matches!(d.syscall, Syscall::SslRead | Syscall::SslWrite);
        if plaintext && !self.tls {
            // Handshake ciphertext (when the library's handshake was not probed) may have made
            // the connection opaque: the plaintext stream starts afresh.
            self.tls = true;
            if !matches!(self.proto, Proto::Http1(_) | Proto::Http2(_)) {
                self.proto = Proto::Undetected(Default::default());
                self.probes = 0;
            }
        } else if self.tls && !plaintext {
            return;
        }
        self.last_ts = self.last_ts.max(d.ts_exit_ns);
        self.set_tuple(d.tuple);
        let ctx = Ctx {
            ts_start: match d.direction {
                Direction::Egress => d.ts_enter_ns,
                Direction::Ingress => d.ts_exit_ns,
            },
            ts_end: d.ts_exit_ns,
            tid: d.tid,
            goid: d.goid,
        };
        let payload = d.payload.get(..d.payload.len().min(usize::try_from(d.len).unwrap_or(usize::MAX))).unwrap_or_default();
        let gap = d.len.saturating_sub(payload.len() as u64);
        if let Proto::Undetected(_) = self.proto {
            self.detect(d.direction, payload, gap, &ctx, em);
            return;
        }
        self.feed(d.direction, payload, gap, &ctx, true, em);
    }

    fn feed(&mut self, dir: Direction, payload: &[u8], gap: u64, ctx: &Ctx, event_start: bool, em: &mut Emitter<'_>) {
        let is_req = self.req_dir == Some(dir);
        let info = self.info;
        match &mut self.proto {
            Proto::Undetected(_) => {}
            Proto::Opaque => em.stats.opaque_bytes += payload.len() as u64 + gap,
            Proto::Http1(h) => {
                if let Some((stream1, left)) = h.feed(is_req, payload, gap, ctx, event_start, &info, self.max_inflight, em) {
                    self.switch_to_h2c(stream1);
                    // The server's first frames may share the write of its 101.
                    let tail = payload.get(payload.len().saturating_sub(left)..).unwrap_or_default();
                    if !tail.is_empty() {
                        self.feed(dir, tail, 0, ctx, true, em);
                    }
                }
            }
            Proto::Http2(h) => h.feed(is_req, payload, gap, ctx, event_start, &info, em),
        }
    }

    fn detect(&mut self, dir: Direction, payload: &[u8], gap: u64, ctx: &Ctx, em: &mut Emitter<'_>) {
        let Proto::Undetected(dirs) = &mut self.proto else { return };
        let det = &mut dirs[dir_index(dir)];
        let at_event_start = det.buf.is_empty();
        let mut cand = std::mem::take(&mut det.buf);
        let prior = cand.len();
        cand.extend_from_slice(payload.get(..payload.len().min(DETECT_BYTES)).unwrap_or_default());
        let mut g = guess(&cand, self.fresh);
        if g == Guess::No && at_event_start && gap == 0 && !self.fresh && http2::is_frame_run(payload) {
            g = Guess::Http2Mid;
        }
        let (proto, req_dir) = match g {
            Guess::NotYet if gap == 0 && cand.len() < DETECT_BYTES => {
                if prior == 0 {
                    det.first = *ctx;
                }
                det.buf = cand;
                return;
            }
            Guess::NotYet | Guess::No => {
                det.buf.clear();
                self.probes += 1;
                if self.fresh || self.probes >= MAX_PROBES {
                    self.proto = Proto::Opaque;
                    em.stats.opaque_bytes += payload.len() as u64 + gap + prior as u64;
                }
                return;
            }
            Guess::Http1Request => (Protocol::Http1, dir),
            Guess::Http1Response => (Protocol::Http1, other(dir)),
            Guess::Http2Client => (Protocol::Http2, dir),
            Guess::Http2Server => (Protocol::Http2, other(dir)),
            Guess::Http2Mid => match self.req_dir {
                // Which side is the client cannot be read from mid-stream frames.
                Some(r) => (Protocol::Http2, r),
                None => {
                    self.probes += 1;
                    if self.probes >= MAX_PROBES {
                        self.proto = Proto::Opaque;
                    }
                    return;
                }
            },
        };
        if self.req_dir.is_some_and(|r| r != req_dir) {
            // The bytes contradict the role the kernel reported: do not parse them as HTTP.
            self.proto = Proto::Opaque;
            return;
        }
        let first = if prior > 0 { det.first } else { *ctx };
        let Proto::Undetected(mut dirs) = std::mem::replace(&mut self.proto, Proto::Opaque) else { return };
        self.req_dir = Some(req_dir);
        if self.info.role == Role::Unknown {
            self.info.role = match req_dir {
                Direction::Egress => Role::Client,
                Direction::Ingress => Role::Server,
            };
        }
        self.info.protocol = proto;
        let mid = !self.fresh && g != Guess::Http2Client;
        self.proto = match proto {
            Protocol::Http2 => {
                let hpack_ok = g != Guess::Http2Mid;
                let preface = g == Guess::Http2Client || (self.fresh && g == Guess::Http2Server);
                let (req, resp) = if g == Guess::Http2Mid {
                    (H2Dir::new(Side::Request, false, false, self.cap), H2Dir::new(Side::Response, false, false, self.cap))
                } else if mid {
                    (H2Dir::new_lost(Side::Request, self.cap), H2Dir::new(Side::Response, false, hpack_ok, self.cap))
                } else {
                    (H2Dir::new(Side::Request, preface, hpack_ok, self.cap), H2Dir::new(Side::Response, false, hpack_ok, self.cap))
                };
                Proto::Http2(Box::new(H2Conn { dirs: [req, resp], streams: HashMap::new(), max_inflight: self.max_inflight }))
            }
            _ => {
                let mk = |side| if mid { H1Parser::new_lost(side, self.cap) } else { H1Parser::new(side, self.cap) };
                let mut h = H1Conn::new(mk(Side::Request), mk(Side::Response));
                // The direction that decided starts at a message start.
                let decided = if dir == req_dir { &mut h.req } else { &mut h.resp };
                *decided = H1Parser::new(if dir == req_dir { Side::Request } else { Side::Response }, self.cap);
                Proto::Http1(Box::new(h))
            }
        };
        // Replay what the other direction held, then this direction's held bytes and event.
        let o = std::mem::take(&mut dirs[dir_index(other(dir))]);
        if !o.buf.is_empty() {
            self.feed(other(dir), &o.buf, 0, &o.first, true, em);
        }
        if prior > 0 {
            let held = cand.get(..prior).unwrap_or_default().to_vec();
            self.feed(dir, &held, 0, &first, true, em);
            self.feed(dir, payload, gap, ctx, false, em);
        } else {
            self.feed(dir, payload, gap, ctx, true, em);
        }
    }

    /// After `101 Switching Protocols` with `Upgrade: h2c`: the client sends the HTTP/2 preface
    /// next, the server answers the upgraded request on stream 1.
    fn switch_to_h2c(&mut self, stream1: Pending) {
        self.info.protocol = Protocol::Http2;
        let req = H2Dir::new(Side::Request, true, true, self.cap);
        let resp = H2Dir::new(Side::Response, false, true, self.cap);
        let mut streams = HashMap::new();
        streams.insert(1, H2Stream { p: stream1, hasher: BodyHasher::default() });
        self.proto = Proto::Http2(Box::new(H2Conn { dirs: [req, resp], streams, max_inflight: self.max_inflight }));
    }

    /// The connection ended: finish what a close finishes, fail what is still in flight.
    pub(crate) fn end(&mut self, kind: EndKind, ctx: &Ctx, em: &mut Emitter<'_>) {
        let info = self.info;
        match &mut self.proto {
            Proto::Http1(h) => h.end(kind, ctx, &info, em),
            Proto::Http2(h) => h.end(kind, &info, em),
            Proto::Undetected(_) | Proto::Opaque => {}
        }
    }
}

fn req_dir_of(role: Role) -> Option<Direction> {
    match role {
        Role::Client => Some(Direction::Egress),
        Role::Server => Some(Direction::Ingress),
        Role::Unknown => None,
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP/1

struct H1Conn {
    req: H1Parser,
    resp: H1Parser,
    pending: VecDeque<Pending>,
    next_seq: u64,
    /// The request the request parser is reading.
    cur_req: Option<u64>,
}

impl H1Conn {
    fn new(req: H1Parser, resp: H1Parser) -> Self {
        H1Conn { req, resp, pending: VecDeque::new(), next_seq: 0, cur_req: None }
    }

    #[expect(clippy::too_many_arguments, reason = "one call site; the parts are split borrows of the connection")]
    /// Returns the upgraded request when the connection switched to HTTP/2 (h2c), whose response
    /// comes on stream 1, and how many bytes at the end of `payload` are already HTTP/2.
    fn feed(&mut self, is_req: bool, payload: &[u8], gap: u64, ctx: &Ctx, event_start: bool, info: &ConnInfo, max_inflight: usize, em: &mut Emitter<'_>) -> Option<(Pending, usize)> {
        let H1Conn { req, resp, pending, next_seq, cur_req } = self;
        let mut upgraded = Upgraded::No;
        let mut sink = H1Pairing { side: if is_req { Side::Request } else { Side::Response }, pending, next_seq, cur_req, info, max_inflight, em, upgraded: &mut upgraded };
        let parser = if is_req { &mut *req } else { &mut *resp };
        if event_start {
            parser.event_start(payload, ctx, &mut sink);
        }
        let left = parser.feed(payload, ctx, &mut sink);
        if gap > 0 {
            parser.gap(gap, ctx, &mut sink);
        }
        match upgraded {
            Upgraded::No => None,
            Upgraded::Opaque => {
                req.set_upgraded();
                resp.set_upgraded();
                None
            }
            Upgraded::H2c(p) => Some((*p, left)),
        }
    }

    fn end(&mut self, kind: EndKind, ctx: &Ctx, info: &ConnInfo, em: &mut Emitter<'_>) {
        let H1Conn { req: _, resp, pending, next_seq, cur_req } = self;
        if kind == EndKind::Close {
            let mut upgraded = Upgraded::No;
            let mut sink = H1Pairing { side: Side::Response, pending, next_seq, cur_req, info, max_inflight: usize::MAX, em, upgraded: &mut upgraded };
            resp.close(ctx, &mut sink);
        }
        let in_message = resp.in_message();
        let resp_bytes = resp.message_bytes();
        for (i, mut p) in std::mem::take(pending).into_iter().enumerate() {
            if i == 0 && in_message {
                p.resp_bytes = p.resp_bytes.max(resp_bytes);
            }
            let started = p.response_started();
            let f = end_failure(info.role, kind, started);
            if kind == EndKind::Evicted {
                p.unknown = true;
            }
            em.emit(p.into_exchange(info, f));
        }
    }
}

/// What a 101 (or a CONNECT's 2xx) did to the connection.
enum Upgraded {
    No,
    /// Another protocol: stop parsing.
    Opaque,
    /// HTTP/2 over cleartext: this request is stream 1.
    H2c(Box<Pending>),
}

struct H1Pairing<'a, 'b> {
    side: Side,
    pending: &'a mut VecDeque<Pending>,
    next_seq: &'a mut u64,
    cur_req: &'a mut Option<u64>,
    info: &'a ConnInfo,
    max_inflight: usize,
    em: &'a mut Emitter<'b>,
    upgraded: &'a mut Upgraded,
}

impl H1Pairing<'_, '_> {
    fn push(&mut self, p: Pending) {
        self.pending.push_back(p);
        if self.pending.len() > self.max_inflight
            && let Some(mut old) = self.pending.pop_front()
        {
            // Too deep a pipeline to be real: give the oldest up rather than grow.
            old.unknown = true;
            self.em.emit(old.into_exchange(self.info, None));
        }
    }

    fn seq(&mut self) -> u64 {
        let s = *self.next_seq;
        *self.next_seq += 1;
        s
    }
}

impl H1Sink for H1Pairing<'_, '_> {
    fn request_head(&mut self, req: ReqInfo, start: &Ctx) {
        let seq = self.seq();
        *self.cur_req = Some(seq);
        self.push(Pending::new(seq, req, start));
    }

    fn request_end(&mut self, ctx: &Ctx, body_hash: Option<u64>, bytes: u64, complete: bool) {
        let Some(seq) = self.cur_req.take() else { return };
        // Usually the newest; it may already be gone if the response finished first.
        if let Some(p) = self.pending.iter_mut().rev().find(|p| p.seq == seq) {
            p.req_end_ts = ctx.ts_end;
            p.body_hash = body_hash;
            p.req_bytes = bytes;
            p.unknown |= !complete;
        }
    }

    fn response_head(&mut self, resp: RespInfo, start: &Ctx) -> Answering {
        if self.pending.front().is_none_or(|p| p.resp.is_some()) {
            // A response to a request we never saw (capture began after it).
            let seq = self.seq();
            self.pending.push_front(Pending::unseen(seq, start));
        }
        let Some(p) = self.pending.front_mut() else { return Answering::default() };
        p.resp = Some(resp);
        p.resp_start = Some(*start);
        Answering {
            head: p.req.method == Some(Method::Head),
            connect: p.req.method == Some(Method::Connect),
        }
    }

    fn response_end(&mut self, ctx: &Ctx, bytes: u64, complete: bool) {
        let Some(mut p) = self.pending.pop_front() else { return };
        let h2c = p.resp.as_ref().is_some_and(|r| r.upgrade_h2c && r.signals.status == Some(101));
        if h2c && complete {
            // Not answered yet: the answer comes as HTTP/2 on stream 1.
            p.resp = None;
            p.resp_start = None;
            p.stream_id = Some(1);
            *self.upgraded = Upgraded::H2c(Box::new(p));
            return;
        }
        p.resp_end_ts = Some(ctx.ts_end);
        p.resp_bytes = bytes;
        p.unknown |= !complete;
        if Some(p.seq) == *self.cur_req && !complete {
            *self.cur_req = None;
        }
        self.em.emit(p.into_exchange(self.info, None));
    }

    fn unseen_message(&mut self, ctx: &Ctx) {
        match self.side {
            Side::Request => {
                let seq = self.seq();
                self.push(Pending::unseen(seq, ctx));
            }
            Side::Response => {
                // The oldest request's answer went by unseen.
                if let Some(mut p) = self.pending.pop_front() {
                    p.unknown = true;
                    p.resp_end_ts = Some(ctx.ts_end);
                    self.em.emit(p.into_exchange(self.info, None));
                }
            }
        }
    }

    fn upgraded(&mut self) {
        if matches!(self.upgraded, Upgraded::No) {
            *self.upgraded = Upgraded::Opaque;
        }
    }

    fn truncated(&mut self) {
        self.em.stats.truncations += 1;
    }

    fn parse_error(&mut self) {
        self.em.stats.parse_errors += 1;
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP/2

struct H2Stream {
    p: Pending,
    hasher: BodyHasher,
}

struct H2Conn {
    /// [request side (client → server), response side].
    dirs: [H2Dir; 2],
    streams: HashMap<u32, H2Stream>,
    max_inflight: usize,
}

impl H2Conn {
    #[expect(clippy::too_many_arguments, reason = "one call site; the parts are split borrows of the connection")]
    fn feed(&mut self, is_req: bool, payload: &[u8], gap: u64, ctx: &Ctx, event_start: bool, info: &ConnInfo, em: &mut Emitter<'_>) {
        // The observed process wrote this direction: the client writes requests.
        let written = (info.role == Role::Client) == is_req;
        let H2Conn { dirs, streams, max_inflight } = self;
        let [req, resp] = dirs;
        let dir = if is_req { req } else { resp };
        let mut sink = H2Pairing { side: if is_req { Side::Request } else { Side::Response }, streams, info, max_inflight: *max_inflight, em };
        if event_start {
            dir.event_start(payload, gap == 0, written);
        }
        dir.feed(payload, ctx, &mut sink);
        if gap > 0 {
            dir.gap(gap, ctx, &mut sink);
        }
    }

    fn end(&mut self, kind: EndKind, info: &ConnInfo, em: &mut Emitter<'_>) {
        let mut ids: Vec<u32> = self.streams.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            if let Some(mut s) = self.streams.remove(&id) {
                let started = s.p.response_started();
                if kind == EndKind::Evicted {
                    s.p.unknown = true;
                }
                em.emit(s.p.into_exchange(info, end_failure(info.role, kind, started)));
            }
        }
    }
}

struct H2Pairing<'a, 'b> {
    side: Side,
    streams: &'a mut HashMap<u32, H2Stream>,
    info: &'a ConnInfo,
    max_inflight: usize,
    em: &'a mut Emitter<'b>,
}

impl H2Pairing<'_, '_> {
    fn finish(&mut self, stream: u32, failure: Option<Failure>) {
        if let Some(s) = self.streams.remove(&stream) {
            self.em.emit(s.p.into_exchange(self.info, failure));
        }
    }

    fn stream(&mut self, id: u32, start: &Ctx, unknown: bool) -> &mut H2Stream {
        if !self.streams.contains_key(&id) && self.streams.len() >= self.max_inflight {
            // Bounded: give up the oldest stream rather than grow.
            if let Some(&oldest) = self.streams.keys().min()
                && let Some(mut s) = self.streams.remove(&oldest)
            {
                s.p.unknown = true;
                self.em.emit(s.p.into_exchange(self.info, None));
            }
        }
        self.streams.entry(id).or_insert_with(|| {
            let mut p = Pending::new(u64::from(id), ReqInfo { unknown, ..Default::default() }, start);
            p.no_request = unknown;
            p.stream_id = Some(id);
            H2Stream { p, hasher: BodyHasher::default() }
        })
    }
}

impl H2Sink for H2Pairing<'_, '_> {
    fn headers(&mut self, stream: u32, block: Block, end_stream: bool, start: &Ctx, ctx: &Ctx) {
        match self.side {
            Side::Request => {
                let fresh = !self.streams.contains_key(&stream);
                let s = self.stream(stream, start, false);
                if fresh {
                    match block {
                        Block::Request(req) => s.p.req = req,
                        _ => {
                            s.p.unknown = true;
                            s.p.req.unknown = true;
                        }
                    }
                    s.p.req_start = *start;
                }
                s.p.req_bytes += 9;
                if end_stream {
                    s.p.req_end_ts = ctx.ts_end;
                    s.p.body_hash = s.hasher.finish();
                }
            }
            Side::Response => {
                let seen = self.streams.contains_key(&stream);
                let s = self.stream(stream, start, !seen);
                if !seen {
                    s.p.unknown = true;
                }
                match block {
                    Block::Response(r) => {
                        let interim = r.signals.status.is_some_and(|st| (100..200).contains(&st));
                        match &mut s.p.resp {
                            None if interim => {}
                            None => {
                                s.p.resp = Some(r);
                                s.p.resp_start = Some(*start);
                            }
                            // Trailers: gRPC status and friends.
                            Some(have) => {
                                let sig = &mut have.signals;
                                sig.grpc_status = r.signals.grpc_status.or(sig.grpc_status);
                                sig.retry_after |= r.signals.retry_after;
                                sig.pushback |= r.signals.pushback;
                                sig.ratelimited |= r.signals.ratelimited;
                                have.claim = r.claim.or(have.claim);
                            }
                        }
                    }
                    _ => {
                        s.p.unknown = true;
                        if s.p.resp_start.is_none() {
                            s.p.resp_start = Some(*start);
                        }
                        s.p.resp.get_or_insert_with(|| RespInfo { unknown: true, ..Default::default() });
                    }
                }
                s.p.resp_bytes += 9;
                if end_stream {
                    s.p.resp_end_ts = Some(ctx.ts_end);
                    self.finish(stream, None);
                }
            }
        }
    }

    fn data_bytes(&mut self, stream: u32, bytes: &[u8]) {
        if self.side == Side::Request
            && let Some(s) = self.streams.get_mut(&stream)
        {
            s.hasher.feed(bytes);
        }
    }

    fn data_gap(&mut self, stream: u32) {
        if let Some(s) = self.streams.get_mut(&stream) {
            s.hasher.gap();
        }
    }

    fn data_end(&mut self, stream: u32, len: u64, end_stream: bool, ctx: &Ctx) {
        let Some(s) = self.streams.get_mut(&stream) else { return };
        match self.side {
            Side::Request => {
                s.p.req_bytes += 9 + len;
                if end_stream {
                    s.p.req_end_ts = ctx.ts_end;
                    s.p.body_hash = s.hasher.finish();
                }
            }
            Side::Response => {
                s.p.resp_bytes += 9 + len;
                if s.p.resp_start.is_none() {
                    s.p.resp_start = Some(*ctx);
                }
                if end_stream {
                    s.p.resp_end_ts = Some(ctx.ts_end);
                    self.finish(stream, None);
                }
            }
        }
    }

    fn rst(&mut self, stream: u32, code: u32, ctx: &Ctx) {
        if let Some(s) = self.streams.get_mut(&stream) {
            if s.p.resp_end_ts.is_none() && s.p.resp_start.is_some() {
                s.p.resp_end_ts = Some(ctx.ts_end);
            }
            self.finish(stream, Some(Failure::RstStream(code)));
        }
    }

    fn goaway(&mut self, last_stream: u32, code: u32, _ctx: &Ctx) {
        if self.side != Side::Response {
            return;
        }
        // Client streams above last-stream-id were not (and will not be) processed.
        let mut ids: Vec<u32> = self.streams.keys().copied().filter(|&id| id > last_stream && id % 2 == 1).collect();
        ids.sort_unstable();
        for id in ids {
            self.finish(id, Some(Failure::GoAway(code)));
        }
    }

    fn lost(&mut self, _ctx: &Ctx) {
        // Frames went by unseen: what we know of in-flight streams may be incomplete.
        for s in self.streams.values_mut() {
            s.p.unknown = true;
        }
    }

    fn truncated(&mut self) {
        self.em.stats.truncations += 1;
    }

    fn parse_error(&mut self) {
        self.em.stats.parse_errors += 1;
    }
}

/// A connect that failed: a client exchange with no request (no bytes were exchanged).
pub(crate) fn connect_failure(id: ConnId, pid: u32, tid: u32, tuple: Option<Tuple>, ts: u64, failure: Failure) -> Exchange {
    let ctx = Ctx { ts_start: ts, ts_end: ts, tid, goid: None };
    let info = ConnInfo { id, pid, role: Role::Client, tuple, protocol: Protocol::Opaque };
    let mut p = Pending::new(0, ReqInfo::default(), &ctx);
    p.req.markers = RetryMarkers::default();
    p.into_exchange(&info, Some(failure))
}

#[cfg(test)]
mod close_tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]
    use super::super::tests::{conn_ev, data, run};
    use crate::{
        capture::{ConnEventKind, Direction, Role},
        l7::{Failure, OutcomeClass},
    };

    /// urllib's shape: status line and headers read, then the client closes without the body.
    #[test]
    fn client_close_after_error_head_keeps_the_status_outcome() {
        let (xs, _) = run(&[
            conn_ev(3, Role::Client, 1, ConnEventKind::Connect { errno: 0 }),
            data(3, Role::Client, Direction::Egress, 10, b"GET /b HTTP/1.1\r\nHost: b\r\n\r\n"),
            data(3, Role::Client, Direction::Ingress, 20, b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 1\r\n\r\n"),
            conn_ev(3, Role::Client, 30, ConnEventKind::Close),
        ]);
        assert_eq!(xs.len(), 1);
        assert_eq!(xs[0].status, Some(503));
        assert_eq!(xs[0].outcome, OutcomeClass::Transient);
        assert_eq!(xs[0].failure, None);
    }

    /// Without a status line the client's close is still an abandonment.
    #[test]
    fn client_close_before_any_head_is_abandoned() {
        let (xs, _) = run(&[
            conn_ev(3, Role::Client, 1, ConnEventKind::Connect { errno: 0 }),
            data(3, Role::Client, Direction::Egress, 10, b"GET /b HTTP/1.1\r\nHost: b\r\n\r\n"),
            conn_ev(3, Role::Client, 30, ConnEventKind::Close),
        ]);
        assert_eq!(xs.len(), 1);
        assert_eq!(xs[0].failure, Some(Failure::Abandoned));
        assert_eq!(xs[0].outcome, OutcomeClass::Unknown);
    }
}
