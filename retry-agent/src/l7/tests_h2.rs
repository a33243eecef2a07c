//! HTTP/2 and gRPC: frames built by hand, header blocks by the HPACK encoder (and one
//! Huffman-coded block from RFC 7541 §C.4, as real peers send them).
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use super::tests::{PID, conn_ev, data, data_tid, data_trunc, run, run_split_invariant};
use super::*;
use crate::capture::{ConnEventKind, Direction, Event, Role};

use Direction::{Egress as OUT, Ingress as IN};

const H: u8 = 0x1;
const D: u8 = 0x0;
const RST: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const CONT: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// One peer's HPACK encoder: blocks refer to earlier ones through the dynamic table.
struct Peer(loona_hpack::Encoder<'static>);

impl Peer {
    fn new() -> Self {
        Peer(loona_hpack::Encoder::new())
    }
    fn headers(&mut self, stream: u32, end_stream: bool, hs: &[(&str, &str)]) -> Vec<u8> {
        let block = self
            .0
            .encode(hs.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())));
        frame(
            H,
            END_HEADERS | if end_stream { END_STREAM } else { 0 },
            stream,
            &block,
        )
    }
}

/// A write of `whole` on client connection fd 3 of which capture kept the first `kept` bytes.
fn cut(dir: Direction, ts: u64, whole: &[u8], kept: usize) -> Event {
    data_trunc(
        3,
        Role::Client,
        dir,
        ts,
        7,
        &whole[..kept],
        whole.len() as u64,
    )
}

