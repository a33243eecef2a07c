//! HTTP/2 on one connection: the two directions' frame readers and pairing by stream (streams
//! bounded by `max_inflight`), trailers, RST_STREAM and GOAWAY.
use foldhash::HashMap;

use crate::capture::Role;

use super::{
    super::{
        exchange::Failure,
        http1::Side,
        http2::{Block, H2Dir, H2Sink},
        msg::{Ctx, ReqInfo, RespInfo},
        util::BodyHasher,
    },
    ConnInfo, Emitter,
    pending::{EndKind, Pending, end_failure, ended_at},
};

pub(super) struct H2Stream {
    pub(super) p: Pending,
    pub(super) hasher: BodyHasher,
}

impl H2Stream {
    fn new(p: Pending) -> Self {
        H2Stream {
            p,
            hasher: BodyHasher::default(),
        }
    }
}

/// Finished streams' boxes a connection keeps for its next streams.
const MAX_SPARE: usize = 32;

/// A connection's streams in flight, by id. Boxed, and a finished stream's box is kept for the
/// next: a stream (~400 bytes) is written in place and its `Pending` taken once, at its end,
/// where a map of values copied the whole stream in at its HEADERS and out at its end, then
/// again into the exchange (a fifth of gRPC's reassembly time in `cargo xtask bench l7`).
#[derive(Default)]
pub(super) struct Streams {
    live: HashMap<u32, Box<H2Stream>>,
    /// Boxes of finished streams, at most `MAX_SPARE` (the map of values this replaced kept
    /// room for as many streams as were ever in flight at once, a box's worth each). Boxes, not
    /// values: one moves into `live` as a pointer.
    #[expect(clippy::vec_box, reason = "the boxes are what is reused")]
    spare: Vec<Box<H2Stream>>,
}

impl Streams {
    /// A table holding `first` (an upgraded HTTP/1 request, stream 1).
    pub(super) fn with(id: u32, p: Pending) -> Self {
        let mut s = Streams::default();
        s.get_or_insert(id, || p);
        s
    }

    pub(super) fn len(&self) -> usize {
        self.live.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    pub(super) fn contains(&self, id: u32) -> bool {
        self.live.contains_key(&id)
    }

    pub(super) fn get_mut(&mut self, id: u32) -> Option<&mut H2Stream> {
        self.live.get_mut(&id).map(|b| &mut **b)
    }

    pub(super) fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.live.keys().copied()
    }

    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut H2Stream> {
        self.live.values_mut().map(|b| &mut **b)
    }

    /// Stream `id`, made by `new` if it is not in flight.
    fn get_or_insert(&mut self, id: u32, new: impl FnOnce() -> Pending) -> &mut H2Stream {
        let Streams { live, spare } = self;
        live.entry(id).or_insert_with(|| {
            let s = H2Stream::new(new());
            match spare.pop() {
                Some(mut b) => {
                    *b = s;
                    b
                }
                None => Box::new(s),
            }
        })
    }

    /// Take stream `id` out of flight; `f` reads it before its box goes to the spares.
    fn remove_with<R>(&mut self, id: u32, f: impl FnOnce(&mut H2Stream) -> R) -> Option<R> {
        let mut b = self.live.remove(&id)?;
        let r = f(&mut b);
        if self.spare.len() < MAX_SPARE {
            self.spare.push(b);
        }
        Some(r)
    }
}

pub(super) struct H2Conn {
    /// [request side (client → server), response side].
    pub(super) dirs: [H2Dir; 2],
    pub(super) streams: Streams,
    pub(super) max_inflight: usize,
    /// Bindings of streams not seen yet (a client stream's id is bound on the caller's
    /// goroutine while the writer goroutine may still be sending its HEADERS), oldest first,
    /// at most `max_inflight`.
    pub(super) early: Vec<(u32, (u64, u64))>,
    pub(super) writers: Writers,
}

