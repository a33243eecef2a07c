//! HTTP/1.0 and 1.1: one parser per direction that follows message boundaries through captured
//! prefixes. Bodies are skipped by counting (Content-Length, chunk sizes), never by scanning for
//! what looks like the next message; a gap (uncaptured bytes) where framing is needed loses sync
//! until a later syscall starts with a message start.
mod head;

pub(crate) use head::{could_start_request, find_head_end, looks_like_start};
use head::{parse_request_head, parse_response_head};

/// A request a kernel summary held (its head, and a body that came with it): what a whole
/// request's head gives (method, path, query digest, authority, trace id, retry markers);
/// `None` when it is not a request.
pub(crate) fn summarised_request(bytes: &[u8]) -> Option<super::msg::ReqInfo> {
    match find_head_end(bytes, 0) {
        Some(end) => parse_request_head(bytes.get(..end)?, true),
        // The kernel holds what the client wrote in one call: a head cut there is read as far
        // as it goes.
        None => parse_request_head(bytes, false),
    }
    .map(|(req, _, _)| req)
}

use super::{
    msg::{Ctx, ReqInfo, RespInfo},
    util::BodyHasher,
};

/// Which messages a parser reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Request,
    Response,
}

/// What the response being framed answers (the pending request at the head of the queue).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Answering {
    pub head: bool,
    pub connect: bool,
}

/// The connection's half of the conversation with a parser.
pub(crate) trait H1Sink {
    /// A request head was read; `start` is the syscall of its first byte.
    fn request_head(&mut self, req: ReqInfo, start: &Ctx);
    /// The request's last byte was read (`complete` false: its end was lost in a gap).
    fn request_end(&mut self, ctx: &Ctx, body_hash: Option<u64>, bytes: u64, complete: bool);
    /// A final response head (status >= 200, or 101) was read. Returns what it answers.
    fn response_head(&mut self, resp: RespInfo, start: &Ctx) -> Answering;
    /// The response's last byte was read (`complete` false: lost in a gap).
    fn response_end(&mut self, ctx: &Ctx, bytes: u64, complete: bool);
    /// A whole message went by unseen (it started inside a gap).
    fn unseen_message(&mut self, ctx: &Ctx);
    /// The connection switched protocols (101, CONNECT): stop parsing both directions.
    fn upgraded(&mut self);
    fn truncated(&mut self);
    fn parse_error(&mut self);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Between messages.
    Idle,
    /// Reading a head (bytes in `buf`).
    Head,
    /// Counting a Content-Length body.
    Body {
        remaining: u64,
    },
    /// Reading a chunk-size line (in `buf`).
    ChunkSize,
    ChunkData {
        remaining: u64,
    },
    /// The CRLF after chunk data.
    ChunkEnd,
    /// Trailer lines after the last chunk, up to an empty line.
    Trailers,
    /// Response body delimited by the connection's close.
    UntilClose,
    /// Protocol switched: count only.
    Upgraded,
    /// Out of sync: wait for a syscall that starts with a message start.
    Lost,
}

/// How the body after a head is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    Length(u64),
    Chunked,
    UntilClose,
    Upgrade,
}

/// Longest chunk-size or trailer line accepted.
const MAX_LINE: usize = 4096;

pub(crate) struct H1Parser {
    side: Side,
    state: State,
    buf: Vec<u8>,
    cap: usize,
    start: Ctx,
    msg_bytes: u64,
    hasher: BodyHasher,
    /// Request sent `Expect: 100-continue` and no body byte has been seen yet.
    expect_waiting: bool,
}

impl H1Parser {
    pub(crate) fn new(side: Side, cap: usize) -> Self {
        H1Parser {
            side,
            state: State::Idle,
            buf: Vec::new(),
            cap: cap.max(64),
            start: Ctx::default(),
            msg_bytes: 0,
            hasher: BodyHasher::default(),
            expect_waiting: false,
        }
    }

    /// A parser that starts out of sync (capture began mid-stream).
    pub(crate) fn new_lost(side: Side, cap: usize) -> Self {
        let mut p = Self::new(side, cap);
        p.state = State::Lost;
        p
    }

