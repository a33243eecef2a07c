//! Privacy at record time: what enters the ring is only the request/status line, the header names,
//! and the values of the headers the product reads. Everything else is masked *in place, keeping
//! every length*, so the l7 reassembler frames the recorded bytes exactly as it framed the live
//! ones (Content-Length, chunk sizes and HTTP/2 frame headers stay intact).
//!
//! - Header values not on the allowlist (always including Authorization, Cookie, Set-Cookie,
//!   Proxy-Authorization) become `*`s.
//! - Bodies (HTTP/1 bodies, chunk data, HTTP/2 DATA payloads, unparseable bytes) become a keyed
//!   digest followed by `.`s: equal bodies still look equal (retry matching by body hash keeps
//!   working in a replay) but the key lives only in this process, so the digest reveals nothing.
//! - HTTP/2 header blocks: literal values whose name is sensitive (static-table index or plain
//!   literal name) are masked; Huffman-coded literal names are not decoded (gRPC stacks send
//!   these headers by static index). A header block split across syscalls or CONTINUATION
//!   frames is masked whole: a replay loses that block, but no secret survives a split.
use std::{
    hash::{BuildHasher, Hasher, RandomState},
};

use bytes::{Bytes, BytesMut};
use foldhash::HashMap;

use crate::capture::{ConnId, DataEvent, Direction};

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
pub const SECRET_HEADERS: &[&str] = &["authorization", "proxy-authorization", "cookie", "set-cookie"];

/// Headers whose presence matters but whose value is private (masked, name kept).
const PRESENCE_ONLY: &[&str] = &["idempotency-key", "x-idempotency-key"];

const METHODS: &[&[u8]] = &[
    b"GET ", b"HEAD ", b"POST ", b"PUT ", b"DELETE ", b"PATCH ", b"OPTIONS ", b"CONNECT ", b"TRACE ",
];
const HEX: &[u8; 16] = b"0123456789abcdef";
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Per-process bound on tracked streams (the state is tiny; the cap guards against fd churn).
const MAX_STREAMS: usize = 65_536;

