//! Privacy at record time: what enters the ring is only the request/status line (without its
//! query), the header names, and the values of the headers the product reads. Everything else
//! is masked *in place, keeping every length*, so the l7 reassembler frames the recorded bytes
//! exactly as it framed the live ones (Content-Length, chunk sizes and HTTP/2 frame headers
//! stay intact).
//!
//! - One allow-list ([`KEEP_HEADERS`]) for HTTP/1 and HTTP/2: any other header value becomes
//!   `*`s (Authorization, Cookie, Set-Cookie, `x-api-key`, custom gRPC metadata...). HTTP/2
//!   names are judged decoded (`h2`: Huffman literals, dynamic-table references).
//! - Query strings (request line, `:path`) are masked, across record boundaries too.
//! - Bodies (HTTP/1 bodies, chunk data, HTTP/2 DATA payloads) become `.`s, each run of a
//!   request body led by its keyed digest. Retry matching does not read these: the replay takes
//!   the query and body digests the live run computed from the recorded exchanges (see
//!   `replay`).
//! - What cannot be classified is masked: a head line that is not `name: value`, bytes after a
//!   loss of framing (uncaptured bytes where framing needed them, implausible HTTP/2 frames, a
//!   capture loss the recorder is told about) until a record starts a message again.
//!
//! [`redact_for_display`] is the same redaction for `retry-agent trace`.
use bytes::{Bytes, BytesMut};
use foldhash::HashMap;

use crate::capture::{ConnId, DataEvent, Direction, Role};

mod h1;
mod h2;
#[cfg(test)]
mod tests;

use h1::head_bytes;
use h2::{H2, PREFACE as H2_PREFACE};

/// Headers whose values the product reads (lower case). Everything else is masked.
pub const KEEP_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "content-type",
    "retry-after",
    "x-error-claim",
    "x-retry-suppressed",
    "x-envoy-attempt-count",
    "x-envoy-retry-on",
    "x-envoy-max-retries",
    "x-envoy-upstream-rq-timeout-ms",
    "x-envoy-expected-rq-timeout-ms",
    "x-retry-attempt",
    "x-retry-count",
    "retry-attempt",
    "grpc-previous-rpc-attempts",
    "grpc-retry-pushback-ms",
    "grpc-status",
    "grpc-timeout",
    "request-timeout",
    "x-request-id",
    "traceparent",
    "tracestate",
    "x-b3-traceid",
    "x-b3-spanid",
    "x-b3-parentspanid",
    "x-b3-sampled",
    "b3",
    "x-cloud-trace-context",
    "http2-settings",
];

/// Never kept, whatever the allowlist says.
pub const SECRET_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
];

/// One bit per length of a name on [`KEEP_HEADERS`] or [`KEEP_PSEUDO`] (all shorter than 64).
const KEPT_LENGTHS: u64 = {
    let mut m = 0u64;
    let lists: [&[&str]; 2] = [KEEP_HEADERS, KEEP_PSEUDO];
    let mut l = 0;
    while l < lists.len() {
        let mut i = 0;
        while i < lists[l].len() {
            assert!(lists[l][i].len() < 64);
            m |= 1 << lists[l][i].len();
            i += 1;
        }
        l += 1;
    }
    m
};

/// HTTP/2 pseudo-headers kept (`:path` keeps its path, not its query).
const KEEP_PSEUDO: &[&str] = &[":method", ":scheme", ":authority", ":status", ":protocol"];

/// Headers whose presence matters but whose value is private (masked, name kept).
const PRESENCE_ONLY: &[&str] = &["idempotency-key", "x-idempotency-key"];

const METHODS: &[&[u8]] = &[
    b"GET ",
    b"HEAD ",
    b"POST ",
    b"PUT ",
    b"DELETE ",
    b"PATCH ",
    b"OPTIONS ",
    b"CONNECT ",
    b"TRACE ",
];
const HEX: &[u8; 16] = b"0123456789abcdef";
/// Per-process bound on tracked streams (the state is small; the cap guards against fd churn).
const MAX_STREAMS: usize = 65_536;

/// What one redaction removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Redacted {
    pub headers: u64,
    pub body_bytes: u64,
    /// How many of the payload's last bytes are a masked body's dots (the recorder leaves them
    /// out of its ring; the event's length still counts them).
    pub dots_at_end: usize,
}

/// Where a head line is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Line {
    /// At the start of a line: decide when the name is seen.
    Start,
    /// The request line or status line; `spaces` seen so far, inside the query or not.
    First {
        spaces: u8,
        query: bool,
    },
    Keep,
    Mask,
}