fn grpc_msg(body: &[u8]) -> Vec<u8> {
    let mut m = vec![0u8];
    m.extend_from_slice(&(body.len() as u32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

fn req_headers(path: &str) -> Vec<(&'static str, String)> {
    vec![
        (":method", "POST".into()),
        (":scheme", "http".into()),
        (":path", path.into()),
        (":authority", "orders:50051".into()),
        ("content-type", "application/grpc".into()),
        ("te", "trailers".into()),
    ]
}

fn hs<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    v.iter().map(|(n, s)| (*n, s.as_str())).collect()
}

/// A gRPC client connection: preface, SETTINGS, then the given client and server writes.
fn client_conn(fd: u32, writes: Vec<(Direction, Vec<u8>)>) -> Vec<Event> {
    let mut ev = vec![conn_ev(
        fd,
        Role::Client,
        1,
        ConnEventKind::Connect { errno: 0 },
    )];
    let mut first = http2::PREFACE.to_vec();
    first.extend(frame(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 100]));
    ev.push(data(fd, Role::Client, OUT, 5, &first));
    ev.push(data(fd, Role::Client, IN, 6, &frame(SETTINGS, 0, 0, &[])));
    for (i, (dir, bytes)) in writes.into_iter().enumerate() {
        ev.push(data(fd, Role::Client, dir, 10 + 10 * i as u64, &bytes));
    }
    ev
}

fn unary(
    client: &mut Peer,
    server: &mut Peer,
    stream: u32,
    path: &str,
    trailers: &[(&str, &str)],
) -> Vec<(Direction, Vec<u8>)> {
    let mut req = client.headers(stream, false, &hs(&req_headers(path)));
    req.extend(frame(D, END_STREAM, stream, &grpc_msg(b"\x0a\x03abc")));
    let mut resp = server.headers(
        stream,
        false,
        &[(":status", "200"), ("content-type", "application/grpc")],
    );
    resp.extend(frame(D, 0, stream, &grpc_msg(b"\x08\x01")));
    resp.extend(server.headers(stream, true, trailers));
    vec![(OUT, req), (IN, resp)]
}

#[test]
fn grpc_unary_calls_and_trailer_statuses() {
    let (mut c, mut s) = (Peer::new(), Peer::new());
    let mut w = unary(
        &mut c,
        &mut s,
        1,
        "/shop.Orders/Get",
        &[("grpc-status", "0")],
    );
    w.extend(unary(
        &mut c,
        &mut s,
        3,
        "/shop.Orders/Get",
        &[("grpc-status", "14"), ("grpc-message", "backend down")],
    ));
    w.extend(unary(
        &mut c,
        &mut s,
        5,
        "/shop.Orders/Put",
        &[("grpc-status", "8"), ("grpc-retry-pushback-ms", "-1")],
    ));
    w.extend(unary(
        &mut c,
        &mut s,
        7,
        "/shop.Orders/Put",
        &[("grpc-status", "3")],
    ));
    let ev = client_conn(3, w);
    let ex = run_split_invariant(&ev);
    let got: Vec<_> = ex
        .iter()
        .map(|e| (e.stream_id, e.grpc_status, e.outcome))
        .collect();
    assert_eq!(
        got,
        vec![
            (Some(1), Some(0), OutcomeClass::Success),
            (Some(3), Some(14), OutcomeClass::Transient),
            (Some(5), Some(8), OutcomeClass::Overload),
            (Some(7), Some(3), OutcomeClass::Semantic),
        ]
    );
    let e = &ex[0];
    assert_eq!(e.protocol, Protocol::Http2);
    assert_eq!(e.method, Some(Method::Post));
    assert_eq!(e.path.as_deref(), Some("/shop.Orders/Get"));
    assert_eq!(e.authority.as_deref(), Some("orders:50051"));
    assert_eq!(e.status, Some(200));
    assert!(!e.idempotent && !e.unknown);
    assert!(e.body_hash.is_some());
    assert_eq!(ex[1].body_hash, e.body_hash);
    assert!(ex[2].retry_after, "pushback");
    assert_eq!((e.request_start_ns, e.response_end_ns), (10, Some(25)));
}

#[test]
fn trailers_only_response_and_retry_marker() {
    let (mut c, mut s) = (Peer::new(), Peer::new());
    let mut h = req_headers("/svc/M");
    h.push(("grpc-previous-rpc-attempts", "2".into()));
    let mut req = c.headers(1, false, &hs(&h));
    req.extend(frame(D, END_STREAM, 1, &grpc_msg(b"x")));
    let resp = s.headers(
        1,
        true,
        &[
            (":status", "200"),
            ("content-type", "application/grpc"),
            ("grpc-status", "14"),
        ],
    );
    let ex = run_split_invariant(&client_conn(3, vec![(OUT, req), (IN, resp)]));
    assert_eq!(ex.len(), 1);
    assert_eq!(ex[0].retry_markers.grpc_previous_attempts, Some(2));
    assert!(ex[0].retry_markers.says_retry());
    assert_eq!(
        (ex[0].grpc_status, ex[0].outcome),
        (Some(14), OutcomeClass::Transient)
    );
}

#[test]
fn many_concurrent_streams_pair_by_stream_id() {
    let (mut c, mut s) = (Peer::new(), Peer::new());
    let n = 101u32;
    let ids: Vec<u32> = (0..n).map(|i| 2 * i + 1).collect();
    let mut reqs = Vec::new();
    for &id in &ids {
        reqs.extend(c.headers(
            id,
            true,
            &hs(&[
                (":method", "GET".into()),
                (":scheme", "http".into()),
                (":path", format!("/items/{id}")),
                (":authority", "a".into()),
            ]),
        ));
    }
    // Answered in reverse order, interleaved: all heads first, then bodies.
    let mut resps = Vec::new();
    for &id in ids.iter().rev() {
        let st = if id % 3 == 0 { "503" } else { "200" };
        resps.extend(s.headers(id, false, &[(":status", st)]));
    }
    for &id in ids.iter().rev() {
        resps.extend(frame(D, END_STREAM, id, format!("body{id}").as_bytes()));
    }
    let ex = run_split_invariant(&client_conn(3, vec![(OUT, reqs), (IN, resps)]));
    assert_eq!(ex.len(), n as usize);
    for e in &ex {
        let id = e.stream_id.unwrap();
        assert_eq!(e.path.as_deref(), Some(format!("/items/{id}").as_str()));
        assert_eq!(e.route.as_deref(), Some("/items/{id}"));
        assert_eq!(e.status, Some(if id % 3 == 0 { 503 } else { 200 }));
        assert_eq!(e.method, Some(Method::Get));
        assert!(e.idempotent && !e.unknown);
    }
    assert_eq!(
        ex[0].stream_id,
        Some(ids[n as usize - 1]),
        "emitted as streams complete"
    );
}

#[test]
fn rst_stream_and_goaway_fail_the_affected_streams() {
    let (mut c, mut s) = (Peer::new(), Peer::new());
    let mut reqs = Vec::new();
    for id in [1, 3, 5, 7, 9] {
        reqs.extend(c.headers(id, true, &hs(&req_headers("/svc/M"))));
    }
    let mut resps = frame(RST, 0, 1, &7u32.to_be_bytes()); // REFUSED_STREAM
    resps.extend(s.headers(3, false, &[(":status", "200")]));
    resps.extend(frame(RST, 0, 3, &2u32.to_be_bytes())); // INTERNAL_ERROR mid-response
    let mut goaway = 5u32.to_be_bytes().to_vec();
    goaway.extend(0u32.to_be_bytes());
    goaway.extend(b"shutting down");
    resps.extend(frame(GOAWAY, 0, 0, &goaway));
    resps.extend(s.headers(5, true, &[(":status", "200"), ("grpc-status", "0")]));
    let client_cancel = frame(RST, 0, 9, &8u32.to_be_bytes());
    let ev = client_conn(3, vec![(OUT, reqs), (IN, resps), (OUT, client_cancel)]);
    let ex = run_split_invariant(&ev);
    let got: Vec<_> = ex
        .iter()
        .map(|e| (e.stream_id.unwrap(), e.failure, e.outcome))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, Some(Failure::RstStream(7)), OutcomeClass::Transient),
            (3, Some(Failure::RstStream(2)), OutcomeClass::Transient),
            (7, Some(Failure::GoAway(0)), OutcomeClass::Transient),
            (9, Some(Failure::GoAway(0)), OutcomeClass::Transient),
            (5, None, OutcomeClass::Success),
        ]
    );
    assert_eq!(ex[1].status, Some(200), "stream 3 had its head");
}