/// Client side: which threads write the connection's streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Writers {
    /// The thread that wrote every stream in flight (None: none in flight yet).
    One(Option<u32>),
    /// A stream was written by one thread while another thread's was in flight (sticky): no
    /// stream's writer thread is evidence of its caller any more.
    Multiplexed,
}

impl H2Conn {
    pub(super) fn new(dirs: [H2Dir; 2], streams: Streams, max_inflight: usize) -> Self {
        H2Conn {
            dirs,
            streams,
            max_inflight,
            early: Vec::new(),
            writers: Writers::One(None),
        }
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "one call site; the parts are split borrows of the connection"
    )]
    pub(super) fn feed(
        &mut self,
        is_req: bool,
        payload: &[u8],
        gap: u64,
        ctx: &Ctx,
        event_start: bool,
        info: &ConnInfo,
        em: &mut Emitter<'_>,
    ) {
        // The observed process wrote this direction: the client writes requests.
        let written = (info.role == Role::Client) == is_req;
        let H2Conn {
            dirs,
            streams,
            max_inflight,
            early,
            writers,
        } = self;
        let [req, resp] = dirs;
        let dir = if is_req { req } else { resp };
        let mut sink = H2Pairing {
            side: if is_req {
                Side::Request
            } else {
                Side::Response
            },
            streams,
            early,
            writers,
            info,
            max_inflight: *max_inflight,
            em,
        };
        if event_start {
            dir.event_start(payload, gap == 0, written);
        }
        dir.feed(payload, ctx, &mut sink);
        if gap > 0 {
            dir.gap(gap, ctx, &mut sink);
        }
    }

    /// A Go probe says stream `id` serves request context `context` since `ts`.
    pub(super) fn bind(&mut self, id: u32, context: u64, ts: u64) {
        if let Some(s) = self.streams.get_mut(id) {
            s.p.bound = Some((context, ts));
            return;
        }
        if self.early.len() >= self.max_inflight {
            self.early.remove(0);
        }
        self.early.push((id, (context, ts)));
    }

    pub(super) fn end(&mut self, kind: EndKind, ctx: &Ctx, info: &ConnInfo, em: &mut Emitter<'_>) {
        let mut ids: Vec<u32> = self.streams.ids().collect();
        ids.sort_unstable();
        let writers = self.writers;
        for id in ids {
            self.streams.remove_with(id, |s| {
                let started = s.p.response_started();
                if kind == EndKind::Evicted {
                    s.p.unknown = true;
                }
                let failure = end_failure(info.role, kind, started);
                s.p.conn_ended = ended_at(kind, ctx);
                emit(em, info, writers, &mut s.p, failure);
            });
        }
    }
}

/// A stream's exchange, told whether its connection's writer threads are evidence of callers.
fn emit(
    em: &mut Emitter<'_>,
    info: &ConnInfo,
    writers: Writers,
    p: &mut Pending,
    failure: Option<Failure>,
) {
    let mut x = p.take_exchange(info, failure);
    x.threads_multiplexed = writers == Writers::Multiplexed && info.role == Role::Client;
    em.emit(x);
}

struct H2Pairing<'a, 'b> {
    side: Side,
    streams: &'a mut Streams,
    early: &'a mut Vec<(u32, (u64, u64))>,
    writers: &'a mut Writers,
    info: &'a ConnInfo,
    max_inflight: usize,
    em: &'a mut Emitter<'b>,
}

impl H2Pairing<'_, '_> {
    fn finish(&mut self, stream: u32, failure: Option<Failure>) {
        let (em, info, writers) = (&mut *self.em, self.info, *self.writers);
        self.streams
            .remove_with(stream, |s| emit(em, info, writers, &mut s.p, failure));
    }