enum Stream {
    /// Expecting the start of a message; bytes that do not start one are masked. Also the
    /// state after a loss of framing.
    Start,
    /// Inside an HTTP/1 head (or trailers).
    Head {
        line: Line,
        info: HeadInfo,
        trailers: bool,
    },
    Body {
        remaining: u64,
    },
    ChunkSize,
    ChunkData {
        remaining: u64,
    },
    /// CRLF after chunk data.
    ChunkEnd {
        remaining: u8,
    },
    H2(Box<H2>),
    /// The record ended inside a method token or `HTTP/1.` at a message start (Go's net/http
    /// reads a keep-alive connection's next request one byte at a time first): kept, as those
    /// letters carry nothing private; the next record decides whether a message goes on.
    Prefix {
        seen: [u8; PREFIX_MAX],
        len: u8,
    },
}

/// Longest proper prefix of a message start held across records (`OPTIONS `, `CONNECT `).
const PREFIX_MAX: usize = 8;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct HeadInfo {
    content_length: Option<u64>,
    chunked: bool,
    /// Response status without a body (1xx, 204, 304).
    no_body: bool,
    h2_upgrade: bool,
    /// A line that is not `name: value`: the head is not what we think it is.
    bad: bool,
}

/// One connection direction: its framing state and the byte offset its next record should
/// start at (a record elsewhere means bytes were lost in between).
struct Tracked {
    st: Stream,
    next: u64,
}

pub struct Redactor {
    streams: HashMap<(ConnId, Direction), Tracked>,
    arena: BytesMut,
    /// Scratch: body byte ranges of the payload being redacted.
    runs: Vec<(usize, usize)>,
}

/// Payload arena chunk size.
const ARENA_CHUNK: usize = 256 * 1024;

impl Default for Redactor {
    fn default() -> Self {
        Self::new()
    }
}

impl Redactor {
    pub fn new() -> Self {
        Redactor {
            streams: HashMap::default(),
            arena: BytesMut::new(),
            runs: Vec::new(),
        }
    }

    pub fn forget_pid(&mut self, pid: u32) {
        self.streams.retain(|(c, _), _| c.pid != pid);
    }

    /// How many connection directions are tracked.
    pub fn tracked(&self) -> usize {
        self.streams.len()
    }

    /// Records were lost before reaching the redactor (a full ring or channel): every stream is
    /// out of step, so everything is masked until a record starts a message again.
    pub fn lost_all(&mut self) {
        for t in self.streams.values_mut() {
            t.st = Stream::Start;
        }
    }

    /// Mask everything private in `d`'s payload; lengths are kept.
    pub fn redact(&mut self, mut d: DataEvent) -> (DataEvent, Redacted) {
        let (payload, red) = self.redact_payload(&d);
        d.payload = payload;
        (d, red)
    }

    /// The redacted copy of `d`'s payload (same length), carved from a shared arena: one
    /// allocation per `ARENA_CHUNK`, not one per event, and the ring frees chunks in order.
    pub fn redact_payload(&mut self, d: &DataEvent) -> (Bytes, Redacted) {
        self.redact_payload_at(d, None)
    }

    /// [`Self::redact_payload`] for a record known to start at byte `offset` of its connection
    /// direction (the sum of the full lengths before it). A record that does not start where
    /// the last one ended follows a loss: its stream is out of step and is masked until a
    /// record starts a message again. Without an offset, records are taken to be contiguous.
    pub fn redact_payload_at(&mut self, d: &DataEvent, offset: Option<u64>) -> (Bytes, Redacted) {
        if self.arena.capacity() - self.arena.len() < d.payload.len() {
            self.arena = BytesMut::with_capacity(ARENA_CHUNK.max(d.payload.len()));
        }
        self.arena.extend_from_slice(&d.payload);
        let mut buf = self.arena.split();
        let red = self.redact_in_place(d, offset, &mut buf);
        (buf.freeze(), red)
    }

    /// Redact `buf`, a copy of `d`'s payload, in place (the flight recorder copies payloads
    /// straight into its own blocks); `offset` as for [`Self::redact_payload_at`].
    pub fn redact_in_place(
        &mut self,
        d: &DataEvent,
        offset: Option<u64>,
        buf: &mut [u8],
    ) -> Redacted {
        let t = tracked(
            &mut self.streams,
            (d.conn, d.direction),
            offset.unwrap_or(0),
        );
        if let Some(off) = offset
            && off != t.next
        {
            t.st = Stream::Start;
        }
        t.next = offset.unwrap_or(t.next).saturating_add(d.len);
        let mut red = Redacted::default();
        frame(&mut t.st, d, buf, &mut red, &mut self.runs);
        self.mask_runs(d, buf, red)
    }