/// What one redaction removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Redacted {
    pub headers: u64,
    pub body_bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LineMode {
    /// At the start of a line: decide when the name is seen.
    Start,
    Keep,
    Mask,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Stream {
    /// Expecting the start of a message (or lost: bytes that don't start one are masked).
    Start,
    /// Inside an HTTP/1 head (or trailers).
    Head { first_line: bool, line: LineMode, info: HeadInfo, trailers: bool },
    Body { remaining: u64 },
    ChunkSize,
    ChunkData { remaining: u64 },
    /// CRLF after chunk data.
    ChunkEnd { remaining: u8 },
    H2(H2),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct HeadInfo {
    content_length: Option<u64>,
    chunked: bool,
    /// Response status without a body (1xx, 204, 304).
    no_body: bool,
    h2_upgrade: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct H2 {
    preface_left: usize,
    hdr: [u8; 9],
    have: usize,
    left: u32,
    kind: u8,
    /// The current frame's header arrived in this syscall (its payload may be whole here).
    fresh: bool,
    /// A header block continues in CONTINUATION frames: all of it is masked (a field may
    /// straddle frames, and a split secret must not survive).
    continuing: bool,
}

pub struct Redactor {
    streams: HashMap<(ConnId, Direction), Stream>,
    key: RandomState,
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
        Redactor { streams: HashMap::default(), key: RandomState::new(), arena: BytesMut::new(), runs: Vec::new() }
    }

    pub fn forget_pid(&mut self, pid: u32) {
        self.streams.retain(|(c, _), _| c.pid != pid);
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
        if self.streams.len() >= MAX_STREAMS && !self.streams.contains_key(&(d.conn, d.direction)) {
            self.streams.clear();
        }
        let st = self.streams.entry((d.conn, d.direction)).or_insert(Stream::Start);
        if self.arena.capacity() - self.arena.len() < d.payload.len() {
            self.arena = BytesMut::with_capacity(ARENA_CHUNK.max(d.payload.len()));
        }
        self.arena.extend_from_slice(&d.payload);
        let mut buf = self.arena.split();
        let mut red = Redacted::default();
        self.runs.clear();
        walk(st, &mut buf, &mut red, &mut self.runs);
        // Bytes the syscall moved beyond the captured prefix still advance the framing.
        let unseen = d.len.saturating_sub(d.payload.len() as u64);
        if unseen > 0 {
            skip(st, unseen);
        }
        for &(s, e) in &self.runs {
            if let Some(run) = buf.get_mut(s..e) {
                red.body_bytes += run.len() as u64;
                let mut h = self.key.build_hasher();
                h.write(run);
                let digest = h.finish();
                for (i, c) in run.iter_mut().enumerate() {
                    *c = if i < 16 { HEX[((digest >> (60 - 4 * i)) & 0xf) as usize] } else { b'.' };
                }
            }
        }
        (buf.freeze(), red)
    }
}

fn starts_message(b: &[u8]) -> bool {
    b.starts_with(b"HTTP/1.") || METHODS.iter().any(|m| b.starts_with(m)) || b.starts_with(H2_PREFACE)
}

fn head_start() -> Stream {
    Stream::Head { first_line: true, line: LineMode::Start, info: HeadInfo::default(), trailers: false }
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
        Stream::H2(h) if h.have == 0 && u64::from(h.left) > n => {
            h.left -= n as u32;
            h.fresh = false;
        }
        // Lost sync: the next event that starts a message resynchronises.
        _ => *st = Stream::Start,
    }
}

/// Walk the captured bytes, masking header values in place and collecting body byte runs.
fn walk(st: &mut Stream, b: &mut [u8], red: &mut Redacted, body: &mut Vec<(usize, usize)>) {
    let mut i = 0;
    let n = b.len();
    // A body/unknown state that meets a message start at the top of a syscall resynchronises
    // (responses to HEAD carry a Content-Length without a body).
    if matches!(st, Stream::Body { .. } | Stream::Start) && starts_message(b) {
        *st = if b.starts_with(H2_PREFACE) { h2_start(true) } else { head_start() };
    }
    while i < n {
        match st {
            Stream::Start => {
                let rest = b.get(i..).unwrap_or_default();
                if starts_message(rest) {
                    *st = if rest.starts_with(H2_PREFACE) { h2_start(true) } else { head_start() };
                } else {
                    // Unknown bytes: masked to the end of this syscall.
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
            Stream::ChunkSize => {
                // Keep the size line (hex digits, CRLF); chunk extensions are masked.
                let line_end = b.get(i..).and_then(|r| r.iter().position(|&c| c == b'\n')).map(|p| i + p);
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
                    // Size line split across syscalls: lose sync rather than guess.
                    *st = Stream::Start;
                    return;
                };
                *st = match size {
                    Some(0) => Stream::Head {
                        first_line: false,
                        line: LineMode::Start,
                        info: HeadInfo::default(),
                        trailers: true,
                    },
                    Some(s) => Stream::ChunkData { remaining: s },
                    None => Stream::Start,
                };
                i = le + 1;
            }
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
                i += 1;
                *remaining = remaining.saturating_sub(1);
                if *remaining == 0 {
                    *st = Stream::ChunkSize;
                }
            }
            Stream::H2(h) => i = h2_bytes(h, b, i, red, body),
        }
    }
}

fn h2_start(preface: bool) -> Stream {
    Stream::H2(H2 { preface_left: if preface { H2_PREFACE.len() } else { 0 }, hdr: [0; 9], have: 0, left: 0, kind: 0, fresh: false, continuing: false })
}

/// Process head bytes from `i`; returns the next index.
fn head_bytes(st: &mut Stream, b: &mut [u8], mut i: usize, red: &mut Redacted) -> usize {
    let Stream::Head { first_line, line, info, trailers } = st else { return i };
    let n = b.len();
    while i < n {
        let line_end = b.get(i..).and_then(|r| r.iter().position(|&c| c == b'\n')).map(|p| i + p);
        let end = line_end.unwrap_or(n);
        if *first_line {
            // Request line or status line: kept (the query string is not: it carries tokens).
            if let Some(l) = b.get_mut(i..end) {
                if l.starts_with(b"HTTP/1.") {
                    let code = l.get(9..12).and_then(|c| std::str::from_utf8(c).ok()).and_then(|c| c.parse::<u16>().ok());
                    info.no_body = code.is_some_and(|c| (100..200).contains(&c) || c == 204 || c == 304);
                    info.h2_upgrade = code == Some(101);
                } else if let Some(q) = l.iter().position(|&c| c == b'?') {
                    let stop = l.iter().rposition(|&c| c == b' ').filter(|&s| s > q).unwrap_or(l.len());
                    for c in l.get_mut(q + 1..stop).into_iter().flatten() {
                        *c = b'*';
                    }
                }
            }
            if line_end.is_some() {
                *first_line = false;
            }
        } else if *line == LineMode::Start || line_end.is_some() && *line == LineMode::Start {
            let l = b.get(i..end).unwrap_or_default();
            if l == b"\r" || l.is_empty() && line_end.is_some() {
                // End of head.
                let done = i + l.len() + 1;
                let info = std::mem::take(info);
                *st = if *trailers || info.no_body {
                    Stream::Start
                } else if info.h2_upgrade {
                    h2_start(false)
                } else if info.chunked {
                    Stream::ChunkSize
                } else {
                    match info.content_length {
                        Some(len) if len > 0 => Stream::Body { remaining: len },
                        _ => Stream::Start,
                    }
                };
                return done.min(n);
            }
            match l.iter().position(|&c| c == b':') {
                Some(colon) => {
                    let name = l.get(..colon).unwrap_or_default().trim_ascii();
                    let value_at = i + colon + 1;
                    let value = b.get(value_at..end).unwrap_or_default();
                    if name.eq_ignore_ascii_case(b"content-length") {
                        info.content_length = std::str::from_utf8(value).ok().and_then(|v| v.trim().parse().ok());
                    } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                        info.chunked = value.windows(7).any(|w| w.eq_ignore_ascii_case(b"chunked"));
                    }
                    let keep = keep_value(name);
                    if !keep {
                        red.headers += 1;
                        mask_value(b, value_at, end);
                    }
                    if line_end.is_none() {
                        *line = if keep { LineMode::Keep } else { LineMode::Mask };
                    }
                }
                None if line_end.is_none() => {
                    // Name cut by the end of the syscall: mask the rest of the line, whatever it is.
                    *line = LineMode::Mask;
                }
                None => {}
            }
        } else {
            // Continuation of a line cut at the previous syscall.
            if *line == LineMode::Mask {
                mask_value(b, i, end);
            }
            if line_end.is_some() {
                *line = LineMode::Start;
            }
        }
        match line_end {
            Some(le) => i = le + 1,
            None => return n,
        }
    }
    i
}