    pub(crate) fn set_upgraded(&mut self) {
        self.state = State::Upgraded;
        self.buf = Vec::new();
    }

    /// Bytes held in buffers (for the per-connection cap).
    pub(crate) fn buffered(&self) -> usize {
        self.buf.capacity()
    }

    /// Mid-message (head or body started, not finished).
    pub(crate) fn in_message(&self) -> bool {
        !matches!(self.state, State::Idle | State::Upgraded | State::Lost)
    }

    pub(crate) fn message_bytes(&self) -> u64 {
        self.msg_bytes
    }

    /// A syscall's bytes begin here: a lost parser resyncs if they start a message; a request
    /// whose 100-continue body never came (the server answered first) ends if a new request
    /// starts.
    pub(crate) fn event_start(&mut self, payload: &[u8], ctx: &Ctx, sink: &mut impl H1Sink) {
        match self.state {
            State::Lost if looks_like_start(self.side, payload) => {
                self.state = State::Idle;
            }
            State::Body { .. }
                if self.expect_waiting && looks_like_start(Side::Request, payload) =>
            {
                self.expect_waiting = false;
                self.end_message(ctx, sink, true);
            }
            _ => {}
        }
    }

    /// Captured bytes, in order.
    /// Parses `data`; returns how many of its bytes followed a protocol switch in it (they
    /// belong to the new protocol; counted here, parsed by whoever takes over).
    pub(crate) fn feed(&mut self, mut data: &[u8], ctx: &Ctx, sink: &mut impl H1Sink) -> usize {
        while !data.is_empty() {
            match self.state {
                State::Idle => {
                    // Stray CRLFs between messages are allowed (RFC 9112 §2.2).
                    let skip = data
                        .iter()
                        .take_while(|&&c| c == b'\r' || c == b'\n')
                        .count();
                    data = data.get(skip..).unwrap_or_default();
                    if data.is_empty() {
                        break;
                    }
                    self.start = *ctx;
                    self.msg_bytes = 0;
                    // Only request bodies are hashed (`body_bytes`, `end_message`): a
                    // response parser need not key a fresh hasher per message.
                    if self.side == Side::Request {
                        self.hasher = BodyHasher::default();
                    }
                    self.buf.clear();
                    self.state = State::Head;
                }
                State::Head => data = self.feed_head(data, ctx, sink),
                State::Body { remaining } => {
                    let take = usize::try_from(remaining)
                        .unwrap_or(usize::MAX)
                        .min(data.len());
                    let (body, rest) = data.split_at(take);
                    self.body_bytes(body);
                    data = rest;
                    let remaining = remaining - take as u64;
                    self.state = State::Body { remaining };
                    if remaining == 0 {
                        self.end_message(ctx, sink, true);
                    }
                }
                State::ChunkData { remaining } => {
                    let take = usize::try_from(remaining)
                        .unwrap_or(usize::MAX)
                        .min(data.len());
                    let (body, rest) = data.split_at(take);
                    self.body_bytes(body);
                    data = rest;
                    let remaining = remaining - take as u64;
                    self.state = if remaining == 0 {
                        State::ChunkEnd
                    } else {
                        State::ChunkData { remaining }
                    };
                }
                State::ChunkEnd => {
                    let (&c, rest) = match data.split_first() {
                        Some(x) => x,
                        None => break,
                    };
                    data = rest;
                    self.msg_bytes += 1;
                    match c {
                        b'\r' => {}
                        b'\n' => self.state = State::ChunkSize,
                        _ => self.lose_mid_message(ctx, sink, false),
                    }
                }
                State::ChunkSize | State::Trailers => {
                    let Some((line, rest)) = self.take_line(data) else {
                        // No newline yet: buffer (bounded).
                        self.msg_bytes += data.len() as u64;
                        if self.buf.len() + data.len() > MAX_LINE.min(self.cap) {
                            self.lose_mid_message(ctx, sink, false);
                        } else {
                            self.buf.extend_from_slice(data);
                        }
                        break;
                    };
                    data = rest;
                    self.chunk_line(&line, ctx, sink);
                }
                State::Upgraded => {
                    self.msg_bytes += data.len() as u64;
                    return data.len();
                }
                State::UntilClose | State::Lost => {
                    self.msg_bytes += data.len() as u64;
                    break;
                }
            }
        }
        0
    }