    /// [`Self::redact_in_place`] for a kernel summary's request: one whole request record (the
    /// kernel holds only a record that starts a request and is all the syscall moved), so it
    /// is framed from a message start without the connection's tracked state, which it leaves
    /// as it was unless the request ends inside its body (a head sent before the rest of its
    /// body): then the connection goes on from there. The state it skips is between messages
    /// on a quiet connection; a body's a record starting a message resynchronises anyway (the
    /// walk's rule); one caught inside a head or a chunk stays for the connection's next
    /// record, whose unreadable lines it masks. The lookup per summary was ~2% of the agent's
    /// CPU under a keep-alive load.
    pub fn redact_summary_request(&mut self, d: &DataEvent, buf: &mut [u8]) -> Redacted {
        let mut st = Stream::Start;
        let mut red = Redacted::default();
        frame(&mut st, d, buf, &mut red, &mut self.runs);
        if !matches!(st, Stream::Start) {
            let t = tracked(&mut self.streams, (d.conn, d.direction), 0);
            t.next = t.next.saturating_add(d.len);
            t.st = st;
        }
        self.mask_runs(d, buf, red)
    }

    /// Masks the body runs `frame` found in `buf` (digested for requests).
    fn mask_runs(&self, d: &DataEvent, buf: &mut [u8], mut red: Redacted) -> Redacted {
        // Response bodies are only masked: retries repeat requests, so a request body's digest
        // tells a dump's reader which requests were the same; a response's tells them little,
        // and hashing it was ~10% of the agent's CPU serving 1 KiB files.
        let digest = is_request(d);
        let n = buf.len();
        for &(s, e) in &self.runs {
            if let Some(run) = buf.get_mut(s..e) {
                red.body_bytes += run.len() as u64;
                if !digest {
                    run.fill(b'.');
                    if e == n {
                        red.dots_at_end = run.len();
                    }
                    continue;
                }
                let mut h = crate::l7::domain_hasher(crate::l7::Domain::BodyRun);
                h.write(run);
                let digest = h.finish();
                // The digest's 16 hex digits (as many as fit), then dots: a fill, not a
                // branch per byte.
                let hex = run.len().min(16);
                let (head, dots) = run.split_at_mut(hex);
                for (i, c) in head.iter_mut().enumerate() {
                    *c = HEX[((digest >> (60 - 4 * i)) & 0xf) as usize];
                }
                dots.fill(b'.');
                if e == n {
                    red.dots_at_end = dots.len();
                }
            }
        }
        red
    }
}

/// Connection direction `key`'s state, made (expecting a message at byte `next`) if new; a
/// full map is emptied first (everything then restarts from a message start, masked until one).
fn tracked(
    streams: &mut HashMap<(ConnId, Direction), Tracked>,
    key: (ConnId, Direction),
    next: u64,
) -> &mut Tracked {
    if streams.len() >= MAX_STREAMS && !streams.contains_key(&key) {
        streams.clear();
    }
    streams.entry(key).or_insert(Tracked {
        st: Stream::Start,
        next,
    })
}

/// Frames `buf`, the captured prefix of `d`'s payload, from state `st`: what is private in
/// heads is masked in place, body runs are left in `runs` (cleared first), and the bytes the
/// syscall moved beyond the prefix still advance the framing.
fn frame(
    st: &mut Stream,
    d: &DataEvent,
    buf: &mut [u8],
    red: &mut Redacted,
    runs: &mut Vec<(usize, usize)>,
) {
    runs.clear();
    walk(st, buf, red, runs);
    let unseen = d.len.saturating_sub(buf.len() as u64);
    if unseen > 0 {
        skip(st, unseen);
    }
}

/// Whether `d` carries requests (a connection picked up mid-life counts as one: its bodies keep
/// their digests).
fn is_request(d: &DataEvent) -> bool {
    !matches!(
        (d.role, d.direction),
        (Role::Client, Direction::Ingress) | (Role::Server, Direction::Egress)
    )
}

/// A payload as `retry-agent trace` may print it: redacted as the recorder would, with its own
/// per-connection state (the caller keeps one [`Redactor`] for the whole trace).
pub fn redact_for_display(r: &mut Redactor, d: &DataEvent) -> Bytes {
    r.redact_payload(d).0
}