#[test]
fn continuation_frames_and_huffman_blocks() {
    // RFC 7541 C.4.1: Huffman-coded GET http://www.example.com/ .
    let huff = [
        0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90,
        0xf4, 0xff,
    ];
    let mut req = frame(H, END_STREAM, 1, &huff[..5]);
    req.extend(frame(CONT, 0, 1, &huff[5..9]));
    req.extend(frame(CONT, END_HEADERS, 1, &huff[9..]));
    let mut s = Peer::new();
    let resp = s.headers(1, true, &[(":status", "404")]);
    let ex = run_split_invariant(&client_conn(3, vec![(OUT, req), (IN, resp)]));
    assert_eq!(ex.len(), 1);
    assert_eq!(ex[0].method, Some(Method::Get));
    assert_eq!(ex[0].path.as_deref(), Some("/"));
    assert_eq!(ex[0].authority.as_deref(), Some("www.example.com"));
    assert_eq!(
        (ex[0].status, ex[0].outcome),
        (Some(404), OutcomeClass::Semantic)
    );
}

#[test]
fn server_side_grpc_with_server_preface_first() {
    let (mut c, mut s) = (Peer::new(), Peer::new());
    let mut ev = vec![conn_ev(4, Role::Server, 1, ConnEventKind::Accept)];
    // The server writes its SETTINGS before it reads the client preface.
    ev.push(data(
        4,
        Role::Server,
        OUT,
        2,
        &frame(SETTINGS, 0, 0, &[0, 4, 0, 1, 0, 0]),
    ));
    let mut first = http2::PREFACE.to_vec();
    first.extend(frame(SETTINGS, 0, 0, &[]));
    first.extend(c.headers(1, false, &hs(&req_headers("/svc/A"))));
    first.extend(frame(D, END_STREAM, 1, &grpc_msg(b"q")));
    ev.push(data(4, Role::Server, IN, 3, &first));
    let mut resp = s.headers(1, false, &[(":status", "200")]);
    resp.extend(frame(D, 0, 1, &grpc_msg(b"r")));
    resp.extend(s.headers(1, true, &[("grpc-status", "5")]));
    ev.push(data_trunc(
        4,
        Role::Server,
        OUT,
        4,
        9,
        &resp,
        resp.len() as u64,
    ));
    let ex = run_split_invariant(&ev);
    assert_eq!(ex.len(), 1, "{ex:#?}");
    assert_eq!(ex[0].role, Role::Server);
    assert_eq!(ex[0].path.as_deref(), Some("/svc/A"));
    assert_eq!(
        (ex[0].grpc_status, ex[0].outcome),
        (Some(5), OutcomeClass::Semantic)
    );
    assert_eq!(ex[0].response_tid, Some(9));
}

#[test]
fn mid_connection_start_is_unknown_and_the_next_connection_recovers() {
    let (mut c, mut s) = (Peer::new(), Peer::new());
    // Warm the encoders as an earlier, unseen part of the connection would have.
    let _ = c.headers(1, true, &hs(&req_headers("/svc/Warm")));
    let _ = s.headers(1, true, &[(":status", "200"), ("grpc-status", "0")]);
    let w = unary(&mut c, &mut s, 3, "/svc/Warm", &[("grpc-status", "0")]);
    let mut ev: Vec<Event> = Vec::new();
    for (i, (dir, b)) in w.into_iter().enumerate() {
        ev.push(data(3, Role::Client, dir, 10 + i as u64, &b));
    }
    let (ex, _) = run(&ev);
    assert_eq!(ex.len(), 1, "{ex:#?}");
    assert!(ex[0].unknown, "decoder state was unknowable");
    // The path went as a literal (read as sent); what referred to the unseen part did not
    // resolve, so the method is not vouched for, nor the 200 (its gRPC status did not resolve).
    assert_eq!(ex[0].path.as_deref(), Some("/svc/Warm"));
    assert_eq!(ex[0].method, None, "no guessed fields");
    assert_eq!(ex[0].stream_id, Some(3));
    assert_eq!(ex[0].outcome, OutcomeClass::Unknown);
    assert!(ex[0].outcome_unseen());
    // A fresh connection decodes again.
    let (mut c, mut s) = (Peer::new(), Peer::new());
    let mut all = ev.clone();
    all.extend(client_conn(
        4,
        unary(&mut c, &mut s, 1, "/svc/Fresh", &[("grpc-status", "0")]),
    ));
    let (ex, _) = run(&all);
    assert_eq!(ex.len(), 2);
    assert!(!ex[1].unknown);
    assert_eq!(ex[1].path.as_deref(), Some("/svc/Fresh"));
}