    /// `n` bytes went by uncaptured.
    pub(crate) fn gap(&mut self, mut n: u64, ctx: &Ctx, sink: &mut impl H1Sink) {
        while n > 0 {
            match self.state {
                State::Idle => {
                    // A message started in bytes we cannot see.
                    sink.unseen_message(ctx);
                    self.state = State::Lost;
                    return;
                }
                State::Head => {
                    sink.truncated();
                    self.msg_bytes += n;
                    self.truncated_head(ctx, sink);
                    return;
                }
                State::Body { remaining } | State::ChunkData { remaining } => {
                    self.hasher.gap();
                    let take = remaining.min(n);
                    n -= take;
                    self.msg_bytes += take;
                    let remaining = remaining - take;
                    if let State::Body { .. } = self.state {
                        self.state = State::Body { remaining };
                        if remaining == 0 {
                            self.end_message(ctx, sink, true);
                        }
                    } else {
                        self.state = if remaining == 0 {
                            State::ChunkEnd
                        } else {
                            State::ChunkData { remaining }
                        };
                    }
                }
                State::ChunkEnd | State::ChunkSize | State::Trailers => {
                    sink.truncated();
                    self.msg_bytes += n;
                    self.lose_mid_message(ctx, sink, true);
                    return;
                }
                State::UntilClose | State::Upgraded | State::Lost => {
                    self.msg_bytes += n;
                    return;
                }
            }
        }
    }

    /// The connection closed: a body delimited by close ends here.
    pub(crate) fn close(&mut self, ctx: &Ctx, sink: &mut impl H1Sink) {
        if self.state == State::UntilClose {
            self.end_message(ctx, sink, true);
        }
    }

    fn body_bytes(&mut self, body: &[u8]) {
        self.msg_bytes += body.len() as u64;
        if !body.is_empty() {
            self.expect_waiting = false;
        }
        if self.side == Side::Request {
            self.hasher.feed(body);
        }
    }

