//! One connection: protocol detection, the two directions' parsers, and the pairing of
//! requests with responses (FIFO for HTTP/1, by stream for HTTP/2).
//!
//! Split by concern: this file detects the protocol and routes bytes; `pending` is a request
//! in flight and how it becomes an exchange; `h1` and `h2` pair requests with responses.
mod detect;
mod h1;
mod h2;
mod inbound;
mod pending;

use crate::capture::{ConnId, DataEvent, Direction, Role, SummaryEvent, Syscall, Tuple};

use super::{
    L7Stats,
    classify::Signals,
    exchange::{Exchange, ExchangeId, Protocol},
    http1::{self, H1Parser, Side},
    http2::{self, H2Dir, PREFACE},
    msg::{Ctx, ReqInfo, RespInfo},
    util::Routes,
};
use detect::DetectDir;
use h1::H1Conn;
use h2::{H2Conn, Streams};
pub(crate) use inbound::InboundByThread;
use pending::Pending;
pub(crate) use pending::{EndKind, connect_failure};

/// Where completed exchanges go: numbered in emission order and counted; a server's requests
/// are also followed per thread from read to answer ([`InboundByThread`]).
pub(crate) struct Emitter<'a> {
    pub out: &'a mut Vec<Exchange>,
    pub stats: &'a mut L7Stats,
    pub next_id: &'a mut u64,
    pub inbound: &'a mut InboundByThread,
    /// Per (pid, goroutine context): when a Go probe last bound a server stream to it.
    pub handlers: &'a mut HandlerStarts,
    pub routes: &'a mut Routes,
}

/// When each Go request goroutine last took a server stream (gRPC-go's handleStream): the
/// stream it served before was over by then. Bounded: cleared when full (an exchange then
/// keeps its wire end, as without the probes).
#[derive(Default)]
pub(crate) struct HandlerStarts(foldhash::HashMap<(u32, u64), u64>);

impl HandlerStarts {
    const MAX: usize = 65536;

    pub(crate) fn started(&mut self, pid: u32, context: u64, ts: u64) {
        if self.0.len() >= Self::MAX {
            self.0.clear();
        }
        let t = self.0.entry((pid, context)).or_insert(ts);
        *t = (*t).max(ts);
    }

    pub(crate) fn forget_pid(&mut self, pid: u32) {
        self.0.retain(|(p, _), _| *p != pid);
    }
}

impl Emitter<'_> {
    /// A request head arrived on a connection of `info`, read by `start.tid`.
    pub(crate) fn request_read(&mut self, info: &ConnInfo, start: &Ctx) {
        if info.role == Role::Server {
            self.inbound.read(
                info.pid,
                start.tid,
                info.id,
                start.ts_start,
                start.interleaved,
            );
        }
    }

    pub(crate) fn emit(&mut self, mut ex: Exchange) {
        ex.route = ex.path.as_deref().map(|p| self.routes.route(p));
        if let (Some(start), Some(ctx)) = (ex.handler_start_ns, ex.goid)
            && let Some(&next) = self.handlers.0.get(&(ex.pid, ctx))
            && next > start
        {
            ex.handler_end_ns = Some(next);
        }
        if ex.tally {
            // Counts, not an exchange: no thread read it here, nothing answers it.
            self.stats.counted_exchanges += u64::from(ex.weight);
            ex.id = ExchangeId(*self.next_id);
            *self.next_id += 1;
            self.out.push(ex);
            return;
        }
        self.stats.counted_exchanges += u64::from(ex.weight.saturating_sub(1));
        if ex.role == Role::Server {
            ex.sole_on_thread =
                self.inbound
                    .answer(ex.pid, ex.tid, ex.conn, ex.request_start_ns, ex.end_ns());
        }
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
    /// When the reassembler last moved it to the recent end of its table.
    pub(crate) promoted_ts: u64,
    proto: Proto,
    cap: usize,
    max_inflight: usize,
    /// TLS plaintext has been seen (from the TLS library's probes): only that is parsed from
    /// now on; the connection's syscall bytes are ciphertext.
    tls: bool,
}