/// An HTTP/2 connection older than capture (an agent restarted among long-lived connections):
/// its blocks refer to a table whose start went by unseen. What they carry as literals, or
/// refer to entries added since, is read: a proxy's 503 is a failure of its edge, a new
/// path is its route. A 200 whose other fields did not resolve vouches for nothing (its gRPC
/// status may have been an error): its outcome is unseen, neither failure nor success. So is
/// an answer whose trailers did not resolve, whatever its head said.
#[test]
fn a_connection_older_than_capture_still_shows_its_failures() {
    let (mut c, mut s) = (Peer::new(), Peer::new());
    let warm: &[(&str, &str)] = &[
        (":status", "200"),
        ("content-type", "application/grpc"),
        ("grpc-status", "0"),
    ];
    // What the unseen start of the connection put into both tables.
    let _ = c.headers(1, true, &hs(&req_headers("/svc/Warm")));
    let _ = s.headers(1, true, warm);
    // A 503 from a proxy: `:status` by its static name, the value a literal.
    let mut w = vec![(OUT, c.headers(3, true, &hs(&req_headers("/svc/New"))))];
    w.push((
        IN,
        s.headers(
            3,
            true,
            &[(":status", "503"), ("content-type", "application/grpc")],
        ),
    ));
    // A trailers-only answer: its 200 is static, its grpc-status refers to the unseen part.
    w.push((OUT, c.headers(5, true, &hs(&req_headers("/svc/New")))));
    w.push((IN, s.headers(5, true, warm)));
    // A head read whole (a static 200, a content-type the 503 added), trailers that refer to
    // the unseen part.
    w.push((OUT, c.headers(7, true, &hs(&req_headers("/svc/New")))));
    let mut resp = s.headers(
        7,
        false,
        &[(":status", "200"), ("content-type", "application/grpc")],
    );
    resp.extend(s.headers(7, true, &[("grpc-status", "0")]));
    w.push((IN, resp));
    let mut ev: Vec<Event> = Vec::new();
    for (i, (dir, b)) in w.into_iter().enumerate() {
        ev.push(data(3, Role::Client, dir, 10 + i as u64, &b));
    }
    let (ex, _) = run(&ev);
    assert_eq!(ex.len(), 3, "{ex:#?}");
    let by = |id: u32| {
        ex.iter()
            .find(|x| x.stream_id == Some(id))
            .expect("the stream")
    };
    let failed = by(3);
    assert_eq!(failed.status, Some(503));
    assert_eq!(failed.outcome, OutcomeClass::Transient);
    assert!(failed.failure_seen());
    assert_eq!(failed.path.as_deref(), Some("/svc/New"));
    assert_eq!(failed.method, None, "the head is not all known");
    let trailers_only = by(5);
    assert_eq!(trailers_only.status, None, "{trailers_only:#?}");
    assert!(trailers_only.outcome_unseen());
    let late_trailers = by(7);
    assert_eq!(late_trailers.status, None, "{late_trailers:#?}");
    assert!(late_trailers.outcome_unseen());
}

/// A server that indexes its fields (Go's and nghttp2's encoders) answers a connection older
/// than capture with a static `:status` beside references into the unseen part of its table.
/// A head that leaves its stream open cannot carry a gRPC status, so its status stands: the
/// answer is a success, seen, not an unseen outcome (which it was while every unresolved head
/// lost its 200). Its trailers, if any, still decide for gRPC.
#[test]
fn an_open_head_with_unresolved_fields_keeps_its_status() {
    let mut c = Peer::new();
    let _ = c.headers(1, true, &hs(&req_headers("/warm")));
    // The server's blocks as an indexing encoder writes them: `:status` from the static table
    // (0x88: 200, 0x8d: 404), then its content-type from the dynamic entry it added in the
    // unseen start of the connection (0xbe: index 62).
    let head = |id: u32, status: u8, end_stream: bool| {
        let flags = END_HEADERS | if end_stream { END_STREAM } else { 0 };
        frame(H, flags, id, &[status, 0xbe])
    };
    let mut w = Vec::new();
    for (id, status) in [(3, 0x88), (5, 0x8d)] {
        w.push((OUT, c.headers(id, true, &hs(&req_headers("/page")))));
        let mut resp = head(id, status, false);
        resp.extend(frame(0, END_STREAM, id, b"body"));
        w.push((IN, resp));
    }
    // The same bytes as a trailers-only answer still vouch for no success.
    w.push((OUT, c.headers(7, true, &hs(&req_headers("/page")))));
    w.push((IN, head(7, 0x88, true)));
    let ev: Vec<Event> = w
        .into_iter()
        .enumerate()
        .map(|(i, (dir, b))| data(3, Role::Client, dir, 10 + i as u64, &b))
        .collect();
    let (ex, _) = run(&ev);
    let by = |id: u32| {
        ex.iter()
            .find(|x| x.stream_id == Some(id))
            .unwrap_or_else(|| panic!("no stream {id}: {ex:#?}"))
    };
    let ok = by(3);
    assert_eq!((ok.status, ok.outcome), (Some(200), OutcomeClass::Success));
    assert!(ok.unknown && !ok.outcome_unseen(), "{ok:#?}");
    let missing = by(5);
    assert_eq!(missing.status, Some(404));
    assert!(missing.failure_seen(), "{missing:#?}");
    let trailers_only = by(7);
    assert_eq!(trailers_only.status, None, "{trailers_only:#?}");
    assert!(trailers_only.outcome_unseen());
}

#[test]
fn truncated_header_block_makes_later_streams_unknown() {
    let (mut c, mut s) = (Peer::new(), Peer::new());
    let big = "v".repeat(3000);
    let mut h1 = req_headers("/svc/Big");
    h1.push(("x-big", big));
    let req1 = c.headers(1, true, &hs(&h1));
    let req3 = c.headers(3, true, &hs(&req_headers("/svc/After")));
    let resp1 = s.headers(1, true, &[(":status", "200"), ("grpc-status", "0")]);
    let resp3 = s.headers(3, true, &[(":status", "200"), ("grpc-status", "0")]);
    let mut ev = client_conn(3, vec![]);
    ev.push(cut(OUT, 10, &req1, 200));
    ev.push(data(3, Role::Client, IN, 20, &resp1));
    ev.push(data(3, Role::Client, OUT, 30, &req3));
    ev.push(data(3, Role::Client, IN, 40, &resp3));
    let (ex, stats) = run(&ev);
    assert_eq!(ex.len(), 2, "{ex:#?}");
    // The captured prefix of the block still told method and path; the rest is unknown.
    assert!(ex[0].unknown);
    assert_eq!(ex[0].path.as_deref(), Some("/svc/Big"));
    assert_eq!(ex[0].method, Some(Method::Post));
    assert!(
        ex[1].unknown && ex[1].method.is_none(),
        "the request decoder lost its table"
    );
    assert_eq!(
        ex[1].path.as_deref(),
        Some("/svc/After"),
        "a literal is read"
    );
    assert_eq!(
        ex[1].status,
        Some(200),
        "the response decoder is still in sync"
    );
    assert_eq!(ex[1].outcome, OutcomeClass::Success);
    assert_eq!(stats.truncations, 1);
}