    fn feed_head<'a>(&mut self, data: &'a [u8], ctx: &Ctx, sink: &mut impl H1Sink) -> &'a [u8] {
        // Fast path: the whole head is in this syscall; parse in place without copying.
        if self.buf.is_empty()
            && let Some(end) = find_head_end(data, 0)
        {
            let (head, rest) = data.split_at(end);
            self.msg_bytes += end as u64;
            self.parse_head(head, true, ctx, sink);
            return rest;
        }
        let old = self.buf.len();
        let room = self.cap.saturating_sub(old);
        let take = data.len().min(room);
        self.buf
            .extend_from_slice(data.get(..take).unwrap_or_default());
        match find_head_end(&self.buf, old.saturating_sub(3)) {
            Some(end) => {
                let used = end - old;
                self.buf.truncate(end);
                self.msg_bytes += used as u64;
                let head = std::mem::take(&mut self.buf);
                self.parse_head(&head, true, ctx, sink);
                self.buf = recycle(head);
                data.get(used..).unwrap_or_default()
            }
            None if take < data.len() || self.buf.len() >= self.cap => {
                // Head larger than the per-connection cap.
                sink.truncated();
                self.msg_bytes += data.len() as u64;
                self.truncated_head(ctx, sink);
                &[]
            }
            None => {
                self.msg_bytes += take as u64;
                &[]
            }
        }
    }

    /// The head was cut short: report what its complete lines say, marked unknown, then lose
    /// sync (its body framing is unknowable).
    fn truncated_head(&mut self, ctx: &Ctx, sink: &mut impl H1Sink) {
        let head = std::mem::take(&mut self.buf);
        self.parse_head(&head, false, ctx, sink);
        self.buf = recycle(head);
    }

    fn parse_head(&mut self, head: &[u8], complete: bool, ctx: &Ctx, sink: &mut impl H1Sink) {
        let start = self.start;
        match self.side {
            Side::Request => match parse_request_head(head, complete) {
                Some((req, framing, expect)) => {
                    sink.request_head(req, &start);
                    if !complete {
                        self.lose_mid_message(ctx, sink, true);
                        return;
                    }
                    self.expect_waiting = expect;
                    self.begin_body(framing, ctx, sink);
                }
                None => {
                    sink.parse_error();
                    sink.unseen_message(ctx);
                    self.state = State::Lost;
                }
            },
            Side::Response => match parse_response_head(head, complete) {
                Some((resp, status, framing)) => {
                    if (100..200).contains(&status) && status != 101 {
                        // Interim response: the final one follows.
                        self.state = State::Idle;
                        return;
                    }
                    let ans = sink.response_head(resp, &start);
                    if !complete {
                        self.lose_mid_message(ctx, sink, true);
                        return;
                    }
                    let framing = if status == 101 || (ans.connect && (200..300).contains(&status))
                    {
                        Framing::Upgrade
                    } else if ans.head || status == 204 || status == 304 {
                        Framing::Length(0)
                    } else {
                        framing
                    };
                    self.begin_body(framing, ctx, sink);
                }
                None => {
                    sink.parse_error();
                    sink.unseen_message(ctx);
                    self.state = State::Lost;
                }
            },
        }
    }

    fn begin_body(&mut self, framing: Framing, ctx: &Ctx, sink: &mut impl H1Sink) {
        match framing {
            Framing::Length(0) => self.end_message(ctx, sink, true),
            Framing::Length(n) => self.state = State::Body { remaining: n },
            Framing::Chunked => {
                self.buf.clear();
                self.state = State::ChunkSize;
            }
            Framing::UntilClose => self.state = State::UntilClose,
            Framing::Upgrade => {
                self.end_message(ctx, sink, true);
                self.set_upgraded();
                sink.upgraded();
            }
        }
    }

    fn end_message(&mut self, ctx: &Ctx, sink: &mut impl H1Sink, complete: bool) {
        self.state = State::Idle;
        self.expect_waiting = false;
        match self.side {
            Side::Request => sink.request_end(ctx, self.hasher.finish(), self.msg_bytes, complete),
            Side::Response => sink.response_end(ctx, self.msg_bytes, complete),
        }
        self.msg_bytes = 0;
    }

    /// Sync lost inside a message whose head was delivered: end it as incomplete.
    fn lose_mid_message(&mut self, ctx: &Ctx, sink: &mut impl H1Sink, counted: bool) {
        if !counted {
            sink.parse_error();
        }
        self.end_message(ctx, sink, false);
        self.state = State::Lost;
    }

    /// One line (without its newline) from the buffer plus `data`, if `data` holds a newline.
    fn take_line<'a>(&mut self, data: &'a [u8]) -> Option<(Vec<u8>, &'a [u8])> {
        let nl = data.iter().position(|&c| c == b'\n')?;
        let (line, rest) = data.split_at(nl);
        let rest = rest.get(1..).unwrap_or_default();
        self.msg_bytes += nl as u64 + 1;
        let mut full = std::mem::take(&mut self.buf);
        full.extend_from_slice(line);
        if full.last() == Some(&b'\r') {
            full.pop();
        }
        Some((full, rest))
    }

    fn chunk_line(&mut self, line: &[u8], ctx: &Ctx, sink: &mut impl H1Sink) {
        if self.state == State::Trailers {
            if line.is_empty() {
                self.end_message(ctx, sink, true);
            }
            return;
        }
        let size = line
            .split(|&c| c == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        match parse_hex(size) {
            Some(0) => self.state = State::Trailers,
            Some(n) => self.state = State::ChunkData { remaining: n },
            None => self.lose_mid_message(ctx, sink, false),
        }
    }
}

/// An emptied buffer to keep: a large one (a rare huge head) is dropped, so idle connections
/// do not each hold their high-water mark.
pub(crate) fn recycle(mut b: Vec<u8>) -> Vec<u8> {
    b.clear();
    if b.capacity() > KEEP_BUFFER {
        Vec::new()
    } else {
        b
    }
}

/// Buffer capacity a connection keeps between messages.
const KEEP_BUFFER: usize = 4096;

fn parse_hex(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 15 {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &c| {
        let d = (c as char).to_digit(16)?;
        Some(acc * 16 + u64::from(d))
    })
}
