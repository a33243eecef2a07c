//! Random h2c conversations for the relays' frame-by-frame tests: one generator, so the frame
//! relay and the multiplexing relay are driven by the same kinds of frames.
use bytes::BytesMut;

use super::frame::{self, CONTINUATION, DATA, END_HEADERS, END_STREAM, HEADERS};

/// xorshift: the same draw on every run.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// A number below `n` (0 for n ≤ 1).
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// Fields as literals without indexing.
pub(super) fn block(fields: &[(&str, &str)]) -> BytesMut {
    let mut b = BytesMut::new();
    for (n, v) in fields {
        frame::put_literal(&mut b, n.as_bytes(), v.as_bytes());
    }
    b
}

/// A block as HEADERS, or split in two with a CONTINUATION.
pub(super) fn put(w: &mut BytesMut, stream: u32, end: bool, b: &[u8], split: bool) {
    let es = if end { END_STREAM } else { 0 };
    if split && b.len() > 1 {
        let (x, y) = b.split_at(b.len() / 2);
        frame::put_head(w, x.len(), HEADERS, es, stream);
        w.extend_from_slice(x);
        frame::put_head(w, y.len(), CONTINUATION, END_HEADERS, stream);
        w.extend_from_slice(y);
    } else {
        frame::put_head(w, b.len(), HEADERS, es | END_HEADERS, stream);
        w.extend_from_slice(b);
    }
}

/// A request on `stream`: one of two paths, gRPC or not, now and then a retry marker; a
/// two-byte body (padded now and then) or none; now and then a reset and an extension frame
/// after it. Returns its frames and whether it is gRPC.
pub(super) fn request(rng: &mut Rng, stream: u32) -> (BytesMut, bool) {
    let grpc = rng.below(2) == 0;
    let path = format!("/p{}", rng.below(2));
    let mut fields = vec![
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path.as_str()),
        (":authority", "b"),
    ];
    if grpc {
        fields.push(("content-type", "application/grpc"));
    }
    if rng.below(6) == 0 {
        fields.push(("x-retry-attempt", "1"));
    }
    let bodyless = rng.below(4) == 0;
    let mut w = BytesMut::new();
    let split = rng.below(2) == 0;
    put(&mut w, stream, bodyless, &block(&fields), split);
    if !bodyless {
        let body = [b'b', rng.below(2) as u8];
        if rng.below(4) == 0 {
            // Padded: pad length 2, the body, two bytes of padding.
            frame::put_head(&mut w, 5, DATA, END_STREAM | 0x8, stream);
            w.extend_from_slice(&[2, body[0], body[1], 0, 0]);
        } else {
            frame::put_head(&mut w, 2, DATA, END_STREAM, stream);
            w.extend_from_slice(&body);
        }
    }
    if rng.below(10) == 0 {
        frame::put_rst(&mut w, stream, 8);
    }
    if rng.below(10) == 0 {
        frame::put_head(&mut w, 3, 0x2a, 0, 0);
        w.extend_from_slice(b"ext");
    }
    (w, grpc)
}

/// A response on `stream`: 200 or 503 and a byte; for gRPC, trailers with status 0 or 14 after
/// it, or a trailers-only answer.
pub(super) fn response(rng: &mut Rng, stream: u32, grpc: bool) -> BytesMut {
    let mut w = BytesMut::new();
    let status = if rng.below(2) == 0 { "503" } else { "200" };
    let gs = if rng.below(2) == 0 { "14" } else { "0" };
    let split = rng.below(2) == 0;
    if grpc && rng.below(2) == 0 {
        put(
            &mut w,
            stream,
            true,
            &block(&[(":status", "200"), ("grpc-status", gs)]),
            split,
        );
        return w;
    }
    put(&mut w, stream, false, &block(&[(":status", status)]), split);
    frame::put_head(&mut w, 1, DATA, if grpc { 0 } else { END_STREAM }, stream);
    w.extend_from_slice(b"x");
    if grpc {
        put(&mut w, stream, true, &block(&[("grpc-status", gs)]), false);
    }
    w
}
