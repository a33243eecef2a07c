//! Table tests over hand-built capture events. Every scenario that describes a normal
//! conversation is also replayed with its syscalls split byte by byte and at odd sizes: the
//! exchanges must be identical whatever the boundaries.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use std::net::SocketAddr;

use bytes::Bytes;

use super::*;
use crate::capture::{
    ConnEvent, ConnEventKind, ConnId, DataEvent, Direction, Event, Role, Syscall, Tuple,
};

pub(super) const PID: u32 = 100;

pub(super) fn cid(fd: u32) -> ConnId {
    ConnId {
        pid: PID,
        fd,
        generation: 1,
    }
}

pub(super) fn tuple() -> Tuple {
    Tuple {
        local: "127.0.0.1:40000".parse::<SocketAddr>().unwrap(),
        remote: "127.0.0.1:8080".parse::<SocketAddr>().unwrap(),
    }
}

pub(super) fn conn_ev(fd: u32, role: Role, ts: u64, kind: ConnEventKind) -> Event {
    Event::Conn(ConnEvent {
        conn: cid(fd),
        role,
        tuple: Some(tuple()),
        pid: PID,
        tid: 7,
        ts_ns: ts,
        kind,
    })
}

/// A syscall that moved `len` bytes of which `captured` is the prefix.
pub(super) fn data_trunc(
    fd: u32,
    role: Role,
    dir: Direction,
    ts: u64,
    tid: u32,
    captured: &[u8],
    len: u64,
) -> Event {
    Event::Data(DataEvent {
        conn: cid(fd),
        role,
        direction: dir,
        syscall: match dir {
            Direction::Egress => Syscall::Write,
            Direction::Ingress => Syscall::Read,
        },
        tuple: Some(tuple()),
        pid: PID,
        tid,
        goid: None,
        interleaved: false,
        ts_enter_ns: ts,
        ts_exit_ns: ts + 5,
        len,
        payload: Bytes::copy_from_slice(captured),
    })
}

pub(super) fn data(fd: u32, role: Role, dir: Direction, ts: u64, bytes: &[u8]) -> Event {
    data_trunc(fd, role, dir, ts, 7, bytes, bytes.len() as u64)
}

pub(super) fn data_tid(
    fd: u32,
    role: Role,
    dir: Direction,
    ts: u64,
    tid: u32,
    bytes: &[u8],
) -> Event {
    data_trunc(fd, role, dir, ts, tid, bytes, bytes.len() as u64)
}

pub(super) fn run(events: &[Event]) -> (Vec<Exchange>, L7Stats) {
    let mut r = Reassembler::new(L7Config::default());
    let mut out = Vec::new();
    for e in events {
        r.push(e, &mut out);
    }
    (out, r.stats())
}

/// The same events with every data syscall cut into pieces of `n` captured bytes (same
/// timestamps and thread); a truncated syscall keeps its gap on its last piece.
pub(super) fn split(events: &[Event], n: usize) -> Vec<Event> {
    let mut v = Vec::new();
    for e in events {
        let Event::Data(d) = e else {
            v.push(e.clone());
            continue;
        };
        let gap = d.len - d.payload.len() as u64;
        let chunks: Vec<&[u8]> = d.payload.chunks(n).collect();
        if chunks.is_empty() {
            v.push(e.clone());
            continue;
        }
        for (i, c) in chunks.iter().enumerate() {
            let mut p = d.clone();
            p.payload = Bytes::copy_from_slice(c);
            p.len = c.len() as u64 + if i + 1 == chunks.len() { gap } else { 0 };
            v.push(Event::Data(p));
        }
    }
    v
}

/// Run, and check that byte-by-byte and odd splits give the same exchanges.
pub(super) fn run_split_invariant(events: &[Event]) -> Vec<Exchange> {
    let (want, _) = run(events);
    for n in [1, 2, 3, 7, 64] {
        let (got, _) = run(&split(events, n));
        assert_eq!(
            got, want,
            "split into {n}-byte syscalls changed the exchanges"
        );
    }
    want
}

use Direction::{Egress as OUT, Ingress as IN};

pub(super) const GET: &[u8] =
    b"GET /users/42/orders?page=2 HTTP/1.1\r\nHost: api.local\r\nUser-Agent: t\r\n\r\n";
pub(super) const OK_HELLO: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello";

#[test]
fn client_keep_alive_pairs_requests_and_responses() {
    let ev = vec![
        conn_ev(3, Role::Client, 1, ConnEventKind::Connect { errno: 0 }),
        data(3, Role::Client, OUT, 10, GET),
        data(3, Role::Client, IN, 20, OK_HELLO),
        data(3, Role::Client, OUT, 30, b"DELETE /items/550e8400-e29b-41d4-a716-446655440000 HTTP/1.1\r\nHost: api.local\r\n\r\n"),
        data(3, Role::Client, IN, 40, b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"),
    ];
    let ex = run_split_invariant(&ev);
    assert_eq!(ex.len(), 2, "{ex:#?}");
    let a = &ex[0];
    assert_eq!(a.id, ExchangeId(0));
    assert_eq!(a.role, Role::Client);
    assert_eq!(a.protocol, Protocol::Http1);
    assert_eq!(a.method, Some(Method::Get));
    assert_eq!(a.path.as_deref(), Some("/users/42/orders"));
    assert_eq!(a.route.as_deref(), Some("/users/{id}/orders"));
    assert_eq!(a.authority.as_deref(), Some("api.local"));
    assert_eq!(a.status, Some(200));
    assert_eq!(a.outcome, OutcomeClass::Success);
    assert!(a.idempotent && !a.idempotency_key && !a.unknown);
    assert_eq!((a.request_start_ns, a.request_end_ns), (10, 15));
    assert_eq!(
        (a.response_start_ns, a.response_end_ns),
        (Some(25), Some(25))
    );
    assert_eq!(a.request_bytes, GET.len() as u64);
    assert_eq!(a.response_bytes, OK_HELLO.len() as u64);
    assert_eq!((a.pid, a.tid, a.response_tid), (PID, 7, None));
    assert_eq!(a.remote, Some(tuple().remote));
    let b = &ex[1];
    assert_eq!(b.id, ExchangeId(1));
    assert_eq!(b.method, Some(Method::Delete));
    assert_eq!(b.route.as_deref(), Some("/items/{id}"));
    assert_eq!(b.status, Some(404));
    assert_eq!(b.outcome, OutcomeClass::Semantic);
}

/// A Go server's exchange is keyed by the goroutine that wrote the response (the handler's),
/// not the one that read the request (net/http's background reader, for a keep-alive
/// connection's next request); a client's by the goroutine that wrote the request.
#[test]
fn a_go_server_exchange_takes_the_responding_goroutine() {
    let with_goid = |e: Event, g: u64| match e {
        Event::Data(mut d) => {
            d.goid = Some(g);
            Event::Data(d)
        }
        e => e,
    };
    let ev = vec![
        conn_ev(4, Role::Server, 1, ConnEventKind::Accept),
        with_goid(data(4, Role::Server, IN, 10, GET), 0xb0),
        with_goid(data(4, Role::Server, OUT, 20, OK_HELLO), 0xa0),
        conn_ev(5, Role::Client, 2, ConnEventKind::Connect { errno: 0 }),
        with_goid(data(5, Role::Client, OUT, 30, GET), 0xc0),
        with_goid(data(5, Role::Client, IN, 40, OK_HELLO), 0xd0),
    ];
    let (ex, _) = run(&ev);
    assert_eq!(ex.len(), 2, "{ex:#?}");
    let by_role = |r: Role| ex.iter().find(|x| x.role == r).map(|x| x.goid);
    assert_eq!(by_role(Role::Server), Some(Some(0xa0)));
    assert_eq!(by_role(Role::Client), Some(Some(0xc0)));
}

#[test]
fn server_reads_requests_and_hashes_bodies() {
    let post = b"POST /charge HTTP/1.1\r\nHost: pay\r\nContent-Length: 11\r\nIdempotency-Key: abc\r\n\r\n{\"amt\":100}";
    let post_nokey =
        b"POST /charge HTTP/1.1\r\nHost: pay\r\nContent-Length: 11\r\n\r\n{\"amt\":100}";
    let ev = vec![
        conn_ev(4, Role::Server, 1, ConnEventKind::Accept),
        data(4, Role::Server, IN, 10, post),
        data_tid(
            4,
            Role::Server,
            OUT,
            20,
            9,
            b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}",
        ),
        data(4, Role::Server, IN, 30, post_nokey),
        data_tid(
            4,
            Role::Server,
            OUT,
            40,
            9,
            b"HTTP/1.1 422 Unprocessable\r\nContent-Length: 0\r\n\r\n",
        ),
    ];
    let ex = run_split_invariant(&ev);
    assert_eq!(ex.len(), 2);
    assert_eq!(ex[0].role, Role::Server);
    assert_eq!(ex[0].method, Some(Method::Post));
    assert!(ex[0].idempotency_key && ex[0].idempotent);
    assert!(!ex[1].idempotency_key && !ex[1].idempotent);
    assert!(ex[0].body_hash.is_some());
    assert_eq!(ex[0].body_hash, ex[1].body_hash, "same body, same hash");
    assert_eq!(
        ex[0].response_tid,
        Some(9),
        "a different thread wrote the response"
    );
    assert_eq!(ex[1].outcome, OutcomeClass::Semantic);
    assert_eq!(ex[0].outcome, OutcomeClass::Success);
}