/// A trailers-only answer (gRPC's error form: status, then grpc-status, in one block that ends
/// the stream) captured in part: its 200 vouches for nothing, the gRPC status went uncaptured.
#[test]
fn a_cut_trailers_only_answer_is_no_success() {
    let (mut c, mut s) = (Peer::new(), Peer::new());
    let req = c.headers(1, true, &hs(&req_headers("/svc/Fails")));
    let big = "v".repeat(3000);
    let resp = s.headers(
        1,
        true,
        &[(":status", "200"), ("x-big", &big), ("grpc-status", "14")],
    );
    let mut ev = client_conn(3, vec![(OUT, req)]);
    ev.push(cut(IN, 40, &resp, 100));
    let (ex, stats) = run(&ev);
    assert_eq!(ex.len(), 1, "{ex:#?}");
    assert_eq!(ex[0].status, None, "{:#?}", ex[0]);
    assert!(ex[0].outcome_unseen());
    assert_eq!(stats.truncations, 1);
}

/// A header block larger than the connection's buffer, captured whole in one syscall: read
/// where it lies, it is cut at the same byte as when its frame arrives in pieces and is
/// buffered (same exchanges, same truncation count).
#[test]
fn block_over_the_buffer_cap_is_cut_alike_whole_or_in_pieces() {
    let (mut c, mut s) = (Peer::new(), Peer::new());
    let mut h1 = req_headers("/svc/Big");
    h1.push(("x-big", "v".repeat(3000)));
    let mut w = vec![(OUT, c.headers(1, true, &hs(&h1)))];
    w.push((
        IN,
        s.headers(1, true, &[(":status", "200"), ("grpc-status", "0")]),
    ));
    w.push((OUT, c.headers(3, true, &hs(&req_headers("/svc/After")))));
    w.push((
        IN,
        s.headers(3, true, &[(":status", "200"), ("grpc-status", "0")]),
    ));
    let ev = client_conn(3, w);
    let run_capped = |ev: &[Event]| {
        let mut r = Reassembler::new(L7Config {
            conn_buffer_bytes: 1024,
            ..L7Config::default()
        });
        let mut out = Vec::new();
        for e in ev {
            r.push(e, &mut out);
        }
        (out, r.stats().truncations)
    };
    let (ex, truncations) = run_capped(&ev);
    assert_eq!(ex.len(), 2, "{ex:#?}");
    assert!(ex[0].unknown);
    assert_eq!(ex[0].path.as_deref(), Some("/svc/Big"));
    assert!(
        ex[1].unknown && ex[1].method.is_none(),
        "the table is unknowable after the cut"
    );
    assert_eq!(ex[1].status, Some(200));
    assert_eq!(truncations, 1);
    for n in [7, 1000] {
        assert_eq!(
            run_capped(&super::tests::split(&ev, n)),
            (ex.clone(), truncations),
            "{n}-byte pieces"
        );
    }
}

#[test]
fn close_with_open_streams() {
    let (mut c, _) = (Peer::new(), Peer::new());
    let reqs = c.headers(1, true, &hs(&req_headers("/svc/Slow")));
    let mut ev = client_conn(3, vec![(OUT, reqs)]);
    ev.push(conn_ev(3, Role::Client, 100, ConnEventKind::Close));
    let (ex, _) = run(&ev);
    assert_eq!(ex.len(), 1);
    assert_eq!(
        (ex[0].failure, ex[0].outcome),
        (Some(Failure::Abandoned), OutcomeClass::Unknown)
    );
    assert_eq!(ex[0].pid, PID);
}

#[test]
fn padding_and_priority_are_stripped() {
    let mut c = Peer::new();
    let block = c.0.encode(
        hs(&req_headers("/svc/Padded"))
            .iter()
            .map(|(n, v)| (n.as_bytes(), v.as_bytes())),
    );
    // PADDED | PRIORITY | END_HEADERS: pad length, 5 priority bytes, block, padding.
    let mut p = vec![3u8, 0, 0, 0, 0, 16];
    p.extend_from_slice(&block);
    p.extend_from_slice(&[0, 0, 0]);
    let mut req = frame(H, 0x8 | 0x20 | END_HEADERS, 1, &p);
    let mut d = vec![2u8];
    d.extend_from_slice(&grpc_msg(b"abc"));
    d.extend_from_slice(&[0, 0]);
    req.extend(frame(D, END_STREAM | 0x8, 1, &d));
    let mut s = Peer::new();
    let resp = s.headers(1, true, &[(":status", "200"), ("grpc-status", "0")]);
    let ex = run_split_invariant(&client_conn(3, vec![(OUT, req), (IN, resp)]));
    assert_eq!(ex.len(), 1);
    assert_eq!(ex[0].path.as_deref(), Some("/svc/Padded"));
    assert!(!ex[0].unknown);
    assert_eq!(ex[0].outcome, OutcomeClass::Success);
}

