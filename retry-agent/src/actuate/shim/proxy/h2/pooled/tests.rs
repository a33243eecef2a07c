//! The multiplexing relay driven frame by frame, without sockets: a client relay and a
//! pooled connection fed arbitrary conversations (the async paths run over real sockets in
//! `h2/tests`).
use std::net::SocketAddr;

use bytes::BytesMut;

use super::{Client, mux::Detached, read_u32};
use crate::actuate::shim::proxy::{
    h2::{
        conversation::{Rng, request, response},
        frame::{self, Head, RST_STREAM},
    },
    test_support::{conn_to, ctx, suppress},
};

#[test]
fn u32_needs_four_bytes() {
    assert_eq!(read_u32(&[0, 0, 1, 0, 9]), Some(256));
    assert_eq!(read_u32(&[0, 0, 1]), None);
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
    let mut rng = Rng::new(0x2545_f491_4f6c_dd1d);
    let mut next = move |n: u64| rng.below(n);
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
        let mut draw = Rng::new(next(u64::MAX));
        for k in 0..(next(6) + 1) as u32 {
            let stream = 2 * k + 1;
            let before = mux.last_id();
            let (w, grpc) = request(&mut draw, stream);
            feed_client(&mut c, &mut cbuf, w, &mut next, &mut corrupted);
            // The held request, if any, decided (as its deadline would).
            c.on_client(&mut cbuf, true);
            let Some(id) = mux.last_id().filter(|id| Some(*id) != before) else {
                continue;
            };
            let mut w = response(&mut draw, id, grpc);
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