fn keep_value(name: &[u8]) -> bool {
    let is = |list: &[&str]| list.iter().any(|k| k.as_bytes().eq_ignore_ascii_case(name));
    !is(SECRET_HEADERS) && !is(PRESENCE_ONLY) && is(KEEP_HEADERS)
}

fn mask_value(b: &mut [u8], from: usize, to: usize) {
    if let Some(v) = b.get_mut(from..to) {
        for c in v.iter_mut().filter(|c| !matches!(**c, b'\r' | b' ' | b'\t')) {
            *c = b'*';
        }
    }
}

const H2_DATA: u8 = 0x0;
const H2_HEADERS: u8 = 0x1;
const H2_PUSH_PROMISE: u8 = 0x5;
const H2_CONTINUATION: u8 = 0x9;

fn h2_bytes(h: &mut H2, b: &mut [u8], mut i: usize, red: &mut Redacted, body: &mut Vec<(usize, usize)>) -> usize {
    let n = b.len();
    if i == 0 {
        // A frame continuing from an earlier syscall is not whole here.
        h.fresh = false;
    }
    while i < n {
        if h.preface_left > 0 {
            let take = h.preface_left.min(n - i);
            h.preface_left -= take;
            i += take;
            continue;
        }
        if h.left == 0 && h.have < 9 {
            // Frame header: kept.
            if let (Some(slot), Some(&c)) = (h.hdr.get_mut(h.have), b.get(i)) {
                *slot = c;
            }
            h.have += 1;
            i += 1;
            if h.have == 9 {
                h.left = u32::from_be_bytes([0, h.hdr[0], h.hdr[1], h.hdr[2]]);
                h.kind = h.hdr[3];
                h.have = 0;
                h.fresh = true;
                let flags = h.hdr[4];
                if matches!(h.kind, H2_HEADERS | H2_PUSH_PROMISE) {
                    h.continuing = flags & 0x4 == 0;
                }
            }
            continue;
        }
        let take = (h.left as usize).min(n - i);
        let whole = h.fresh && take == h.left as usize;
        match h.kind {
            H2_DATA => body.push((i, i + take)),
            H2_HEADERS | H2_PUSH_PROMISE if whole && !h.continuing => {
                let pad = h.hdr[4] & 0x8 != 0;
                let prio = h.hdr[4] & 0x20 != 0 && h.kind == H2_HEADERS;
                hpack_mask(b, i, i + take, pad, prio, h.kind == H2_PUSH_PROMISE, red);
            }
            H2_HEADERS | H2_CONTINUATION | H2_PUSH_PROMISE => {
                // Split across syscalls or frames: cannot be parsed safely, so none of it is kept.
                red.headers += 1;
                body.push((i, i + take));
            }
            _ => {}
        }
        i += take;
        h.left -= take as u32;
        if h.left == 0 && h.kind == H2_CONTINUATION && h.hdr[4] & 0x4 != 0 {
            h.continuing = false;
        }
    }
    i
}