fn starts_message(b: &[u8]) -> bool {
    b.starts_with(b"HTTP/1.")
        || METHODS.iter().any(|m| b.starts_with(m))
        || b.starts_with(H2_PREFACE)
}

/// `b` is shorter than, and the beginning of, a method token or `HTTP/1.`: a message may start
/// here, cut by the record's end.
fn message_prefix(b: &[u8]) -> Option<Stream> {
    let cut = |t: &[u8]| b.len() < t.len() && t.starts_with(b);
    if b.is_empty() || !(cut(b"HTTP/1.") || METHODS.iter().any(|m| cut(m))) {
        return None;
    }
    let mut seen = [0u8; PREFIX_MAX];
    seen.get_mut(..b.len())?.copy_from_slice(b);
    Some(Stream::Prefix {
        seen,
        len: b.len() as u8,
    })
}

/// A held prefix and the record after it: the message start they make together, if any.
fn continue_prefix(seen: &[u8], b: &[u8]) -> Option<Stream> {
    let mut joined = [0u8; 2 * PREFIX_MAX + H2_PREFACE.len()];
    let take = b.len().min(joined.len() - seen.len());
    joined.get_mut(..seen.len())?.copy_from_slice(seen);
    joined
        .get_mut(seen.len()..seen.len() + take)?
        .copy_from_slice(b.get(..take)?);
    let joined = joined.get(..seen.len() + take)?;
    if joined.starts_with(H2_PREFACE) {
        // Not an HTTP/1 head: what follows is HTTP/2 framing whose table this stream missed.
        None
    } else if starts_message(joined) {
        // The head's first line goes on from here: its spaces are all still ahead.
        Some(head_start())
    } else {
        message_prefix(joined)
    }
}

fn head_start() -> Stream {
    Stream::Head {
        line: Line::First {
            spaces: 0,
            query: false,
        },
        info: HeadInfo::default(),
        trailers: false,
    }
}

fn message_start(b: &[u8]) -> Stream {
    if b.starts_with(H2_PREFACE) {
        Stream::H2(Box::new(H2::new(true, true)))
    } else {
        head_start()
    }
}

/// Advance the framing over bytes that were not captured.
fn skip(st: &mut Stream, n: u64) {
    match st {
        Stream::Body { remaining } | Stream::ChunkData { remaining } => {
            if n < *remaining {
                *remaining -= n;
            } else {
                *st = Stream::Start;
            }
        }
        Stream::H2(h) => {
            if !h.skip(n) {
                *st = Stream::Start;
            }
        }
        // Lost sync: the next record that starts a message resynchronises.
        _ => *st = Stream::Start,
    }
}

/// Walk the captured bytes, masking header values in place and collecting body byte runs.
fn walk(st: &mut Stream, b: &mut [u8], red: &mut Redacted, body: &mut Vec<(usize, usize)>) {
    let mut i = 0;
    let n = b.len();
    // A body/unknown state that meets a message start at the top of a record resynchronises
    // (responses to HEAD carry a Content-Length without a body); a lost stream also
    // resynchronises on a record of HTTP/2 frames (its table is unknown: dynamic names masked).
    if let Stream::Prefix { seen, len } = st {
        let seen = seen.get(..usize::from(*len)).unwrap_or_default();
        *st = continue_prefix(seen, b).unwrap_or(Stream::Start);
        if matches!(st, Stream::Prefix { .. }) {
            // Still inside the token: kept, decided by the next record.
            return;
        }
    }
    if matches!(st, Stream::Body { .. } | Stream::Start) && starts_message(b) {
        *st = message_start(b);
    } else if matches!(st, Stream::Start) && h2::starts_with_frames(b) {
        *st = Stream::H2(Box::new(H2::new(false, false)));
    }
    while i < n {
        match st {
            Stream::Start => {
                let rest = b.get(i..).unwrap_or_default();
                if starts_message(rest) {
                    *st = message_start(rest);
                } else if let Some(prefix) = message_prefix(rest) {
                    *st = prefix;
                    return;
                } else {
                    // Unknown bytes: masked to the end of this record.
                    body.push((i, n));
                    return;
                }
            }
            Stream::Head { .. } => i = head_bytes(st, b, i, red),
            Stream::Body { remaining } => {
                let take = (*remaining).min((n - i) as u64) as usize;
                body.push((i, i + take));
                i += take;
                *remaining -= take as u64;
                if *remaining == 0 {
                    *st = Stream::Start;
                }
            }
            Stream::ChunkSize => i = chunk_size(st, b, i),
            Stream::ChunkData { remaining } => {
                let take = (*remaining).min((n - i) as u64) as usize;
                body.push((i, i + take));
                i += take;
                *remaining -= take as u64;
                if *remaining == 0 {
                    *st = Stream::ChunkEnd { remaining: 2 };
                }
            }
            Stream::ChunkEnd { remaining } => {
                if !matches!(b.get(i), Some(b'\r' | b'\n')) {
                    *st = Stream::Start;
                    continue;
                }
                i += 1;
                *remaining = remaining.saturating_sub(1);
                if *remaining == 0 {
                    *st = Stream::ChunkSize;
                }
            }
            Stream::Prefix { .. } => {
                // Only ever left by a record's end (above); masked if met here all the same.
                *st = Stream::Start;
                body.push((i, n));
                return;
            }
            Stream::H2(h) => match h.bytes(b, i, red, body) {
                Some(next) => i = next,
                None => {
                    // Not HTTP/2 framing: out of step. Everything from here is masked.
                    *st = Stream::Start;
                    body.push((i, n));
                    return;
                }
            },
        }
    }
}