#[test]
fn writes_resync_after_a_gap_over_frame_headers() {
    // A vectored write whose capture holds only its first piece: the gap covers the rest of
    // a header block and the next frame's header. The next write starts at a frame again.
    let (mut c, mut s) = (Peer::new(), Peer::new());
    let mut ev = client_conn(3, vec![]);
    for (i, id) in [1u32, 3, 5].into_iter().enumerate() {
        let mut w = c.headers(id, false, &hs(&req_headers("/svc/M")));
        w.extend(frame(D, END_STREAM, id, &grpc_msg(b"x")));
        let ts = 100 * (i as u64 + 1);
        ev.push(data_trunc(
            3,
            Role::Client,
            OUT,
            ts,
            7,
            &w[..11],
            w.len() as u64,
        ));
        let resp = s.headers(id, true, &[(":status", "200"), ("grpc-status", "14")]);
        ev.push(data(3, Role::Client, IN, ts + 10, &resp));
    }
    let (ex, stats) = run(&ev);
    assert_eq!(ex.len(), 3, "{ex:#?}");
    for e in &ex {
        assert!(
            e.unknown && e.path.is_none(),
            "request blocks were cut: {e:#?}"
        );
        assert_eq!(
            (e.grpc_status, e.outcome),
            (Some(14), OutcomeClass::Transient),
            "responses were whole"
        );
        assert_eq!(e.failure, None);
    }
    assert!(stats.truncations >= 3, "{stats:?}");
}

