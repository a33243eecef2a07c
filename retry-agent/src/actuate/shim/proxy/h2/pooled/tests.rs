//! The multiplexing relay driven frame by frame, without sockets: a client relay and a
//! pooled connection fed arbitrary conversations (the async paths run over real sockets in
//! `h2/tests`).
use std::net::SocketAddr;

use bytes::BytesMut;

use super::{Client, mux::Detached, read_u32};
use crate::actuate::shim::proxy::{
    h2::frame::{self, CONTINUATION, DATA, END_HEADERS, END_STREAM, HEADERS, Head, RST_STREAM},
    test_support::{conn_to, ctx, suppress},
};

#[test]
fn u32_needs_four_bytes() {
    assert_eq!(read_u32(&[0, 0, 1, 0, 9]), Some(256));
    assert_eq!(read_u32(&[0, 0, 1]), None);
}

fn block(fields: &[(&str, &str)]) -> BytesMut {
    let mut b = BytesMut::new();
    for (n, v) in fields {
        frame::put_literal(&mut b, n.as_bytes(), v.as_bytes());
    }
    b
}

/// A block as HEADERS, or split in two with a CONTINUATION.
fn put(w: &mut BytesMut, stream: u32, end: bool, b: &[u8], split: bool) {
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

/// Frames of `kind` in `b`, by stream.
fn frames_of(b: &[u8], kind: u8) -> Vec<Head> {
    let mut at = 0;
    let mut v = Vec::new();
    while let Some(h) = b.get(at..).and_then(Head::parse) {
        if h.kind == kind {
            v.push(h);
        }
        at += h.total();
    }
    v
}

/// Requests and responses, some corrupted, cut at random, some streams reset by either side:
/// the relay never panics, writes only what the conversation accounts for, and when nothing
/// was corrupted it forgets every stream once both sides ended (no stream outlives its
/// exchange on the shared connection, which would count against the callee's limit forever).
#[test]
fn arbitrary_conversations_never_panic_or_leak_streams() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _g = rt.enter();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n.max(1)
    };
    let orig: SocketAddr = "127.0.0.1:9".parse().expect("addr");
    // requests, suppressed, failed connections, clean rounds, streams the callee reset
    let mut seen = [0u64; 5];
    for round in 0..2_000 {
        let ctx = ctx();
        if round % 2 == 0 {
            suppress(&ctx, orig, "unclaimed");
        }
        let mux = Detached::new(orig);
        let mut c = Client::new(ctx.clone(), conn_to(orig));
        c.mux = Some(mux.0.clone());
        let mut cbuf = BytesMut::new();
        let mut corrupted = false;
        let mut read = 0usize;
        // Client bytes in random pieces; a bit flipped now and then.
        let mut feed_client = |c: &mut Client,
                               cbuf: &mut BytesMut,
                               mut w: BytesMut,
                               next: &mut dyn FnMut(u64) -> u64,
                               corrupted: &mut bool| {
            if next(10) == 0 && !w.is_empty() {
                let i = next(w.len() as u64) as usize;
                w[i] ^= 1 << next(8);
                *corrupted = true;
            }
            read += w.len();
            while !w.is_empty() {
                let n = (next(64) + 1) as usize;
                cbuf.extend_from_slice(&w.split_to(n.min(w.len())));
                c.on_client(cbuf, next(4) == 0);
            }
        };
        let mut w = BytesMut::from(&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..]);
        frame::put_settings(&mut w, &[(frame::SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20)]);
        feed_client(&mut c, &mut cbuf, w, &mut next, &mut corrupted);
        let mut w = BytesMut::new();
        frame::put_settings(&mut w, &[(frame::SETTINGS_MAX_CONCURRENT_STREAMS, 2)]);
        mux.feed_callee(&mut w).expect("callee SETTINGS");
        let mut callee_reset = false;
        for k in 0..(next(6) + 1) as u32 {
            let stream = 2 * k + 1;
            let grpc = next(2) == 0;
            let path = format!("/p{}", next(2));
            let mut fields = vec![
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path.as_str()),
                (":authority", "b"),
            ];
            if grpc {
                fields.push(("content-type", "application/grpc"));
            }
            if next(6) == 0 {
                fields.push(("x-retry-attempt", "1"));
            }
            let bodyless = next(4) == 0;
            let before = mux.last_id();
            let mut w = BytesMut::new();
            put(&mut w, stream, bodyless, &block(&fields), next(2) == 0);
            if !bodyless {
                let body = [b'b', next(2) as u8];
                if next(4) == 0 {
                    // Padded: pad length 2, the body, two bytes of padding.
                    frame::put_head(&mut w, 5, DATA, END_STREAM | 0x8, stream);
                    w.extend_from_slice(&[2, body[0], body[1], 0, 0]);
                } else {
                    frame::put_head(&mut w, 2, DATA, END_STREAM, stream);
                    w.extend_from_slice(&body);
                }
            }
            if next(10) == 0 {
                frame::put_rst(&mut w, stream, 8);
            }
            feed_client(&mut c, &mut cbuf, w, &mut next, &mut corrupted);
            // The held request, if any, decided (as its deadline would).
            c.on_client(&mut cbuf, true);
            let Some(id) = mux.last_id().filter(|id| Some(*id) != before) else {
                continue;
            };
            let mut w = BytesMut::new();
            let status = if next(2) == 0 { "503" } else { "200" };
            let gs = if next(2) == 0 { "14" } else { "0" };
            put(
                &mut w,
                id,
                false,
                &block(&[(":status", status)]),
                next(2) == 0,
            );
            frame::put_head(&mut w, 1, DATA, if grpc { 0 } else { END_STREAM }, id);
            w.extend_from_slice(b"x");
            if grpc {
                put(&mut w, id, true, &block(&[("grpc-status", gs)]), false);
            }
            if next(12) == 0 {
                frame::put_rst(&mut w, id, 2);
                callee_reset = true;
            }
            if mux.feed_callee(&mut w).is_err() {
                corrupted = true;
            }
            c.on_events();
        }
        if next(20) == 0 {
            // The callee's connection ends under whatever is open.
            mux.end();
            c.on_events();
            seen[2] += 1;
        }
        let n = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        seen[0] += n(&ctx.stats.requests);
        seen[1] += n(&ctx.stats.suppressed);
        seen[2] += u64::from(c.failed.is_some());
        seen[4] += u64::from(callee_reset);
        let to_callee = mux.take_out();
        // Its own frames: SETTINGS, credits, local answers, claims, literals re-encoded.
        let written = to_callee.len() + c.out.len();
        assert!(
            written <= 4 * read + 4096,
            "round {round}: read {read}, wrote {written}"
        );
        if !corrupted && c.failed.is_none() {
            seen[3] += 1;
            assert_eq!(
                mux.followed(),
                (0, 0),
                "round {round}: streams left on the callee's connection"
            );
            assert!(
                c.streams.is_empty(),
                "round {round}: client streams left: {:?}",
                c.streams.keys().collect::<Vec<_>>()
            );
            // Every stream the client was answered on ended, by the callee or by the relay.
            let rst = frames_of(&c.out, RST_STREAM).len();
            assert!(rst <= 8, "round {round}: {rst} resets");
        }
    }
    assert!(
        seen.iter().all(|&n| n > 20),
        "requests, suppressed, failed, clean, callee resets: {seen:?}"
    );
}
