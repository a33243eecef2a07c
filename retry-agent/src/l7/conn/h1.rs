//! HTTP/1 on one connection: the two directions' parsers and FIFO pairing of requests with
//! responses (pipelining bounded by `max_inflight`), upgrades (opaque, or h2c: stream 1).
use std::collections::VecDeque;

use super::{
    super::{
        exchange::Method,
        http1::{Answering, H1Parser, H1Sink, Side},
        msg::{Ctx, ReqInfo, RespInfo},
    },
    ConnInfo, Emitter,
    pending::{EndKind, Pending, end_failure, ended_at},
};

pub(super) struct H1Conn {
    pub(super) req: H1Parser,
    pub(super) resp: H1Parser,
    pub(super) pending: VecDeque<Pending>,
    pub(super) next_seq: u64,
    /// The request the request parser is reading.
    pub(super) cur_req: Option<u64>,
}

impl H1Conn {
    pub(super) fn new(req: H1Parser, resp: H1Parser) -> Self {
        H1Conn {
            req,
            resp,
            pending: VecDeque::new(),
            next_seq: 0,
            cur_req: None,
        }
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "one call site; the parts are split borrows of the connection"
    )]
    /// Returns the upgraded request when the connection switched to HTTP/2 (h2c), whose response
    /// comes on stream 1, and how many bytes at the end of `payload` are already HTTP/2.
    pub(super) fn feed(
        &mut self,
        is_req: bool,
        payload: &[u8],
        gap: u64,
        ctx: &Ctx,
        event_start: bool,
        info: &ConnInfo,
        max_inflight: usize,
        em: &mut Emitter<'_>,
    ) -> Option<(Pending, usize)> {
        let H1Conn {
            req,
            resp,
            pending,
            next_seq,
            cur_req,
        } = self;
        let mut upgraded = Upgraded::No;
        let mut sink = H1Pairing {
            side: if is_req {
                Side::Request
            } else {
                Side::Response
            },
            pending,
            next_seq,
            cur_req,
            info,
            max_inflight,
            em,
            upgraded: &mut upgraded,
        };
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

    pub(super) fn end(&mut self, kind: EndKind, ctx: &Ctx, info: &ConnInfo, em: &mut Emitter<'_>) {
        let H1Conn {
            req: _,
            resp,
            pending,
            next_seq,
            cur_req,
        } = self;
        if kind == EndKind::Close {
            let mut upgraded = Upgraded::No;
            let mut sink = H1Pairing {
                side: Side::Response,
                pending,
                next_seq,
                cur_req,
                info,
                max_inflight: usize::MAX,
                em,
                upgraded: &mut upgraded,
            };
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
            p.conn_ended = ended_at(kind, ctx);
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
            self.em.stats.evictions_inflight += 1;
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
        self.em.request_read(self.info, start);
        self.push(Pending::new(seq, req, start));
    }

    fn request_end(&mut self, ctx: &Ctx, body_hash: Option<u64>, bytes: u64, complete: bool) {
        let Some(seq) = self.cur_req.take() else {
            return;
        };
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
        let Some(p) = self.pending.front_mut() else {
            return Answering::default();
        };
        p.resp = Some(resp);
        p.resp_start = Some(*start);
        Answering {
            head: p.req.method == Some(Method::Head),
            connect: p.req.method == Some(Method::Connect),
        }
    }

    fn response_end(&mut self, ctx: &Ctx, bytes: u64, complete: bool) {
        let Some(mut p) = self.pending.pop_front() else {
            return;
        };
        let h2c = p
            .resp
            .as_ref()
            .is_some_and(|r| r.upgrade_h2c && r.signals.status == Some(101));
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
