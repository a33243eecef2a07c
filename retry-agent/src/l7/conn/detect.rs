//! How a connection learns its protocol: the first bytes of each direction are held (up to
//! `DETECT_BYTES`) and guessed from (`guess`); once a protocol is decided its parsers start and
//! what both directions held is replayed into them.
use super::*;

/// Syscall boundaries a connection of unknown start gets to show a message start before it
/// is taken for a non-HTTP protocol.
const MAX_PROBES: u32 = 16;
/// Bytes held per direction while the protocol is undecided (the HTTP/2 preface is 24).
const DETECT_BYTES: usize = 64;

#[derive(Default)]
pub(super) struct DetectDir {
    pub(super) buf: Vec<u8>,
    first: Ctx,
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
    /// Undetected: hold or guess from the direction's first bytes; once a protocol is decided,
    /// start its parsers and replay what both directions held.
    pub(super) fn detect(
        &mut self,
        dir: Direction,
        payload: &[u8],
        gap: u64,
        ctx: &Ctx,
        em: &mut Emitter<'_>,
    ) {
        let Some((g, held)) = self.sniff(dir, payload, gap, ctx, em) else {
            return;
        };
        let Some((proto, req_dir)) = self.protocol_of(g, dir) else {
            return;
        };
        if self.req_dir.is_some_and(|r| r != req_dir) {
            // The bytes contradict the role the kernel reported: do not parse them as HTTP.
            self.proto = Proto::Opaque;
            return;
        }
        let Proto::Undetected(dirs) = std::mem::replace(&mut self.proto, Proto::Opaque) else {
            return;
        };
        let first = if held.is_empty() {
            *ctx
        } else {
            dirs[dir_index(dir)].first
        };
        self.start(proto, req_dir, g, dir);
        self.replay(dir, dirs, &held, &first, payload, gap, ctx, em);
    }

    /// Adds this event's first bytes to what the direction holds and guesses. `None` when
    /// undecided (the bytes are held for the next event) or when this direction gave no message
    /// start (a probe used up; opaque once they run out). Otherwise the guess and the bytes held
    /// before this event.
    fn sniff(
        &mut self,
        dir: Direction,
        payload: &[u8],
        gap: u64,
        ctx: &Ctx,
        em: &mut Emitter<'_>,
    ) -> Option<(Guess, Vec<u8>)> {
        let Proto::Undetected(dirs) = &mut self.proto else {
            return None;
        };
        let det = &mut dirs[dir_index(dir)];
        let at_event_start = det.buf.is_empty();
        let mut cand = std::mem::take(&mut det.buf);
        let prior = cand.len();
        cand.extend_from_slice(
            payload
                .get(..payload.len().min(DETECT_BYTES))
                .unwrap_or_default(),
        );
        let mut g = guess(&cand, self.fresh);
        if g == Guess::No
            && at_event_start
            && gap == 0
            && !self.fresh
            && http2::is_frame_run(payload)
        {
            g = Guess::Http2Mid;
        }
        match g {
            Guess::NotYet if gap == 0 && cand.len() < DETECT_BYTES => {
                if prior == 0 {
                    det.first = *ctx;
                }
                det.buf = cand;
                None
            }
            Guess::NotYet | Guess::No => {
                det.buf.clear();
                self.probes += 1;
                if self.fresh || self.probes >= MAX_PROBES {
                    self.proto = Proto::Opaque;
                    em.stats.opaque_bytes += payload.len() as u64 + gap + prior as u64;
                }
                None
            }
            _ => {
                cand.truncate(prior);
                Some((g, cand))
            }
        }
    }

    /// The protocol a guess names and the direction that carries requests (`None`: not
    /// decidable from this guess).
    fn protocol_of(&mut self, g: Guess, dir: Direction) -> Option<(Protocol, Direction)> {
        Some(match g {
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
                    return None;
                }
            },
            Guess::NotYet | Guess::No => return None,
        })
    }

    /// Starts the parsers of the decided protocol. `dir` (whose bytes decided) starts at a
    /// message start; the other direction may join mid-stream unless the connection is fresh.
    fn start(&mut self, proto: Protocol, req_dir: Direction, g: Guess, dir: Direction) {
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
                    (
                        H2Dir::new(Side::Request, false, false, self.cap),
                        H2Dir::new(Side::Response, false, false, self.cap),
                    )
                } else if mid {
                    (
                        H2Dir::new_lost(Side::Request, self.cap),
                        H2Dir::new(Side::Response, false, hpack_ok, self.cap),
                    )
                } else {
                    (
                        H2Dir::new(Side::Request, preface, hpack_ok, self.cap),
                        H2Dir::new(Side::Response, false, hpack_ok, self.cap),
                    )
                };
                Proto::Http2(Box::new(H2Conn::new(
                    [req, resp],
                    Streams::default(),
                    self.max_inflight,
                )))
            }
            _ => {
                let mk = |side| {
                    if mid {
                        H1Parser::new_lost(side, self.cap)
                    } else {
                        H1Parser::new(side, self.cap)
                    }
                };
                let mut h = H1Conn::new(mk(Side::Request), mk(Side::Response));
                // The direction that decided starts at a message start.
                let decided = if dir == req_dir {
                    &mut h.req
                } else {
                    &mut h.resp
                };
                *decided = H1Parser::new(
                    if dir == req_dir {
                        Side::Request
                    } else {
                        Side::Response
                    },
                    self.cap,
                );
                Proto::Http1(Box::new(h))
            }
        };
    }

    /// Replays what the other direction held, then this direction's held bytes and event.
    #[expect(
        clippy::too_many_arguments,
        reason = "one call site; the event and what detection held"
    )]
    fn replay(
        &mut self,
        dir: Direction,
        mut dirs: [DetectDir; 2],
        held: &[u8],
        first: &Ctx,
        payload: &[u8],
        gap: u64,
        ctx: &Ctx,
        em: &mut Emitter<'_>,
    ) {
        let o = std::mem::take(&mut dirs[dir_index(other(dir))]);
        if !o.buf.is_empty() {
            self.feed(other(dir), &o.buf, 0, &o.first, true, em);
        }
        if !held.is_empty() {
            self.feed(dir, held, 0, first, true, em);
            self.feed(dir, payload, gap, ctx, false, em);
        } else {
            self.feed(dir, payload, gap, ctx, true, em);
        }
    }
}