#[test]
fn pipelined_requests_pair_fifo() {
    let reqs = [
        &b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n"[..],
        b"GET /b HTTP/1.1\r\nHost: h\r\n\r\n",
        b"HEAD /c HTTP/1.1\r\nHost: h\r\n\r\n",
        b"GET /d HTTP/1.1\r\nHost: h\r\n\r\n",
    ]
    .concat();
    let resps = [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"[..],
        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
        // HEAD: Content-Length describes the body a GET would get; none follows.
        b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n",
        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\nContent-Length: 4\r\n\r\nbusy",
    ]
    .concat();
    let ev = vec![
        conn_ev(3, Role::Client, 1, ConnEventKind::Connect { errno: 0 }),
        data(3, Role::Client, OUT, 10, &reqs),
        data(3, Role::Client, IN, 20, &resps),
    ];
    let ex = run_split_invariant(&ev);
    let got: Vec<_> = ex
        .iter()
        .map(|e| (e.path.clone().unwrap(), e.status.unwrap(), e.outcome))
        .collect();
    assert_eq!(
        got,
        vec![
            ("/a".into(), 200, OutcomeClass::Success),
            ("/b".into(), 404, OutcomeClass::Semantic),
            ("/c".into(), 200, OutcomeClass::Success),
            ("/d".into(), 503, OutcomeClass::Overload),
        ]
    );
    assert!(ex[3].retry_after);
}

#[test]
fn chunked_bodies_with_trailers() {
    let req = b"POST /upload HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n";
    let resp = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n4\r\nabcd\r\n0\r\nX-Sum: 1\r\n\r\n";
    let ev = vec![
        conn_ev(3, Role::Client, 1, ConnEventKind::Connect { errno: 0 }),
        data(3, Role::Client, OUT, 10, req),
        data(3, Role::Client, IN, 20, resp),
        data(3, Role::Client, OUT, 30, GET),
        data(3, Role::Client, IN, 40, OK_HELLO),
    ];
    let ex = run_split_invariant(&ev);
    assert_eq!(ex.len(), 2);
    assert_eq!(ex[0].path.as_deref(), Some("/upload"));
    assert_eq!(ex[0].request_bytes, req.len() as u64);
    assert_eq!(ex[0].response_bytes, resp.len() as u64);
    // The hash covers the de-chunked body.
    let mut h = util::BodyHasher::default();
    h.feed(b"hello world");
    assert_eq!(ex[0].body_hash, h.finish());
    assert_eq!(ex[1].path.as_deref(), Some("/users/42/orders"));
    assert!(!ex[1].unknown);
}

#[test]
fn large_bodies_are_skipped_by_counting_through_the_capture_gap() {
    // 100 KiB bodies of which only the first 256 bytes of each syscall are captured.
    let body = vec![b'x'; 100 * 1024];
    let mut req = b"PUT /blob/1 HTTP/1.1\r\nHost: h\r\nContent-Length: 102400\r\n\r\n".to_vec();
    req.extend_from_slice(&body);
    let mut resp = b"HTTP/1.1 200 OK\r\nContent-Length: 102400\r\n\r\n".to_vec();
    resp.extend_from_slice(&body);
    let ev = vec![
        conn_ev(3, Role::Client, 1, ConnEventKind::Connect { errno: 0 }),
        data_trunc(3, Role::Client, OUT, 10, 7, &req[..256], req.len() as u64),
        data_trunc(3, Role::Client, IN, 20, 7, &resp[..256], resp.len() as u64),
        data(3, Role::Client, OUT, 30, GET),
        data(3, Role::Client, IN, 40, OK_HELLO),
    ];
    let (ex, stats) = run(&ev);
    assert_eq!(run_split_invariant(&ev), ex);
    assert_eq!(ex.len(), 2, "{ex:#?}");
    assert_eq!(ex[0].method, Some(Method::Put));
    assert_eq!(ex[0].status, Some(200));
    assert_eq!(ex[0].request_bytes, req.len() as u64);
    assert_eq!(ex[0].response_bytes, resp.len() as u64);
    assert!(!ex[0].unknown);
    assert!(ex[0].body_hash.is_some(), "hash of the captured prefix");
    assert_eq!(ex[1].path.as_deref(), Some("/users/42/orders"));
    assert_eq!(ex[1].status, Some(200));
    assert!(!ex[1].unknown);
    assert_eq!((stats.truncations, stats.parse_errors), (0, 0));
    // The same body delivered in many reads of which each is captured only in part.
    let mut ev2 = vec![conn_ev(5, Role::Server, 1, ConnEventKind::Accept)];
    for (i, piece) in req.chunks(8192).enumerate() {
        ev2.push(data_trunc(
            5,
            Role::Server,
            IN,
            10 + i as u64,
            7,
            &piece[..piece.len().min(256)],
            piece.len() as u64,
        ));
    }
    ev2.push(data(
        5,
        Role::Server,
        OUT,
        100,
        b"HTTP/1.1 204 No Content\r\n\r\n",
    ));
    ev2.push(data(5, Role::Server, IN, 110, GET));
    ev2.push(data(5, Role::Server, OUT, 120, OK_HELLO));
    let (ex2, _) = run(&ev2);
    assert_eq!(ex2.len(), 2);
    assert_eq!((ex2[0].status, ex2[1].status), (Some(204), Some(200)));
    assert_eq!(ex2[0].request_end_ns, 10 + (req.len() / 8192) as u64 + 5);
    assert_eq!(
        ex2[0].body_hash, ex[0].body_hash,
        "hash stops at the first gap"
    );
}