/// `curl --http2 http://…`: an HTTP/1.1 request with `Upgrade: h2c`, a 101, then HTTP/2 on the
/// same connection; the upgraded request is answered on stream 1, later ones on their streams.
/// The server's first frames may share the write of its 101.
#[test]
fn h2c_upgrade_continues_as_http2() {
    let (mut c, mut s) = (Peer::new(), Peer::new());
    let up = b"GET /up HTTP/1.1\r\nHost: a:80\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n";
    let mut switch =
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n".to_vec();
    switch.extend(frame(SETTINGS, 0, 0, &[]));
    let mut preface = http2::PREFACE.to_vec();
    preface.extend(frame(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 100]));
    let mut resp1 = s.headers(1, false, &[(":status", "200")]);
    resp1.extend(frame(D, END_STREAM, 1, b"hello"));
    let req3 = c.headers(
        3,
        true,
        &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/next"),
            (":authority", "a:80"),
        ],
    );
    let resp3 = s.headers(3, true, &[(":status", "503")]);
    let ev = vec![
        conn_ev(3, Role::Client, 1, ConnEventKind::Connect { errno: 0 }),
        data(3, Role::Client, OUT, 10, up),
        data(3, Role::Client, IN, 20, &switch),
        data(3, Role::Client, OUT, 30, &preface),
        data(3, Role::Client, IN, 40, &resp1),
        data(3, Role::Client, OUT, 50, &req3),
        data(3, Role::Client, IN, 60, &resp3),
    ];
    let ex = run_split_invariant(&ev);
    let got: Vec<_> = ex
        .iter()
        .map(|e| (e.path.clone(), e.status, e.stream_id, e.unknown))
        .collect();
    assert_eq!(
        got,
        vec![
            (Some("/up".into()), Some(200), Some(1), false),
            (Some("/next".into()), Some(503), Some(3), false)
        ]
    );
    assert_eq!(ex[0].method, Some(Method::Get));
    assert_eq!(ex[0].protocol, Protocol::Http2);
    // A 101 to another protocol (WebSocket) still stops parsing.
    let ws = vec![
        conn_ev(4, Role::Client, 1, ConnEventKind::Connect { errno: 0 }),
        data(4, Role::Client, OUT, 10, b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"),
        data(4, Role::Client, IN, 20, b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"),
        data(4, Role::Client, OUT, 30, b"\x81\x05hello"),
    ];
    let (ex, _) = run(&ws);
    assert_eq!(
        ex.iter().map(|e| e.status).collect::<Vec<_>>(),
        vec![Some(101)]
    );
}

/// Streams in flight on one connection are bounded: beyond `max_inflight` the oldest is given
/// up (unknown) and counted as an eviction.
#[test]
fn concurrent_streams_are_bounded_and_counted_as_evictions() {
    let mut c = Peer::new();
    let writes: Vec<(Direction, Vec<u8>)> = [1u32, 3, 5, 7]
        .iter()
        .map(|&id| {
            (
                OUT,
                c.headers(id, true, &hs(&req_headers("/shop.Orders/Get"))),
            )
        })
        .collect();
    let cfg = L7Config {
        max_inflight: 2,
        ..L7Config::default()
    };
    let mut r = Reassembler::new(cfg);
    let mut out = Vec::new();
    for e in client_conn(3, writes) {
        r.push(&e, &mut out);
    }
    let given_up: Vec<_> = out.iter().map(|e| (e.stream_id, e.unknown)).collect();
    assert_eq!(given_up, vec![(Some(1), true), (Some(3), true)]);
    assert_eq!(
        (r.stats().evictions_inflight, r.stats().evictions()),
        (2, 2)
    );
}

#[test]
fn propagated_trace_id_is_read_from_hpack_headers() {
    let (mut c, mut s) = (Peer::new(), Peer::new());
    let mut h1 = req_headers("/svc/A");
    h1.push((
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
    ));
    let mut h3 = req_headers("/svc/A");
    h3.push((
        "b3",
        "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1".into(),
    ));
    let mut h5 = req_headers("/svc/A");
    h5.push(("uber-trace-id", "not-an-id".into()));
    let mut out = Vec::new();
    for (sid, h) in [(1, &h1), (3, &h3), (5, &h5)] {
        out.extend(c.headers(sid, true, &hs(h)));
    }
    let mut inb = Vec::new();
    for sid in [1, 3, 5] {
        inb.extend(s.headers(sid, true, &[(":status", "200")]));
    }
    let ex = run_split_invariant(&client_conn(3, vec![(OUT, out), (IN, inb)]));
    assert_eq!(ex.len(), 3);
    let by = |sid| {
        ex.iter()
            .find(|e| e.stream_id == Some(sid))
            .and_then(|e| e.trace_id)
    };
    assert!(by(1).is_some());
    assert_eq!(by(3), by(1));
    assert_eq!(by(5), None);
}

/// gRPC-go: a Go probe binds each stream to its request context. A server stream bound after
/// its HEADERS were read takes the context and the handler's start; when the same goroutine
/// takes another stream before the first one's response is written, the first handler is
/// over by then. A client stream bound before its HEADERS are seen (the writer goroutine was
/// slower than the caller) still gets its binding; a binding for nothing is counted.
#[test]
fn go_probe_bindings_give_streams_their_request_context() {
    let (mut c, mut s) = (Peer::new(), Peer::new());
    let g = 0xc000_0a00 | retry_common::GOROUTINE_ROOTED;
    let bind = |fd, role, ts, id| conn_ev(fd, role, ts, ConnEventKind::Stream { id, context: g });
    let mut ev = vec![conn_ev(4, Role::Server, 1, ConnEventKind::Accept)];
    let mut first = http2::PREFACE.to_vec();
    first.extend(frame(SETTINGS, 0, 0, &[]));
    first.extend(c.headers(1, false, &hs(&req_headers("/svc/A"))));
    first.extend(frame(D, END_STREAM, 1, &grpc_msg(b"q")));
    first.extend(c.headers(3, false, &hs(&req_headers("/svc/B"))));
    first.extend(frame(D, END_STREAM, 3, &grpc_msg(b"q")));
    ev.push(data(4, Role::Server, IN, 3, &first));
    ev.push(bind(4, Role::Server, 5, 1));
    // The same goroutine, reused, takes stream 3 before stream 1's answer is written.
    ev.push(bind(4, Role::Server, 8, 3));
    for id in [1, 3] {
        let mut resp = s.headers(id, false, &[(":status", "200")]);
        resp.extend(s.headers(id, true, &[("grpc-status", "14")]));
        ev.push(data(4, Role::Server, OUT, 10 + u64::from(id), &resp));
    }
    // A client connection whose stream 1 is bound before its HEADERS are written.
    ev.push(conn_ev(
        6,
        Role::Client,
        20,
        ConnEventKind::Connect { errno: 0 },
    ));
    let mut pre = http2::PREFACE.to_vec();
    pre.extend(frame(SETTINGS, 0, 0, &[]));
    ev.push(data(6, Role::Client, OUT, 21, &pre));
    ev.push(bind(6, Role::Client, 22, 1));
    let (mut c2, mut s2) = (Peer::new(), Peer::new());
    for (i, (dir, b)) in unary(&mut c2, &mut s2, 1, "/svc/C", &[("grpc-status", "0")])
        .into_iter()
        .enumerate()
    {
        ev.push(data(6, Role::Client, dir, 23 + i as u64, &b));
    }
    // A binding on a connection that is not HTTP/2 (nor tracked) binds nothing.
    ev.push(bind(9, Role::Client, 30, 1));
    let (ex, stats) = run(&ev);
    assert_eq!(ex.len(), 3, "{ex:#?}");
    let by_path = |p: &str| ex.iter().find(|x| x.path.as_deref() == Some(p)).unwrap();
    let a = by_path("/svc/A");
    assert_eq!(
        (a.goid, a.handler_start_ns, a.handler_end_ns),
        (Some(g), Some(5), Some(8))
    );
    let b = by_path("/svc/B");
    assert_eq!(
        (b.goid, b.handler_start_ns, b.handler_end_ns),
        (Some(g), Some(8), None)
    );
    let call = by_path("/svc/C");
    assert_eq!(call.role, Role::Client);
    assert_eq!((call.goid, call.handler_start_ns), (Some(g), None));
    assert_eq!(
        (stats.stream_bindings, stats.stream_bindings_unmatched),
        (3, 1)
    );
}
/// Repeated blocks of indexed fields (and literals without indexing) are answered from the
/// direction's memory, which any block that may change the dynamic table empties: the same
/// bytes then decode anew (here to another path, the table having shifted under them).
#[test]
fn repeated_indexed_blocks_decode_as_the_table_says() {
    // :method POST, :scheme http, then :path as a literal with incremental indexing (dynamic
    // entry 62), or as an index into the table (0xbe = entry 62).
    let literal = |p: &[u8]| {
        let mut b = vec![0x83, 0x86, 0x44, p.len() as u8];
        b.extend_from_slice(p);
        b
    };
    let indexed = vec![0x83, 0x86, 0xbe];
    // :path as a literal without indexing (static name 4): the table stays as it was.
    let unindexed = |p: &[u8]| {
        let mut b = vec![0x83, 0x86, 0x04, p.len() as u8];
        b.extend_from_slice(p);
        b
    };
    let blocks = [
        literal(b"/a"),
        indexed.clone(),
        indexed.clone(),
        literal(b"/b"),
        indexed.clone(),
        unindexed(b"/c"),
        unindexed(b"/c"),
        indexed.clone(),
        unindexed(b"/d"),
        unindexed(b"/c"),
    ];
    let mut writes = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        let id = 2 * i as u32 + 1;
        writes.push((OUT, frame(H, END_HEADERS | END_STREAM, id, b)));
        // :status 200 (static entry 8), every time the same indexed block.
        writes.push((IN, frame(H, END_HEADERS | END_STREAM, id, &[0x88])));
    }
    let (ex, stats) = run(&client_conn(3, writes));
    assert_eq!(stats.parse_errors, 0);
    let paths: Vec<_> = ex.iter().map(|x| x.path.as_deref()).collect();
    let want = ["/a", "/a", "/a", "/b", "/b", "/c", "/c", "/b", "/d", "/c"];
    assert_eq!(paths, want.map(Some));
    assert!(
        ex.iter().all(|x| x.status == Some(200) && !x.unknown),
        "{ex:#?}"
    );
}