/// HPACK (RFC 7541) static-table indices of sensitive header names.
const HPACK_SECRET_IDX: &[u64] = &[23, 32, 49, 55];

fn hpack_int(b: &[u8], at: usize, prefix: u8) -> Option<(u64, usize)> {
    let max = (1u64 << prefix) - 1;
    let first = u64::from(*b.get(at)?) & max;
    if first < max {
        return Some((first, at + 1));
    }
    let mut v = max;
    let mut shift = 0;
    let mut p = at + 1;
    loop {
        let c = *b.get(p)?;
        v = v.checked_add(u64::from(c & 0x7f).checked_shl(shift)?)?;
        p += 1;
        if c & 0x80 == 0 {
            return Some((v, p));
        }
        shift += 7;
        if shift > 56 {
            return None;
        }
    }
}

/// Mask literal values of secret headers in one header block fragment `b[from..to]`.
fn hpack_mask(b: &mut [u8], from: usize, to: usize, padded: bool, prio: bool, promise: bool, red: &mut Redacted) {
    let mut p = from;
    let mut to = to;
    if padded {
        let Some(&padlen) = b.get(p) else { return };
        p += 1;
        to = to.saturating_sub(usize::from(padlen));
    }
    if prio {
        p += 5;
    }
    if promise {
        p += 4;
    }
    while p < to {
        let Some(&c) = b.get(p) else { return };
        let (name_idx, next) = if c & 0x80 != 0 {
            // Indexed field: no literal bytes.
            match hpack_int(b, p, 7) {
                Some((_, np)) => {
                    p = np;
                    continue;
                }
                None => return,
            }
        } else if c & 0x40 != 0 {
            match hpack_int(b, p, 6) {
                Some(v) => v,
                None => return,
            }
        } else if c & 0x20 != 0 {
            // Dynamic table size update.
            match hpack_int(b, p, 5) {
                Some((_, np)) => {
                    p = np;
                    continue;
                }
                None => return,
            }
        } else {
            match hpack_int(b, p, 4) {
                Some(v) => v,
                None => return,
            }
        };
        p = next;
        let mut secret = HPACK_SECRET_IDX.contains(&name_idx);
        if name_idx == 0 {
            let Some(&hb) = b.get(p) else { return };
            let Some((len, np)) = hpack_int(b, p, 7) else { return };
            let Some(name) = b.get(np..np + len as usize) else { return };
            // Huffman-coded names are not decoded; plain ones are checked.
            secret = hb & 0x80 == 0 && SECRET_HEADERS.iter().any(|s| s.as_bytes().eq_ignore_ascii_case(name));
            p = np + len as usize;
        }
        let Some((len, np)) = hpack_int(b, p, 7) else { return };
        let vend = np.saturating_add(len as usize);
        if secret && vend <= to {
            if let Some(first) = b.get_mut(p) {
                // Plain (not Huffman) so the masked value still decodes, with the same length.
                *first &= 0x7f;
            }
            if let Some(v) = b.get_mut(np..vend) {
                v.fill(b'*');
            }
            red.headers += 1;
        }
        p = vend;
    }
}