#[test]
fn bodyless_statuses_and_interim_responses() {
    let ev = vec![
        conn_ev(3, Role::Client, 1, ConnEventKind::Connect { errno: 0 }),
        data(3, Role::Client, OUT, 10, b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"),
        data(3, Role::Client, IN, 20, b"HTTP/1.1 100 Continue\r\n\r\n"),
        data(3, Role::Client, OUT, 30, b"data"),
        data(3, Role::Client, IN, 40, b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\nHTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n"),
        data(3, Role::Client, OUT, 50, GET),
        data(3, Role::Client, IN, 60, b"HTTP/1.1 304 Not Modified\r\nContent-Length: 99\r\n\r\n"),
        data(3, Role::Client, OUT, 70, GET),
        data(3, Role::Client, IN, 80, OK_HELLO),
    ];
    let ex = run_split_invariant(&ev);
    let got: Vec<_> = ex
        .iter()
        .map(|e| (e.status, e.outcome, e.unknown))
        .collect();
    assert_eq!(
        got,
        vec![
            (Some(204), OutcomeClass::Success, false),
            (Some(304), OutcomeClass::Success, false),
            (Some(200), OutcomeClass::Success, false),
        ]
    );
    assert_eq!(ex[0].request_end_ns, 35, "the body came after 100 Continue");
    assert_eq!(ex[0].response_start_ns, Some(45));
}

#[test]
fn expect_continue_rejected_without_body() {
    // The server refuses before the body; the client sends its next request instead.
    let ev = vec![
        conn_ev(4, Role::Server, 1, ConnEventKind::Accept),
        data(4, Role::Server, IN, 10, b"PUT /big HTTP/1.1\r\nHost: h\r\nContent-Length: 1000000\r\nExpect: 100-continue\r\n\r\n"),
        data(4, Role::Server, OUT, 20, b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\n\r\n"),
        data(4, Role::Server, IN, 30, GET),
        data(4, Role::Server, OUT, 40, OK_HELLO),
    ];
    let (ex, _) = run(&ev);
    assert_eq!(ex.len(), 2, "{ex:#?}");
    assert_eq!(
        (ex[0].status, ex[0].outcome),
        (Some(413), OutcomeClass::Semantic)
    );
    assert_eq!(ex[1].path.as_deref(), Some("/users/42/orders"));
    assert_eq!(ex[1].status, Some(200));
}

#[test]
fn response_delimited_by_close() {
    let ev = vec![
        conn_ev(3, Role::Client, 1, ConnEventKind::Connect { errno: 0 }),
        data(3, Role::Client, OUT, 10, b"GET /old HTTP/1.0\r\n\r\n"),
        data(
            3,
            Role::Client,
            IN,
            20,
            b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nsome",
        ),
        data(3, Role::Client, IN, 30, b" more bytes"),
        conn_ev(3, Role::Client, 50, ConnEventKind::Close),
    ];
    let ex = run_split_invariant(&ev);
    assert_eq!(ex.len(), 1);
    assert_eq!(ex[0].status, Some(200));
    assert_eq!(ex[0].failure, None);
    assert_eq!(ex[0].response_end_ns, Some(50));
    assert_eq!(ex[0].outcome, OutcomeClass::Success);
}

#[test]
fn upgrade_stops_parsing_but_not_counting() {
    let ev = vec![
        conn_ev(3, Role::Client, 1, ConnEventKind::Connect { errno: 0 }),
        data(3, Role::Client, OUT, 10, b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"),
        data(3, Role::Client, IN, 20, b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n\x81\x05hello"),
        data(3, Role::Client, OUT, 30, b"\x81\x85GET / HTTP/1.1\r\n\r\n"),
        data(3, Role::Client, IN, 40, b"HTTP/1.1 200 OK\r\n\r\n"),
        conn_ev(3, Role::Client, 50, ConnEventKind::Close),
    ];
    let (ex, stats) = run(&ev);
    assert_eq!(run_split_invariant(&ev), ex);
    assert_eq!(ex.len(), 1, "{ex:#?}");
    assert_eq!(
        (ex[0].status, ex[0].outcome),
        (Some(101), OutcomeClass::Success)
    );
    assert_eq!(stats.parse_errors, 0);
}

#[test]
fn headers_that_matter_are_read() {
    let req = "GET /x HTTP/1.1\r\nHost: h\r\nX-Envoy-Attempt-Count: 3\r\nx-retry-attempt: 2\r\nX-Idempotency-Key: k\r\n\r\n";
    let resp = format!(
        "HTTP/1.1 500 Internal\r\n{}: unclaimed\r\nContent-Length: 0\r\n\r\nHTTP/1.1 200 OK\r\nX-Envoy-RateLimited: true\r\nContent-Length: 0\r\n\r\n",
        ERROR_CLAIM_HEADER
    );
    let ev = vec![
        conn_ev(3, Role::Client, 1, ConnEventKind::Connect { errno: 0 }),
        data(3, Role::Client, OUT, 10, req.as_bytes()),
        data(
            3,
            Role::Client,
            OUT,
            11,
            b"POST /y HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        ),
        data(3, Role::Client, IN, 20, resp.as_bytes()),
    ];
    let ex = run_split_invariant(&ev);
    assert_eq!(ex.len(), 2);
    let m = &ex[0].retry_markers;
    assert_eq!(
        (
            m.envoy_attempt_count,
            m.retry_attempt,
            m.grpc_previous_attempts
        ),
        (Some(3), Some(2), None)
    );
    assert!(m.says_retry());
    assert!(ex[0].idempotency_key);
    assert_eq!(ex[0].claim_header, Some(Claim::Unclaimed));
    assert_eq!(ex[0].outcome, OutcomeClass::Transient);
    assert!(!ex[1].retry_markers.says_retry());
    assert_eq!(ex[1].outcome, OutcomeClass::Overload, "x-envoy-ratelimited");
    assert!(!ex[1].idempotent);
}

#[test]
fn connect_failures_are_client_exchanges() {
    let ev = vec![
        conn_ev(
            3,
            Role::Client,
            10,
            ConnEventKind::Connect {
                errno: -libc::ECONNREFUSED,
            },
        ),
        conn_ev(
            4,
            Role::Client,
            20,
            ConnEventKind::Connect {
                errno: -libc::EINPROGRESS,
            },
        ),
        conn_ev(
            4,
            Role::Client,
            30,
            ConnEventKind::Failed {
                errno: libc::ETIMEDOUT,
            },
        ),
        conn_ev(5, Role::Client, 40, ConnEventKind::Connect { errno: 0 }),
    ];
    let (ex, stats) = run(&ev);
    assert_eq!(ex.len(), 2);
    assert_eq!(
        (ex[0].failure, ex[0].outcome),
        (Some(Failure::ConnectRefused), OutcomeClass::Transient)
    );
    assert_eq!(
        (ex[1].failure, ex[1].outcome),
        (Some(Failure::ConnectTimeout), OutcomeClass::Transient)
    );
    assert_eq!(
        (ex[1].request_start_ns, ex[1].role, ex[1].method.clone()),
        (30, Role::Client, None)
    );
    assert_eq!(stats.connections, 1);
}

#[test]
fn connection_ends_fail_what_is_in_flight() {
    use Failure::*;
    let req = GET;
    let partial = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc";
    type Case = (
        Role,
        Option<&'static [u8]>,
        ConnEventKind,
        Failure,
        OutcomeClass,
    );
    let cases: Vec<Case> = vec![
        (
            Role::Client,
            None,
            ConnEventKind::Reset {
                errno: -libc::ECONNRESET,
            },
            Reset,
            OutcomeClass::Transient,
        ),
        (
            Role::Client,
            Some(partial),
            ConnEventKind::Reset {
                errno: -libc::ECONNRESET,
            },
            ResetMidResponse,
            OutcomeClass::Transient,
        ),
        (
            Role::Client,
            None,
            ConnEventKind::Close,
            Abandoned,
            OutcomeClass::Unknown,
        ),
        (
            Role::Client,
            Some(partial),
            ConnEventKind::Close,
            Abandoned,
            OutcomeClass::Unknown,
        ),
        (
            Role::Server,
            None,
            ConnEventKind::Close,
            ClosedNoResponse,
            OutcomeClass::Unknown,
        ),
        (
            Role::Server,
            None,
            ConnEventKind::Reset {
                errno: -libc::EPIPE,
            },
            Abandoned,
            OutcomeClass::Unknown,
        ),
        (
            Role::Server,
            Some(partial),
            ConnEventKind::Reset {
                errno: -libc::EPIPE,
            },
            ResetMidResponse,
            OutcomeClass::Transient,
        ),
    ];
    for (role, resp, end, failure, outcome) in cases {
        let (rq, rs) = match role {
            Role::Server => (IN, OUT),
            _ => (OUT, IN),
        };
        let start = if role == Role::Server {
            ConnEventKind::Accept
        } else {
            ConnEventKind::Connect { errno: 0 }
        };
        let mut ev = vec![conn_ev(3, role, 1, start), data(3, role, rq, 10, req)];
        if let Some(r) = resp {
            ev.push(data(3, role, rs, 20, r));
        }
        ev.push(conn_ev(3, role, 30, end.clone()));
        let (ex, stats) = run(&ev);
        assert_eq!(ex.len(), 1, "{role:?} {end:?}");
        assert_eq!(
            (ex[0].failure, ex[0].outcome),
            (Some(failure), outcome),
            "{role:?} {resp:?} {end:?}"
        );
        assert_eq!(ex[0].path.as_deref(), Some("/users/42/orders"));
        assert_eq!((stats.connections, stats.closed), (0, 1));
        if resp.is_some() {
            assert_eq!(ex[0].status, Some(200));
        }
    }
}

#[test]
fn unknown_role_is_resolved_from_the_bytes() {
    let ev = vec![
        conn_ev(3, Role::Unknown, 1, ConnEventKind::Existing),
        data(3, Role::Unknown, IN, 10, GET),
        data(3, Role::Unknown, OUT, 20, OK_HELLO),
        conn_ev(6, Role::Unknown, 1, ConnEventKind::Existing),
        data(6, Role::Unknown, OUT, 10, GET),
        data(6, Role::Unknown, IN, 20, OK_HELLO),
    ];
    // Not split: a direction joined mid-life resyncs only at a syscall that starts a message.
    let (ex, _) = run(&ev);
    assert_eq!(ex.len(), 2);
    assert_eq!((ex[0].role, ex[0].status), (Role::Server, Some(200)));
    assert_eq!((ex[1].role, ex[1].status), (Role::Client, Some(200)));
}

#[test]
fn other_protocols_pass_through_as_counts() {
    let tls = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03GET / HTTP/1.1\r\n\r\n";
    let ev = vec![
        conn_ev(3, Role::Client, 1, ConnEventKind::Connect { errno: 0 }),
        data(3, Role::Client, OUT, 10, tls),
        data(3, Role::Client, IN, 20, b"\x16\x03\x03\x00\x5a"),
        data(3, Role::Client, OUT, 30, GET),
        conn_ev(3, Role::Client, 40, ConnEventKind::Close),
    ];
    let (ex, stats) = run(&ev);
    assert!(ex.is_empty(), "{ex:#?}");
    assert_eq!(stats.opaque_bytes, (tls.len() + 5 + GET.len()) as u64);
    assert_eq!((stats.parse_errors, stats.exchanges), (0, 0));
}

#[test]
fn mid_connection_start_recovers_at_the_next_message() {
    // The agent started while a response body was in flight on a pre-existing connection.
    let ev = vec![
        data(3, Role::Client, IN, 10, b"tail of an old body"),
        data(3, Role::Client, OUT, 20, GET),
        data(3, Role::Client, IN, 30, OK_HELLO),
    ];
    let (ex, _) = run(&ev);
    assert_eq!(ex.len(), 1, "{ex:#?}");
    assert_eq!((ex[0].status, ex[0].unknown), (Some(200), false));
    assert_eq!(ex[0].path.as_deref(), Some("/users/42/orders"));
    // A response whose request predates the capture is reported, honestly unknown.
    let ev = vec![
        data(3, Role::Client, IN, 30, OK_HELLO),
        data(3, Role::Client, OUT, 40, GET),
        data(3, Role::Client, IN, 50, OK_HELLO),
    ];
    let (ex, _) = run(&ev);
    assert_eq!(ex.len(), 2);
    assert!(ex[0].unknown && ex[0].method.is_none());
    assert_eq!(ex[0].status, Some(200));
    assert!(!ex[1].unknown);
}

#[test]
fn truncated_head_is_unknown_and_sync_recovers() {
    let mut big = b"GET /huge/7 HTTP/1.1\r\nHost: h\r\nCookie: ".to_vec();
    big.extend(std::iter::repeat_n(b'c', 8000));
    big.extend_from_slice(b"\r\n\r\n");
    let ev = vec![
        conn_ev(3, Role::Client, 1, ConnEventKind::Connect { errno: 0 }),
        data_trunc(3, Role::Client, OUT, 10, 7, &big[..256], big.len() as u64),
        data(3, Role::Client, IN, 20, OK_HELLO),
        data(3, Role::Client, OUT, 30, GET),
        data(3, Role::Client, IN, 40, OK_HELLO),
    ];
    let (ex, stats) = run(&ev);
    assert_eq!(ex.len(), 2, "{ex:#?}");
    assert!(ex[0].unknown);
    assert_eq!(ex[0].method, Some(Method::Get));
    assert_eq!(ex[0].path.as_deref(), Some("/huge/7"));
    assert_eq!(ex[0].status, Some(200));
    assert!(!ex[1].unknown);
    assert_eq!(ex[1].path.as_deref(), Some("/users/42/orders"));
    assert_eq!(stats.truncations, 1);
}

#[test]
fn idle_and_lru_eviction() {
    let cfg = L7Config {
        max_connections: 2,
        idle_timeout_secs: 1,
        ..L7Config::default()
    };
    let mut r = Reassembler::new(cfg);
    let mut out = Vec::new();
    for fd in [3, 4] {
        r.push(
            &conn_ev(fd, Role::Client, 1, ConnEventKind::Connect { errno: 0 }),
            &mut out,
        );
        r.push(&data(fd, Role::Client, OUT, 10, GET), &mut out);
    }
    assert!(out.is_empty());
    // A third connection evicts the least recently used (fd 3): its request becomes unknown.
    r.push(
        &conn_ev(5, Role::Client, 20, ConnEventKind::Connect { errno: 0 }),
        &mut out,
    );
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].conn, cid(3));
    assert!(out[0].unknown);
    assert_eq!(out[0].outcome, OutcomeClass::Unknown);
    assert_eq!(r.stats().evictions_lru, 1);
    r.tick(500_000_000, &mut out);
    assert_eq!(out.len(), 1, "not idle yet");
    r.tick(2_000_000_000, &mut out);
    assert_eq!(out.len(), 2, "fd 4's unanswered request");
    assert_eq!(
        (out[1].failure, out[1].outcome),
        (Some(Failure::ClosedNoResponse), OutcomeClass::Unknown)
    );
    let s = r.stats();
    assert_eq!((s.evictions_idle, s.connections), (2, 0));
    assert_eq!(s.exchanges, 2);
    // One dropped for room and two for idleness: all three are evictions; none closed.
    assert_eq!((s.evictions(), s.closed), (3, 0));
}

/// The table is reordered lazily (at most every PROMOTE_NS per connection), yet a connection in
/// use outlives one left idle when room is needed.
#[test]
fn eviction_for_room_spares_a_connection_still_in_use() {
    let cfg = L7Config {
        max_connections: 2,
        ..L7Config::default()
    };
    let mut r = Reassembler::new(cfg);
    let mut out = Vec::new();
    let ms = 1_000_000;
    for fd in [3, 4] {
        let t = u64::from(fd) * ms;
        r.push(
            &conn_ev(fd, Role::Client, t, ConnEventKind::Connect { errno: 0 }),
            &mut out,
        );
        r.push(&data(fd, Role::Client, OUT, t, GET), &mut out);
    }
    // fd 3, the older, is used again later: fd 4 is now the least recently used.
    r.push(&data(3, Role::Client, IN, 500 * ms, OK_HELLO), &mut out);
    assert_eq!(out.len(), 1);
    r.push(
        &conn_ev(
            5,
            Role::Client,
            600 * ms,
            ConnEventKind::Connect { errno: 0 },
        ),
        &mut out,
    );
    assert_eq!(r.stats().evictions_lru, 1);
    assert_eq!(out.len(), 2);
    assert_eq!(
        (out[1].conn, out[1].unknown),
        (cid(4), true),
        "{:?}",
        out[1]
    );
}

#[test]
fn garbage_never_panics_and_memory_stays_bounded() {
    let cfg = L7Config {
        conn_buffer_bytes: 1024,
        ..L7Config::default()
    };
    let mut r = Reassembler::new(cfg);
    let mut out = Vec::new();
    let mut seed = 0x1234_5678_u64;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let prefixes: [&[u8]; 4] = [
        b"GET / HTTP/1.1\r\n",
        b"HTTP/1.1 200 OK\r\n",
        super::http2::PREFACE,
        b"",
    ];
    for i in 0..3000u64 {
        let fd = (rnd() % 5) as u32;
        let mut b = prefixes[(rnd() % 4) as usize].to_vec();
        let n = (rnd() % 300) as usize;
        b.extend((0..n).map(|_| rnd() as u8));
        let len = b.len() as u64 + if rnd() % 4 == 0 { rnd() % 100_000 } else { 0 };
        let dir = if rnd() % 2 == 0 { OUT } else { IN };
        let role = [Role::Client, Role::Server, Role::Unknown][(rnd() % 3) as usize];
        if rnd() % 50 == 0 {
            r.push(&conn_ev(fd, role, i, ConnEventKind::Accept), &mut out);
        }
        r.push(&data_trunc(fd, role, dir, i, 1, &b, len), &mut out);
        assert!(
            r.buffered_bytes() <= 5 * 4 * (1024 + 128),
            "{}",
            r.buffered_bytes()
        );
    }
    r.tick(u64::MAX, &mut out);
    assert_eq!(r.stats().connections, 0);
}

#[test]
fn pipelining_depth_is_bounded() {
    let cfg = L7Config {
        max_inflight: 4,
        ..L7Config::default()
    };
    let mut r = Reassembler::new(cfg);
    let mut out = Vec::new();
    r.push(
        &conn_ev(3, Role::Client, 1, ConnEventKind::Connect { errno: 0 }),
        &mut out,
    );
    for i in 0..10 {
        r.push(&data(3, Role::Client, OUT, 10 + i, GET), &mut out);
    }
    assert_eq!(out.len(), 6, "the oldest beyond the depth are given up");
    assert!(
        out.iter()
            .all(|e| e.unknown && e.outcome == OutcomeClass::Unknown)
    );
    assert_eq!(
        (r.stats().evictions_inflight, r.stats().evictions()),
        (6, 6)
    );
    r.push(
        &conn_ev(3, Role::Client, 100, ConnEventKind::Close),
        &mut out,
    );
    assert_eq!(out.len(), 10);
    assert!(
        out[6..]
            .iter()
            .all(|e| e.failure == Some(Failure::Abandoned))
    );
    // The close finished the rest: not evictions.
    assert_eq!((r.stats().closed, r.stats().evictions()), (1, 6));
}

/// What a new user saw: 80 ordinary exchanges on connections that then closed counted 80
/// evictions. An eviction is state a bound dropped; a close finishes the state.
#[test]
fn ordinary_closes_are_not_evictions() {
    let mut ev = Vec::new();
    for i in 0..80u32 {
        let (fd, t) = (3 + i, u64::from(i) * 100);
        let role = if i % 2 == 0 {
            Role::Client
        } else {
            Role::Server
        };
        let (start, rq, rs) = match role {
            Role::Server => (ConnEventKind::Accept, IN, OUT),
            _ => (ConnEventKind::Connect { errno: 0 }, OUT, IN),
        };
        let end = if i % 4 == 1 {
            ConnEventKind::Reset {
                errno: -libc::ECONNRESET,
            }
        } else {
            ConnEventKind::Close
        };
        ev.push(conn_ev(fd, role, t + 1, start));
        ev.push(data(fd, role, rq, t + 10, GET));
        ev.push(data(fd, role, rs, t + 20, OK_HELLO));
        ev.push(conn_ev(fd, role, t + 30, end));
    }
    let (ex, stats) = run(&ev);
    assert_eq!(ex.len(), 80);
    assert!(
        ex.iter().all(|e| e.outcome == OutcomeClass::Success),
        "{ex:#?}"
    );
    assert_eq!((stats.closed, stats.connections), (80, 0));
    assert_eq!(stats.evictions(), 0, "{stats:?}");
}

#[test]
fn absolute_form_and_connect_targets() {
    let ev = vec![
        conn_ev(3, Role::Client, 1, ConnEventKind::Connect { errno: 0 }),
        data(
            3,
            Role::Client,
            OUT,
            10,
            b"GET http://proxy.example:8080/a/1?b=2 HTTP/1.1\r\n\r\n",
        ),
        data(
            3,
            Role::Client,
            IN,
            20,
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        ),
        data(
            3,
            Role::Client,
            OUT,
            30,
            b"CONNECT 10.0.0.1:443 HTTP/1.1\r\nHost: 10.0.0.1:443\r\n\r\n",
        ),
        data(
            3,
            Role::Client,
            IN,
            40,
            b"HTTP/1.1 200 Connection established\r\n\r\n\x16\x03\x01",
        ),
        data(
            3,
            Role::Client,
            OUT,
            50,
            b"\x16\x03\x01\x00\x10GET / HTTP/1.1\r\n\r\n",
        ),
    ];
    let ex = run_split_invariant(&ev);
    assert_eq!(ex.len(), 2, "{ex:#?}");
    assert_eq!(ex[0].authority.as_deref(), Some("proxy.example:8080"));
    assert_eq!(ex[0].route.as_deref(), Some("/a/{id}"));
    assert_eq!(ex[1].method, Some(Method::Connect));
    assert_eq!(ex[1].status, Some(200));
}

#[test]
fn process_exit_ends_its_connections() {
    let ev = vec![
        conn_ev(3, Role::Client, 1, ConnEventKind::Connect { errno: 0 }),
        data(3, Role::Client, OUT, 10, GET),
        conn_ev(4, Role::Client, 1, ConnEventKind::Connect { errno: 0 }),
        data(4, Role::Client, OUT, 10, GET),
        data(4, Role::Client, IN, 20, OK_HELLO),
        Event::ProcessExit {
            pid: PID,
            ts_ns: 50,
        },
    ];
    let (ex, stats) = run(&ev);
    assert_eq!(ex.len(), 2);
    assert_eq!((ex[0].conn, ex[0].status), (cid(4), Some(200)));
    assert_eq!(
        (ex[1].conn, ex[1].failure),
        (cid(3), Some(Failure::Abandoned))
    );
    assert_eq!(stats.connections, 0);
}

#[test]
fn buffers_shrink_after_a_large_head() {
    let mut r = Reassembler::new(L7Config::default());
    let mut out = Vec::new();
    r.push(
        &conn_ev(3, Role::Client, 1, ConnEventKind::Connect { errno: 0 }),
        &mut out,
    );
    let mut big = b"GET /a HTTP/1.1\r\nCookie: ".to_vec();
    big.extend(std::iter::repeat_n(b'c', 30_000));
    big.extend_from_slice(b"\r\n\r\n");
    // Arrives in small pieces, so the head is assembled in the connection's buffer.
    for piece in big.chunks(1000) {
        r.push(&data(3, Role::Client, OUT, 10, piece), &mut out);
    }
    r.push(&data(3, Role::Client, IN, 20, OK_HELLO), &mut out);
    assert_eq!(out.len(), 1);
    assert!(!out[0].unknown);
    assert!(r.buffered_bytes() <= 4096, "{}", r.buffered_bytes());
}

#[test]
fn query_is_hashed_not_kept() {
    let ex = |target: &str| {
        let req = format!("GET {target} HTTP/1.1\r\nHost: a\r\n\r\n");
        let (ex, _) = run(&[
            data(3, Role::Client, Direction::Egress, 10, req.as_bytes()),
            data(
                3,
                Role::Client,
                Direction::Ingress,
                20,
                b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            ),
        ]);
        ex.into_iter().next().expect("one exchange")
    };
    let (p1, p2, none) = (
        ex("/items?page=1&token=s3cret"),
        ex("/items?page=2&token=s3cret"),
        ex("/items"),
    );
    assert_eq!(p1.path.as_deref(), Some("/items"));
    assert!(
        !format!("{p1:?}").contains("s3cret"),
        "the query itself is not kept"
    );
    assert!(p1.query_hash.is_some() && p1.query_hash != p2.query_hash);
    assert_eq!(none.query_hash, None);
}

/// sendfile/splice: the body moves without passing user memory, so its event has a byte count
/// and no bytes. Framing must count it and the keep-alive connection parse on.
#[test]
fn zero_copy_body_is_counted_and_the_connection_parses_on() {
    let body_len = 100_000u64;
    let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {body_len}\r\n\r\n");
    let (ex, stats) = run(&[
        data(
            3,
            Role::Server,
            Direction::Ingress,
            10,
            b"GET /big HTTP/1.1\r\nHost: a\r\n\r\n",
        ),
        data(3, Role::Server, Direction::Egress, 20, head.as_bytes()),
        data_trunc(3, Role::Server, Direction::Egress, 30, 7, b"", 60_000),
        data_trunc(
            3,
            Role::Server,
            Direction::Egress,
            40,
            7,
            b"",
            body_len - 60_000,
        ),
        data(
            3,
            Role::Server,
            Direction::Ingress,
            50,
            b"GET /missing HTTP/1.1\r\nHost: a\r\n\r\n",
        ),
        data(
            3,
            Role::Server,
            Direction::Egress,
            60,
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
        ),
    ]);
    let lines: Vec<_> = ex
        .iter()
        .map(|e| (e.path.clone().unwrap_or_default(), e.status, e.unknown))
        .collect();
    assert_eq!(
        lines,
        vec![
            ("/big".into(), Some(200), false),
            ("/missing".into(), Some(404), false)
        ],
        "{stats:?}"
    );
    assert_eq!(
        ex[0].response_end_ns,
        Some(45),
        "the response ends with its last zero-copy piece"
    );
}

/// TLS: the connection's syscall bytes are ciphertext (handshake, records); the plaintext comes
/// from the TLS library's probes. Only the plaintext is parsed, even after the handshake made
/// the connection look opaque.
#[test]
fn tls_plaintext_is_parsed_and_ciphertext_ignored() {
    let ev = |dir: Direction, ts: u64, sc: Syscall, bytes: &[u8]| {
        let Event::Data(mut d) = data(3, Role::Client, dir, ts, bytes) else {
            unreachable!()
        };
        d.syscall = sc;
        Event::Data(d)
    };
    let hello = [
        0x16u8, 0x03, 0x01, 0x00, 0x40, 0x01, 0x00, 0x00, 0x3c, 0x03, 0x03, 0xaa, 0xbb,
    ];
    let record = [0x17u8, 0x03, 0x03, 0x00, 0x20, 0xde, 0xad, 0xbe, 0xef];
    let (ex, _) = run(&[
        conn_ev(
            3,
            Role::Client,
            1,
            crate::capture::ConnEventKind::Connect { errno: 0 },
        ),
        ev(Direction::Egress, 10, Syscall::Write, &hello),
        ev(Direction::Ingress, 20, Syscall::Read, &hello),
        ev(
            Direction::Egress,
            30,
            Syscall::SslWrite,
            b"GET /secure HTTP/1.1\r\nHost: a\r\n\r\n",
        ),
        ev(Direction::Egress, 31, Syscall::Write, &record),
        ev(Direction::Ingress, 40, Syscall::Read, &record),
        ev(
            Direction::Ingress,
            41,
            Syscall::SslRead,
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
        ),
    ]);
    let got: Vec<_> = ex
        .iter()
        .map(|e| (e.path.clone(), e.status, e.unknown))
        .collect();
    assert_eq!(got, vec![(Some("/secure".into()), Some(503), false)]);
}

#[test]
fn propagated_trace_id_is_read_best_source_first() {
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    // x-request-id first, traceparent later: traceparent wins whatever the order.
    let r1 =
        format!("GET /a HTTP/1.1\r\nHost: h\r\nX-Request-Id: req-1\r\ntraceparent: {tp}\r\n\r\n");
    let r2 = "GET /b HTTP/1.1\r\nHost: h\r\nX-B3-TraceId: 4bf92f3577b34da6a3ce929d0e0e4736\r\n\r\n";
    let r3 = "GET /c HTTP/1.1\r\nHost: h\r\ntraceparent: 00-bogus\r\n\r\n";
    let r4 = "GET /d HTTP/1.1\r\nHost: h\r\nx-request-id: req-1\r\n\r\n";
    let ok = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
    let mut ev = vec![conn_ev(
        3,
        Role::Client,
        1,
        ConnEventKind::Connect { errno: 0 },
    )];
    for (i, r) in [r1.as_str(), r2, r3, r4].iter().enumerate() {
        let t = 10 + 10 * i as u64;
        ev.push(data(3, Role::Client, OUT, t, r.as_bytes()));
        ev.push(data(3, Role::Client, IN, t + 5, ok.as_bytes()));
    }
    let ex = run_split_invariant(&ev);
    assert_eq!(ex.len(), 4);
    assert!(ex[0].trace_id.is_some());
    assert_eq!(
        ex[1].trace_id, ex[0].trace_id,
        "same trace id, other header"
    );
    assert_eq!(ex[2].trace_id, None, "malformed traceparent ignored");
    assert!(ex[3].trace_id.is_some() && ex[3].trace_id != ex[0].trace_id);
}

/// A server thread that reads, answers, then reads the next request serves each alone; one that
/// reads a second request before answering the first (an event loop) serves neither alone.
/// Clients' exchanges are never marked.
#[test]
fn server_requests_served_alone_on_their_thread_are_marked() {
    const OK0: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
    let ev = vec![
        conn_ev(4, Role::Server, 1, ConnEventKind::Accept),
        conn_ev(5, Role::Server, 2, ConnEventKind::Accept),
        conn_ev(6, Role::Client, 3, ConnEventKind::Connect { errno: 0 }),
        // Thread 7: conn 4's request, a call of its own, the answer, then conn 5's.
        data(4, Role::Server, IN, 10, GET),
        data(6, Role::Client, OUT, 12, GET),
        data(6, Role::Client, IN, 14, OK0),
        data(4, Role::Server, OUT, 20, OK0),
        data(5, Role::Server, IN, 30, GET),
        data(5, Role::Server, OUT, 40, OK0),
        // Then as an event loop: conn 4 and conn 5 read before either is answered.
        data(4, Role::Server, IN, 50, GET),
        data(5, Role::Server, IN, 55, GET),
        data(4, Role::Server, OUT, 60, OK0),
        data(5, Role::Server, OUT, 70, OK0),
    ];
    let ex = run_split_invariant(&ev);
    let alone: Vec<(u32, Role, bool)> = ex
        .iter()
        .map(|x| (x.conn.fd, x.role, x.sole_on_thread))
        .collect();
    assert_eq!(
        alone,
        vec![
            (6, Role::Client, false),
            (4, Role::Server, true),
            (5, Role::Server, true),
            (4, Role::Server, false),
            (5, Role::Server, false),
        ]
    );
}

/// A kernel summary of one exchange on connection `fd`: a request of line `line` and no
/// fields read (server) or written (client) at `ts`, answered `status` at `ts + 50`.
pub(super) fn summary(fd: u32, role: Role, ts: u64, line: &[u8], status: u16) -> Event {
    summary_of(fd, role, ts, &[line, b"\r\n\r\n"].concat(), status)
}

/// A kernel summary as `summary` makes it, of the request `request` as the kernel held it.
pub(super) fn summary_of(fd: u32, role: Role, ts: u64, request: &[u8], status: u16) -> Event {
    let (req_dir, resp_dir) = match role {
        Role::Client => (Direction::Egress, Direction::Ingress),
        _ => (Direction::Ingress, Direction::Egress),
    };
    let part = |dir, ts, len, bytes: &[u8]| match data_trunc(fd, role, dir, ts, 7, bytes, len) {
        Event::Data(d) => d,
        _ => unreachable!(),
    };
    Event::Summary(crate::capture::SummaryEvent {
        request: part(req_dir, ts, 300, request),
        response: part(resp_dir, ts + 50, 1200, b""),
        status,
        weight: 1,
    })
}

#[test]
fn a_kernel_summary_is_one_exchange_between_whole_ones() {
    let events = [
        conn_ev(3, Role::Server, 1, ConnEventKind::Accept),
        data(
            3,
            Role::Server,
            Direction::Ingress,
            10,
            b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n",
        ),
        data(
            3,
            Role::Server,
            Direction::Egress,
            20,
            b"HTTP/1.1 503 No\r\nContent-Length: 0\r\n\r\n",
        ),
        summary(3, Role::Server, 30, b"GET /items/42?page=2 HTTP/1.1", 200),
        data(
            3,
            Role::Server,
            Direction::Ingress,
            100,
            b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n",
        ),
        data(
            3,
            Role::Server,
            Direction::Egress,
            110,
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        ),
        // A connection l7 has not met yet (the summary is its first sight), and a line that is
        // not a request (counted, no exchange).
        summary(4, Role::Client, 200, b"POST /orders HTTP/1.1", 201),
        summary(4, Role::Client, 300, b"\x16\x03\x01 garbage", 200),
    ];
    let (xs, stats) = run(&events);
    let paths: Vec<_> = xs.iter().map(|x| (x.path.as_deref(), x.status)).collect();
    assert_eq!(
        paths,
        [
            (Some("/a"), Some(503)),
            (Some("/items/42"), Some(200)),
            (Some("/b"), Some(200)),
            (Some("/orders"), Some(201)),
        ]
    );
    let s = &xs[1];
    assert_eq!(s.protocol, Protocol::Http1);
    assert_eq!(s.route.as_deref(), Some("/items/{id}"));
    assert!(
        s.query_hash.is_some(),
        "the query is digested as from a whole head"
    );
    assert_eq!(s.method, Some(Method::Get));
    assert!(s.idempotent);
    assert_eq!(s.outcome, OutcomeClass::Success);
    assert!(!s.unknown);
    assert_eq!((s.request_start_ns, s.response_end_ns), (35, Some(85)));
    assert_eq!((s.request_bytes, s.response_bytes), (300, 1200));
    assert!(
        s.sole_on_thread,
        "read and answered with nothing in between"
    );
    assert_eq!(s.trace_id, None, "this one's request had no fields");
    let c = &xs[3];
    assert_eq!(
        (c.role, c.method.clone(), c.idempotent),
        (Role::Client, Some(Method::Post), false)
    );
    assert_eq!(stats.parse_errors, 1);
    assert_eq!((stats.exchanges, stats.summarised_exchanges), (4, 2));
}

#[test]
fn summaries_of_an_event_loop_are_not_alone() {
    // One thread read /x on fd 3, then /y on fd 4, and answered /y first: the kernel held both
    // and sends each summary at its answer, /y's before /x's read ever reaches l7. Only the
    // kernel's flag says the two overlapped.
    let flagged = |mut e: Event| {
        if let Event::Summary(s) = &mut e {
            s.request.interleaved = true;
        }
        e
    };
    let events = [
        flagged(summary(4, Role::Server, 20, b"GET /y HTTP/1.1", 200)),
        flagged(summary(3, Role::Server, 10, b"GET /x HTTP/1.1", 200)),
        // Later, alone: read and answered with nothing else in flight.
        summary(3, Role::Server, 200, b"GET /z HTTP/1.1", 200),
    ];
    let (xs, _) = run(&events);
    let alone: Vec<_> = xs
        .iter()
        .map(|x| (x.path.as_deref(), x.sole_on_thread))
        .collect();
    assert_eq!(
        alone,
        [(Some("/y"), false), (Some("/x"), false), (Some("/z"), true)]
    );
}

#[test]
fn a_summary_reads_its_requests_fields_as_a_whole_one() {
    let request = b"GET /p?q=1 HTTP/1.1\r\nHost: svc-b:8080\r\n\
        traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n\r\n";
    let whole = [
        data(4, Role::Client, Direction::Egress, 10, request),
        data(
            4,
            Role::Client,
            Direction::Ingress,
            20,
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        ),
    ];
    let (w, _) = run(&whole);
    let (s, _) = run(&[summary_of(5, Role::Client, 10, request, 200)]);
    let (w, s) = (&w[0], &s[0]);
    assert_eq!(s.authority.as_deref(), Some("svc-b:8080"));
    assert!(s.trace_id.is_some());
    // What a retry is matched on is the same either way.
    assert_eq!(
        (&s.method, &s.authority, &s.path, s.query_hash, s.trace_id),
        (&w.method, &w.authority, &w.path, w.query_hash, w.trace_id)
    );
}

/// `summary`'s event standing for `weight` exchanges; a tally (status 0) if `tally`.
fn weighted(ev: Event, weight: u32, tally: bool) -> Event {
    match ev {
        Event::Summary(s) => Event::Summary(crate::capture::SummaryEvent {
            weight,
            status: if tally { 0 } else { s.status },
            ..s
        }),
        _ => unreachable!("a summary"),
    }
}

#[test]
fn weighted_summaries_and_tallies_carry_their_counts() {
    let events = [
        conn_ev(3, Role::Server, 1, ConnEventKind::Accept),
        weighted(
            summary(3, Role::Server, 10, b"GET /a HTTP/1.1", 200),
            16,
            false,
        ),
        weighted(
            summary(3, Role::Server, 100, b"GET /b HTTP/1.1", 200),
            5,
            true,
        ),
        conn_ev(3, Role::Server, 200, ConnEventKind::Close),
    ];
    let (out, stats) = run(&events);
    let got: Vec<_> = out
        .iter()
        .map(|x| (x.weight, x.tally, x.outcome, x.status, x.route.as_deref()))
        .collect();
    assert_eq!(
        got,
        [
            (16, false, OutcomeClass::Success, Some(200), Some("/a")),
            // The count, on the route of the connection's last held request; no status.
            (5, true, OutcomeClass::Success, None, Some("/b")),
        ]
    );
    // 15 counted with the summary, 5 in the tally; the tally is no exchange of its own.
    assert_eq!(
        (
            stats.exchanges,
            stats.summarised_exchanges,
            stats.counted_exchanges
        ),
        (1, 1, 20)
    );
}

#[test]
fn a_tally_that_names_no_request_keeps_its_counts_on_no_route() {
    // The kernel read bytes that start no request into the connection's entry after counting
    // three exchanges (a request it could not hold): the tally names none.
    let events = [
        conn_ev(3, Role::Server, 1, ConnEventKind::Accept),
        weighted(summary_of(3, Role::Server, 100, b"", 200), 3, true),
        // A summary is an exchange of its own: without its request it is a parse error.
        weighted(summary_of(3, Role::Server, 150, b"", 200), 1, false),
        conn_ev(3, Role::Server, 200, ConnEventKind::Close),
    ];
    let (out, stats) = run(&events);
    let got: Vec<_> = out
        .iter()
        .map(|x| (x.weight, x.tally, x.outcome, x.route.as_deref()))
        .collect();
    assert_eq!(got, [(3, true, OutcomeClass::Success, None)]);
    assert_eq!((stats.counted_exchanges, stats.parse_errors), (3, 1));
}