/// A chunk-size line: hex digits kept, extensions masked.
fn chunk_size(st: &mut Stream, b: &mut [u8], i: usize) -> usize {
    let n = b.len();
    let line_end = b
        .get(i..)
        .and_then(|r| memchr::memchr(b'\n', r))
        .map(|p| i + p);
    let end = line_end.unwrap_or(n);
    let line = b.get(i..end).unwrap_or_default();
    let digits = line.iter().take_while(|c| c.is_ascii_hexdigit()).count();
    let size = std::str::from_utf8(line.get(..digits).unwrap_or_default())
        .ok()
        .and_then(|s| u64::from_str_radix(s, 16).ok());
    if let Some(ext) = b.get_mut(i + digits..end) {
        for c in ext.iter_mut().filter(|c| **c != b'\r') {
            *c = b'*';
        }
    }
    let Some(le) = line_end else {
        // Size line split across records: lose sync rather than guess.
        *st = Stream::Start;
        return n;
    };
    *st = match size {
        Some(0) => Stream::Head {
            line: Line::Start,
            info: HeadInfo::default(),
            trailers: true,
        },
        Some(s) => Stream::ChunkData { remaining: s },
        None => Stream::Start,
    };
    le + 1
}

/// RFC 9110 token characters (header names), as a table: every byte of every header name is
/// tested, and a scan of the punctuation list per byte showed in profiles.
fn is_tchar(c: u8) -> bool {
    TCHAR[usize::from(c)]
}

const TCHAR: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = b.is_ascii_alphanumeric();
        c += 1;
    }
    let punct = b"!#$%&'*+-.^_`|~";
    let mut i = 0;
    while i < punct.len() {
        t[punct[i] as usize] = true;
        i += 1;
    }
    t
};

/// Mask the query of a request target (or request-line piece) in place: everything after the
/// first `?` up to a space. Returns whether anything was masked.
pub(crate) fn mask_query(v: &mut [u8]) -> bool {
    let Some(q) = v.iter().position(|&c| c == b'?') else {
        return false;
    };
    let mut any = false;
    for c in v.iter_mut().skip(q + 1).take_while(|c| **c != b' ') {
        *c = b'*';
        any = true;
    }
    any
}

fn keep_value(name: &[u8]) -> bool {
    // A value is kept only if the name is on a keep list: a name whose length no kept name has
    // is masked without comparing it to each (most custom and secret headers).
    if !(name.len() < 64 && KEPT_LENGTHS & (1 << name.len()) != 0) {
        return false;
    }
    // Lowercased once, then plain comparisons (length first, then memcmp): folding case per
    // list entry was ~3% of the agent's CPU under a keep-alive load.
    let mut buf = [0u8; 64];
    let Some(lower) = buf.get_mut(..name.len()) else {
        return false;
    };
    for (d, c) in lower.iter_mut().zip(name) {
        *d = c.to_ascii_lowercase();
    }
    let lower: &[u8] = lower;
    let is = |list: &[&str]| list.iter().any(|k| k.as_bytes() == lower);
    !is(SECRET_HEADERS) && !is(PRESENCE_ONLY) && (is(KEEP_HEADERS) || is(KEEP_PSEUDO))
}

fn mask_value(b: &mut [u8], from: usize, to: usize) {
    if let Some(v) = b.get_mut(from..to) {
        // A select, not a branch, so the loop vectorises (values are most of a head's bytes).
        for c in v.iter_mut() {
            let keep = matches!(*c, b'\r' | b' ' | b'\t');
            *c = if keep { *c } else { b'*' };
        }
    }
}