    fn stream(&mut self, id: u32, start: &Ctx, unknown: bool) -> &mut H2Stream {
        if !self.streams.contains(id) && self.streams.len() >= self.max_inflight {
            // Bounded: give up the oldest stream rather than grow.
            if let Some(oldest) = self.streams.ids().min() {
                let (em, info, writers) = (&mut *self.em, self.info, *self.writers);
                self.streams.remove_with(oldest, |s| {
                    s.p.unknown = true;
                    em.stats.evictions_inflight += 1;
                    emit(em, info, writers, &mut s.p, None);
                });
            }
        }
        let H2Pairing {
            streams,
            early,
            info,
            em,
            ..
        } = self;
        streams.get_or_insert(id, || {
            if !unknown {
                em.request_read(info, start);
            }
            let mut p = Pending::new(
                u64::from(id),
                ReqInfo {
                    unknown,
                    ..Default::default()
                },
                start,
            );
            p.no_request = unknown;
            p.stream_id = Some(id);
            if let Some(i) = early.iter().position(|&(s, _)| s == id) {
                p.bound = Some(early.remove(i).1);
            }
            p
        })
    }

    /// A request's HEADERS (or its trailers): the request itself on a new stream.
    fn request_headers(
        &mut self,
        stream: u32,
        block: Block,
        end_stream: bool,
        start: &Ctx,
        ctx: &Ctx,
    ) {
        let fresh = !self.streams.contains(stream);
        // One comparison, not a walk of the streams in flight: while not multiplexed they were
        // all written by one thread.
        if fresh
            && self.info.role == Role::Client
            && let Writers::One(solo) = *self.writers
        {
            *self.writers = if self.streams.is_empty() {
                Writers::One(Some(start.tid))
            } else if solo != Some(start.tid) {
                Writers::Multiplexed
            } else {
                Writers::One(solo)
            };
        }
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

    /// A response's HEADERS: the head (interim 1xx skipped), or trailers merged into it.
    fn response_headers(
        &mut self,
        stream: u32,
        block: Block,
        end_stream: bool,
        start: &Ctx,
        ctx: &Ctx,
    ) {
        let seen = self.streams.contains(stream);
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
                        if r.unknown && r.signals.grpc_status.is_none() {
                            // Trailers not all read (a table partly unknown): the gRPC status
                            // they carried may have been a failure the head's 200 hides.
                            have.unknown = true;
                            if sig.grpc_status.is_none() && sig.status.is_some_and(|st| st < 400) {
                                sig.status = None;
                            }
                        }
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
                s.p.resp.get_or_insert_with(|| RespInfo {
                    unknown: true,
                    ..Default::default()
                });
            }
        }
        s.p.resp_bytes += 9;
        if end_stream {
            s.p.resp_end_ts = Some(ctx.ts_end);
            self.finish(stream, None);
        }
    }
}

impl H2Sink for H2Pairing<'_, '_> {
    fn headers(&mut self, stream: u32, block: Block, end_stream: bool, start: &Ctx, ctx: &Ctx) {
        match self.side {
            Side::Request => self.request_headers(stream, block, end_stream, start, ctx),
            Side::Response => self.response_headers(stream, block, end_stream, start, ctx),
        }
    }

    fn data_bytes(&mut self, stream: u32, bytes: &[u8]) {
        if self.side == Side::Request
            && let Some(s) = self.streams.get_mut(stream)
        {
            s.hasher.feed(bytes);
        }
    }

    fn data_gap(&mut self, stream: u32) {
        if let Some(s) = self.streams.get_mut(stream) {
            s.hasher.gap();
        }
    }

    fn data_end(&mut self, stream: u32, len: u64, end_stream: bool, ctx: &Ctx) {
        let Some(s) = self.streams.get_mut(stream) else {
            return;
        };
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
        if let Some(s) = self.streams.get_mut(stream) {
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
        let mut ids: Vec<u32> = self
            .streams
            .ids()
            .filter(|&id| id > last_stream && id % 2 == 1)
            .collect();
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