#[test]
fn blocks_that_leave_the_table_alone_are_told_from_the_rest() {
    use super::http2::table_preserving as kept;
    assert!(kept(&[0x82, 0x86, 0xbe]));
    // A multi-byte index (127 + 1 + 2·128): continuation bytes until one without its high bit.
    assert!(kept(&[0xff, 0x81, 0x02, 0x88]));
    assert!(!kept(&[0xff, 0x81])); // cut inside the index
    assert!(!kept(&[0x82, 0x44, 0x01, b'/'])); // literal with incremental indexing
    assert!(!kept(&[0x20])); // dynamic table size update
    assert!(!kept(&[0x80])); // index 0: an error
    assert!(!kept(&[]));
    // Literals without indexing: an indexed name (`:path`, 4), a long index (content-type,
    // 31 = 15 + 16), a literal name; Huffman or not, the length says where they end.
    assert!(kept(&[0x04, 0x02, b'/', b'a', 0x82]));
    assert!(kept(&[0x0f, 0x10, 0x01, b'x']));
    assert!(kept(&[0x00, 0x02, b't', b'e', 0x83, 1, 2, 3]));
    assert!(!kept(&[0x04, 0x05, b'/'])); // value cut
    assert!(!kept(&[0x00, 0x02, b't'])); // name cut
    // Never indexed (a credential): not kept, though it leaves the table alone.
    assert!(!kept(&[0x82, 0x10, 0x01, b'a', 0x01, b'b']));
    // Such blocks repeat exactly: loona's encoder sends a field whose name is in the static
    // table as a literal without indexing every time (others are indexed once, then referred to).
    let mut e = loona_hpack::Encoder::new();
    let h: [(&[u8], &[u8]); 2] = [(b":path", b"/a.B/C"), (b"te", b"trailers")];
    let first = e.encode(h);
    assert!(!kept(&first), "te enters the table: {first:x?}");
    let (two, three) = (e.encode(h), e.encode(h));
    assert!(kept(&two) && two == three, "{two:x?}");
}

/// A client connection whose streams two threads wrote at once (one's in flight when the other
/// starts) says nothing of callers by its writer threads from then on; one where threads take
/// turns, each stream answered before the next, does.
#[test]
fn client_streams_of_threads_at_once_are_marked_multiplexed() {
    for overlapping in [true, false] {
        let (mut c, mut s) = (Peer::new(), Peer::new());
        let mut ev = client_conn(3, Vec::new());
        let req = |c: &mut Peer, id| {
            let mut b = c.headers(id, false, &hs(&req_headers("/svc/M")));
            b.extend(frame(D, END_STREAM, id, &grpc_msg(b"q")));
            b
        };
        let resp = |s: &mut Peer, id| {
            let mut b = s.headers(id, false, &[(":status", "200")]);
            b.extend(s.headers(id, true, &[("grpc-status", "0")]));
            b
        };
        ev.push(data_tid(3, Role::Client, OUT, 10, 21, &req(&mut c, 1)));
        if overlapping {
            ev.push(data_tid(3, Role::Client, OUT, 11, 22, &req(&mut c, 3)));
            ev.push(data_tid(3, Role::Client, IN, 12, 21, &resp(&mut s, 1)));
        } else {
            ev.push(data_tid(3, Role::Client, IN, 11, 21, &resp(&mut s, 1)));
            ev.push(data_tid(3, Role::Client, OUT, 12, 22, &req(&mut c, 3)));
        }
        ev.push(data_tid(3, Role::Client, IN, 13, 22, &resp(&mut s, 3)));
        let (ex, _) = run(&ev);
        assert_eq!(ex.len(), 2, "{ex:#?}");
        assert!(
            ex.iter().all(|x| x.threads_multiplexed == overlapping),
            "overlapping: {overlapping}: {ex:#?}"
        );
    }
}