/// The context of one record's bytes: a write's start is its call's entry (the process began
/// sending), a read's its exit (the bytes had arrived).
fn ctx_of(d: &DataEvent) -> Ctx {
    Ctx {
        ts_start: match d.direction {
            Direction::Egress => d.ts_enter_ns,
            Direction::Ingress => d.ts_exit_ns,
        },
        ts_end: d.ts_exit_ns,
        tid: d.tid,
        goid: d.goid,
        interleaved: d.interleaved,
    }
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

impl Conn {
    pub(crate) fn new(
        id: ConnId,
        pid: u32,
        role: Role,
        tuple: Option<Tuple>,
        fresh: bool,
        cap: usize,
        max_inflight: usize,
    ) -> Self {
        Conn {
            info: ConnInfo {
                id,
                pid,
                role,
                tuple,
                protocol: Protocol::Opaque,
            },
            req_dir: req_dir_of(role),
            fresh,
            probes: 0,
            last_ts: 0,
            promoted_ts: 0,
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

    /// A Go probe bound HTTP/2 stream `id` to a request context; whether the connection is
    /// HTTP/2 (anything else has no streams to bind: the binding is dropped).
    pub(crate) fn bind_stream(&mut self, id: u32, context: u64, ts: u64) -> bool {
        match &mut self.proto {
            Proto::Http2(h) => {
                h.bind(id, context, ts);
                true
            }
            _ => false,
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
        let ctx = ctx_of(d);
        let payload = d
            .payload
            .get(
                ..d.payload
                    .len()
                    .min(usize::try_from(d.len).unwrap_or(usize::MAX)),
            )
            .unwrap_or_default();
        let gap = d.len.saturating_sub(payload.len() as u64);
        if let Proto::Undetected(_) = self.proto {
            self.detect(d.direction, payload, gap, &ctx, em);
            return;
        }
        self.feed(d.direction, payload, gap, &ctx, true, em);
    }

    /// A quiet exchange the kernel summarised: the exchange its request line and status make.
    /// The kernel sends one only between whole messages of an HTTP/1 connection (it held the
    /// request, and anything else of the connection would have sent it first), so the
    /// connection's parsers are left as they are.
    pub(crate) fn summary(&mut self, s: &SummaryEvent, em: &mut Emitter<'_>) {
        let (req, resp) = (&s.request, &s.response);
        self.last_ts = self.last_ts.max(resp.ts_exit_ns);
        self.set_tuple(req.tuple);
        let info = ConnInfo {
            protocol: Protocol::Http1,
            ..self.info
        };
        let head = match http1::summarised_request(&req.payload) {
            Some(head) => head,
            // A tally whose connection's entry names no request (what the kernel read into it
            // last did not start one): its counts still count, on no route.
            None if s.is_tally() && req.payload.is_empty() => ReqInfo::default(),
            None => {
                em.stats.parse_errors += 1;
                return;
            }
        };
        let (req_ctx, resp_ctx) = (ctx_of(req), ctx_of(resp));
        let mut p = Pending::new(0, head, &req_ctx);
        p.req_bytes = req.len;
        p.resp = Some(RespInfo {
            signals: Signals {
                status: Some(s.status),
                ..Signals::default()
            },
            ..RespInfo::default()
        });
        p.resp_start = Some(resp_ctx);
        p.resp_end_ts = Some(resp.ts_exit_ns);
        p.resp_bytes = resp.len;
        let mut ex = p.into_exchange(&info, None);
        ex.weight = s.weight;
        if s.is_tally() {
            // Quiet exchanges the kernel counted: its request is the connection's last held
            // one, which names the route they were on; each had a 2xx/3xx status, none of
            // which it says.
            ex.tally = true;
            ex.status = None;
            ex.outcome = crate::l7::OutcomeClass::Success;
            ex.failure = None;
            ex.unknown = false;
        } else {
            em.request_read(&info, &req_ctx);
            em.stats.summarised_exchanges += 1;
        }
        em.emit(ex);
    }

    fn feed(
        &mut self,
        dir: Direction,
        payload: &[u8],
        gap: u64,
        ctx: &Ctx,
        event_start: bool,
        em: &mut Emitter<'_>,
    ) {
        let is_req = self.req_dir == Some(dir);
        let info = self.info;
        match &mut self.proto {
            Proto::Undetected(_) => {}
            Proto::Opaque => em.stats.opaque_bytes += payload.len() as u64 + gap,
            Proto::Http1(h) => {
                if let Some((stream1, left)) = h.feed(
                    is_req,
                    payload,
                    gap,
                    ctx,
                    event_start,
                    &info,
                    self.max_inflight,
                    em,
                ) {
                    self.switch_to_h2c(stream1);
                    // The server's first frames may share the write of its 101.
                    let tail = payload
                        .get(payload.len().saturating_sub(left)..)
                        .unwrap_or_default();
                    if !tail.is_empty() {
                        self.feed(dir, tail, 0, ctx, true, em);
                    }
                }
            }
            Proto::Http2(h) => h.feed(is_req, payload, gap, ctx, event_start, &info, em),
        }
    }

    /// After `101 Switching Protocols` with `Upgrade: h2c`: the client sends the HTTP/2 preface
    /// next, the server answers the upgraded request on stream 1.
    fn switch_to_h2c(&mut self, stream1: Pending) {
        self.info.protocol = Protocol::Http2;
        let req = H2Dir::new(Side::Request, true, true, self.cap);
        let resp = H2Dir::new(Side::Response, false, true, self.cap);
        self.proto = Proto::Http2(Box::new(H2Conn::new(
            [req, resp],
            Streams::with(1, stream1),
            self.max_inflight,
        )));
    }

    /// The connection ended: finish what a close finishes, fail what is still in flight.
    pub(crate) fn end(&mut self, kind: EndKind, ctx: &Ctx, em: &mut Emitter<'_>) {
        let info = self.info;
        match &mut self.proto {
            Proto::Http1(h) => h.end(kind, ctx, &info, em),
            Proto::Http2(h) => h.end(kind, ctx, &info, em),
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
            data(
                3,
                Role::Client,
                Direction::Egress,
                10,
                b"GET /b HTTP/1.1\r\nHost: b\r\n\r\n",
            ),
            data(
                3,
                Role::Client,
                Direction::Ingress,
                20,
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 1\r\n\r\n",
            ),
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
            data(
                3,
                Role::Client,
                Direction::Egress,
                10,
                b"GET /b HTTP/1.1\r\nHost: b\r\n\r\n",
            ),
            conn_ev(3, Role::Client, 30, ConnEventKind::Close),
        ]);
        assert_eq!(xs.len(), 1);
        assert_eq!(xs[0].failure, Some(Failure::Abandoned));
        assert_eq!(xs[0].outcome, OutcomeClass::Unknown);
        assert_eq!(xs[0].ended_ns, Some(30));
    }

    /// A server that drops a request it never answered (its caller gave up first): the request
    /// was in flight until the close, which its last byte on the wire does not say.
    #[test]
    fn a_request_cut_off_by_the_close_ends_with_it() {
        let (xs, _) = run(&[
            conn_ev(3, Role::Server, 1, ConnEventKind::Accept),
            data(
                3,
                Role::Server,
                Direction::Ingress,
                10,
                b"GET /b HTTP/1.1\r\nHost: b\r\n\r\n",
            ),
            conn_ev(3, Role::Server, 3_000, ConnEventKind::Close),
        ]);
        assert_eq!(xs.len(), 1);
        assert!(xs[0].request_end_ns < 3_000, "{:?}", xs[0]);
        assert_eq!(xs[0].ended_ns, Some(3_000));
    }
}
