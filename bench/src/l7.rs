//! `cargo xtask bench l7`: exchanges per second and captured MB/s through the L7 reassembler,
//! on one core, for HTTP/1 keep-alive and for gRPC. Events are built in memory first; only
//! `Reassembler::push` is timed. Figures, never pass/fail.
use std::{
    hint::black_box,
    time::{Duration, Instant},
};

use anyhow::Result;
use bytes::Bytes;
use retry_agent::{
    capture::{ConnEvent, ConnEventKind, ConnId, DataEvent, Direction, Event, Role, Syscall},
    l7::{
        Exchange, L7Config, Reassembler,
        hpack::{self, huffman},
    },
};

pub fn run() -> Result<()> {
    println!("l7 reassembler, one core, release build");
    let only = std::env::var("RETRY_BENCH_L7_ONLY").ok();
    for w in [
        http1_small(),
        http1_large(),
        grpc_unary(Hpack::Loona),
        grpc_unary(Hpack::IndexAll),
        grpc_unary(Hpack::TracePerCall),
        grpc_unary(Hpack::TracePerCallHuffman),
        grpc_unary(Hpack::TracePerCallAsGo),
    ] {
        if only.as_deref().is_some_and(|o| !w.name.starts_with(o)) {
            continue;
        }
        measure(&w);
    }
    if only.as_deref().is_none_or(|o| HUFFMAN_ROW.starts_with(o)) {
        huffman_row();
    }
    Ok(())
}

const HUFFMAN_ROW: &str = "huffman decode alone";

/// HPACK's Huffman decoder alone, on the strings a traced gRPC call Huffman-codes (names,
/// values, a `traceparent`): MB/s of coded input per CPU-second.
fn huffman_row() {
    let strings: Vec<Vec<u8>> = (0..256u64)
        .flat_map(|k| {
            [
                format!("00-{:032x}-{:016x}-01", k * 0x9e37_79b9_7f4a_7c15, k + 1),
                "/shop.v1.Orders/GetOrder".to_string(),
                "orders.svc:50051".to_string(),
                "application/grpc".to_string(),
                "grpc-timeout".to_string(),
                "content-type".to_string(),
            ]
        })
        .map(|s| {
            let mut out = Vec::new();
            huffman::encode(s.as_bytes(), &mut out);
            out
        })
        .collect();
    let coded: u64 = strings.iter().map(|s| s.len() as u64).sum();
    let mut out = Vec::with_capacity(256);
    let (mut rounds, start, cpu_start) = (0u64, Instant::now(), thread_cpu_secs());
    while start.elapsed() < Duration::from_secs(2) {
        for s in &strings {
            out.clear();
            let ok = huffman::decode(black_box(s), &mut out).is_ok();
            black_box((ok, &out));
        }
        rounds += 1;
    }
    let secs = (thread_cpu_secs() - cpu_start).max(1e-9);
    println!(
        "{:<46} {:>7.0} MB/s of coded strings  ({:.1} ns a string, {} strings of {:.1} bytes)",
        HUFFMAN_ROW,
        (coded * rounds) as f64 / secs / 1e6,
        secs * 1e9 / (rounds * strings.len() as u64) as f64,
        strings.len(),
        coded as f64 / strings.len() as f64,
    );
}

/// A workload: set-up events fed once, then a round of events that leaves every connection
/// where it started (so it can be fed again and again).
struct Workload {
    name: &'static str,
    setup: Vec<Event>,
    round: Vec<Event>,
    exchanges_per_round: usize,
}

fn measure(w: &Workload) {
    let mut r = Reassembler::new(L7Config::default());
    let mut out: Vec<Exchange> = Vec::with_capacity(w.exchanges_per_round * 2);
    for e in &w.setup {
        r.push(e, &mut out);
    }
    out.clear();
    let captured: u64 = w
        .round
        .iter()
        .map(|e| {
            if let Event::Data(d) = e {
                d.payload.len() as u64
            } else {
                0
            }
        })
        .sum();
    let wire: u64 = w
        .round
        .iter()
        .map(|e| if let Event::Data(d) = e { d.len } else { 0 })
        .sum();
    let (mut rounds, mut exchanges) = (0u64, 0u64);
    let start = Instant::now();
    let cpu_start = thread_cpu_secs();
    while start.elapsed() < Duration::from_secs(3) {
        for e in &w.round {
            r.push(black_box(e), &mut out);
        }
        exchanges += out.len() as u64;
        black_box(&out);
        out.clear();
        rounds += 1;
    }
    let wall = start.elapsed().as_secs_f64();
    // Per CPU-second of this thread: the machine may be shared, and "one core" means the
    // time this thread actually ran.
    let secs = (thread_cpu_secs() - cpu_start).max(1e-9);
    let s = r.stats();
    println!(
        "{:<46} {:>6.2} M exchanges/s  {:>7.0} MB/s captured  {:>7.0} MB/s on the wire  (per CPU-second; {:.0}% of wall time on CPU; {} events/round, {} unknown, {} parse errors)",
        w.name,
        exchanges as f64 / secs / 1e6,
        (captured * rounds) as f64 / secs / 1e6,
        (wire * rounds) as f64 / secs / 1e6,
        100.0 * secs / wall,
        w.round.len(),
        s.unknown_exchanges,
        s.parse_errors,
    );
    assert_eq!(
        exchanges,
        rounds * w.exchanges_per_round as u64,
        "{}: every exchange completes",
        w.name
    );
}

/// This thread's CPU time in seconds.
fn thread_cpu_secs() -> f64 {
    crate::thread_cpu_ns() as f64 / 1e9
}

fn conn(fd: u32) -> ConnId {
    ConnId {
        pid: 1000 + fd % 7,
        fd,
        generation: 1,
    }
}

fn connect(fd: u32, role: Role) -> Event {
    let kind = if role == Role::Server {
        ConnEventKind::Accept
    } else {
        ConnEventKind::Connect { errno: 0 }
    };
    let c = conn(fd);
    Event::Conn(ConnEvent {
        conn: c,
        role,
        tuple: None,
        pid: c.pid,
        tid: c.pid,
        ts_ns: 1,
        kind,
    })
}

fn data(fd: u32, role: Role, dir: Direction, ts: u64, payload: &Bytes, len: u64) -> Event {
    let c = conn(fd);
    Event::Data(DataEvent {
        conn: c,
        role,
        direction: dir,
        syscall: Syscall::Other,
        tuple: None,
        pid: c.pid,
        tid: c.pid,
        goid: None,
        interleaved: false,
        ts_enter_ns: ts,
        ts_exit_ns: ts + 1000,
        len,
        payload: payload.clone(),
    })
}

const CONNS: u32 = 256;

/// Clients on keep-alive connections: GET, 200 with a 512-byte body, wholly captured.
fn http1_small() -> Workload {
    let req = Bytes::from_static(
        b"GET /api/v1/users/12345/orders?limit=10 HTTP/1.1\r\nHost: orders.svc:8080\r\nUser-Agent: bench/1\r\nAccept: */*\r\nX-Request-Id: 5b1e3c1a-8f0e-4a55-9a9e-6c3b1c2d7e10\r\n\r\n",
    );
    let mut resp = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 512\r\nDate: Sun, 29 Nov 2026 15:00:00 GMT\r\n\r\n".to_vec();
    resp.extend(std::iter::repeat_n(b'x', 512));
    let resp = Bytes::from(resp);
    let setup = (0..CONNS).map(|fd| connect(fd, Role::Client)).collect();
    let mut round = Vec::new();
    for i in 0..16u64 {
        for fd in 0..CONNS {
            round.push(data(
                fd,
                Role::Client,
                Direction::Egress,
                i * 10,
                &req,
                req.len() as u64,
            ));
            round.push(data(
                fd,
                Role::Client,
                Direction::Ingress,
                i * 10 + 5,
                &resp,
                resp.len() as u64,
            ));
        }
    }
    Workload {
        name: "http1 keep-alive, 512 B bodies, full capture",
        setup,
        round,
        exchanges_per_round: 16 * CONNS as usize,
    }
}

/// Servers answering 64 KiB bodies of which 4 KiB per write are captured.
fn http1_large() -> Workload {
    let req = Bytes::from_static(
        b"GET /blobs/9f86d081884c7d659a2feaa0c55ad015 HTTP/1.1\r\nHost: blobs\r\n\r\n",
    );
    let mut resp = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 65536\r\n\r\n".to_vec();
    let head = resp.len() as u64;
    resp.extend(std::iter::repeat_n(b'y', 4096 - resp.len()));
    let resp = Bytes::from(resp);
    let setup = (0..CONNS).map(|fd| connect(fd, Role::Server)).collect();
    let mut round = Vec::new();
    for i in 0..16u64 {
        for fd in 0..CONNS {
            round.push(data(
                fd,
                Role::Server,
                Direction::Ingress,
                i * 10,
                &req,
                req.len() as u64,
            ));
            round.push(data(
                fd,
                Role::Server,
                Direction::Egress,
                i * 10 + 5,
                &resp,
                head + 65536,
            ));
        }
    }
    Workload {
        name: "http1 keep-alive, 64 KiB bodies, 4 KiB captured",
        setup,
        round,
        exchanges_per_round: 16 * CONNS as usize,
    }
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// How the bench's peers encode header blocks.
#[derive(Clone, Copy, PartialEq)]
enum Hpack {
    /// loona-hpack's encoder: a field whose name is in the static table goes as a literal
    /// without indexing, every time (`:path`, `:authority`, `content-type`…): worst case.
    Loona,
    /// As Go's (x/net/http2/hpack) and nghttp2's encoders do: every field is added to the
    /// dynamic table once, then sent as an index: gRPC's repeated calls of one method.
    IndexAll,
    /// Loona's request fields plus a `traceparent` with a new trace id on every call, added to
    /// the dynamic table as Go's encoder would: no two request blocks alike, each changes the
    /// table (the worst case: every block decoded anew).
    TracePerCall,
    /// The same with every string Huffman-coded, as real clients send them (gRPC's, Go's,
    /// hyper's, Envoy's encoders Huffman-code a string whenever that is shorter).
    TracePerCallHuffman,
    /// A new `traceparent` per call as grpc-go's encoder (Go's `hpack`) sends it: every field
    /// indexed once in the table, each `traceparent` a literal with incremental indexing and
    /// its name from the table, strings Huffman-coded when shorter ([`Encoder`]).
    TracePerCallAsGo,
}

/// An HPACK encoder as Go's `hpack.Encoder` encodes: a field in the table (static or dynamic)
/// is sent indexed; otherwise as a literal with incremental indexing, its name indexed when the
/// table has it; strings Huffman-coded when that is shorter. A round's blocks start with the
/// table emptied (two size updates, 0 then 4096), so the round replays from any table.
struct Encoder {
    /// Newest first.
    table: std::collections::VecDeque<(Vec<u8>, Vec<u8>)>,
    size: usize,
}

impl Encoder {
    const MAX: usize = hpack::DEFAULT_TABLE_SIZE;

    fn new() -> Self {
        Encoder {
            table: Default::default(),
            size: 0,
        }
    }

    /// The round's first block: the table emptied, then `fields`.
    fn first_block(&mut self, fields: &[(&[u8], &[u8])]) -> Vec<u8> {
        self.table.clear();
        self.size = 0;
        // Size updates to 0, then back to the default.
        let mut b = Vec::new();
        hpack::encode_int(&mut b, 0x20, 5, 0);
        hpack::encode_int(&mut b, 0x20, 5, Self::MAX);
        b.extend(self.block(fields));
        b
    }

    fn block(&mut self, fields: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut b = Vec::new();
        for &(n, v) in fields {
            let all = || {
                hpack::STATIC_TABLE
                    .iter()
                    .map(|&(n, v)| (n, v))
                    .chain(self.table.iter().map(|(n, v)| (&n[..], &v[..])))
            };
            if let Some(i) = all().position(|f| f == (n, v)) {
                hpack::encode_int(&mut b, 0x80, 7, i + 1);
                continue;
            }
            match all().position(|f| f.0 == n) {
                Some(i) => hpack::encode_int(&mut b, 0x40, 6, i + 1),
                None => {
                    b.push(0x40);
                    shorter_string(&mut b, n);
                }
            }
            shorter_string(&mut b, v);
            let need = n.len() + v.len() + 32;
            while self.size + need > Self::MAX
                && let Some((n, v)) = self.table.pop_back()
            {
                self.size -= n.len() + v.len() + 32;
            }
            self.table.push_front((n.to_vec(), v.to_vec()));
            self.size += need;
        }
        b
    }
}

/// A string literal, Huffman-coded when that is shorter (as Go's encoder chooses).
fn shorter_string(out: &mut Vec<u8>, s: &[u8]) {
    hpack::encode_str(out, s, huffman::encoded_len(s) < s.len());
}

/// A literal header field with incremental indexing, new name, no Huffman (short strings).
fn literal_indexed(out: &mut Vec<u8>, (n, v): (&[u8], &[u8])) {
    out.push(0x40);
    hpack::encode_str(out, n, false);
    hpack::encode_str(out, v, false);
}

/// The request fields as literals without indexing (literal names where the static table has
/// none, so the block never refers to the dynamic table and replays whatever it holds), then a
/// `traceparent` unique to (connection, call) with incremental indexing.
fn traced_request_block(fields: &[(&[u8], &[u8])], conn: u32, call: u32, huff: bool) -> Vec<u8> {
    let mut b = Vec::new();
    for (n, v) in fields {
        b.push(0x00);
        hpack::encode_str(&mut b, n, huff);
        hpack::encode_str(&mut b, v, huff);
    }
    let tp = traceparent(conn, call);
    b.push(0x40);
    hpack::encode_str(&mut b, b"traceparent", huff);
    hpack::encode_str(&mut b, tp.as_bytes(), huff);
    b
}

/// A W3C `traceparent` unique to (connection, call).
fn traceparent(conn: u32, call: u32) -> String {
    format!(
        "00-{:032x}-{:016x}-01",
        (u64::from(conn) << 32) | u64::from(call),
        call + 1
    )
}

/// Indexed fields for the dynamic table's entries, given as their insertion order (first
/// inserted first) among `total` inserted: the newest entry is 62.
fn indexed(order: &[usize], total: usize) -> Vec<u8> {
    order
        .iter()
        .map(|&i| 0x80 | (62 + total - 1 - i) as u8)
        .collect()
}

/// gRPC clients: unary calls, 8 in flight per connection, 100-byte messages.
/// The gRPC row `as grpc-go encodes`, for the recorder bench's redaction: (set-up events, one
/// round that can be replayed as often as needed).
pub(crate) fn grpc_as_go_events() -> (Vec<Event>, Vec<Event>) {
    let w = grpc_unary(Hpack::TracePerCallAsGo);
    (w.setup, w.round)
}

fn grpc_unary(hpack: Hpack) -> Workload {
    const GRPC_CONNS: u32 = 64;
    const CALLS: u32 = 64;
    let mut setup = Vec::new();
    let mut round = Vec::new();
    let msg = {
        let mut m = vec![0u8, 0, 0, 0, 100];
        m.extend(std::iter::repeat_n(b'm', 100));
        m
    };
    let req_h: [(&[u8], &[u8]); 7] = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/shop.v1.Orders/GetOrder"),
        (b":authority", b"orders.svc:50051"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"grpc-timeout", b"1S"),
    ];
    let resp_h: [(&[u8], &[u8]); 2] =
        [(b":status", b"200"), (b"content-type", b"application/grpc")];
    let trailers: [(&[u8], &[u8]); 2] = [(b"grpc-status", b"0"), (b"grpc-message", b"")];
    for fd in 0..GRPC_CONNS {
        let (mut ce, mut se) = (loona_hpack::Encoder::new(), loona_hpack::Encoder::new());
        setup.push(connect(fd, Role::Client));
        // Preface and a first call that fills both HPACK tables (IndexAll) or leaves them as
        // loona's encoder does: either way the round's blocks leave the tables as they found
        // them, so the round can be replayed as often as needed.
        let mut first = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        first.extend(frame(4, 0, 0, &[]));
        let mut answer;
        let (req_block, resp_block, trailers_block);
        if hpack != Hpack::IndexAll {
            first.extend(frame(1, 0x5, 1, &ce.encode(req_h)));
            answer = frame(1, 0x4, 1, &se.encode(resp_h));
            answer.extend(frame(1, 0x5, 1, &se.encode(trailers)));
            (req_block, resp_block, trailers_block) = (None, None, None);
        } else {
            let (mut q, mut h, mut t) = (Vec::new(), Vec::new(), Vec::new());
            req_h.iter().for_each(|f| literal_indexed(&mut q, *f));
            resp_h.iter().for_each(|f| literal_indexed(&mut h, *f));
            trailers.iter().for_each(|f| literal_indexed(&mut t, *f));
            first.extend(frame(1, 0x5, 1, &q));
            answer = frame(1, 0x4, 1, &h);
            answer.extend(frame(1, 0x5, 1, &t));
            req_block = Some(indexed(&[0, 1, 2, 3, 4, 5, 6], 7));
            resp_block = Some(indexed(&[0, 1], 4));
            trailers_block = Some(indexed(&[2, 3], 4));
        }
        setup.push(data(
            fd,
            Role::Client,
            Direction::Egress,
            0,
            &Bytes::from(first.clone()),
            first.len() as u64,
        ));
        setup.push(data(
            fd,
            Role::Client,
            Direction::Ingress,
            1,
            &Bytes::from(answer.clone()),
            answer.len() as u64,
        ));
        let mut batch_req = Vec::new();
        let mut batch_resp = Vec::new();
        let (mut go_client, mut go_server) = (Encoder::new(), Encoder::new());
        for call in 0..CALLS {
            // Stream ids restart per round: the round replays the same ids after they closed,
            // which the reassembler treats as new streams.
            let id = 2 * call + 3;
            let enc = |e: &mut loona_hpack::Encoder, b: &Option<Vec<u8>>, h: &[(&[u8], &[u8])]| {
                b.clone().unwrap_or_else(|| e.encode(h.iter().copied()))
            };
            let (req, resp, trail) = if hpack == Hpack::TracePerCallAsGo {
                let tp = traceparent(fd, call);
                let mut fields = req_h.to_vec();
                fields.push((b"traceparent", tp.as_bytes()));
                let block = |e: &mut Encoder, f: &[(&[u8], &[u8])]| {
                    if call == 0 {
                        e.first_block(f)
                    } else {
                        e.block(f)
                    }
                };
                (
                    block(&mut go_client, &fields),
                    block(&mut go_server, &resp_h),
                    go_server.block(&trailers),
                )
            } else {
                let req = if matches!(hpack, Hpack::TracePerCall | Hpack::TracePerCallHuffman) {
                    traced_request_block(&req_h, fd, call, hpack == Hpack::TracePerCallHuffman)
                } else {
                    enc(&mut ce, &req_block, &req_h)
                };
                (
                    req,
                    enc(&mut se, &resp_block, &resp_h),
                    enc(&mut se, &trailers_block, &trailers),
                )
            };
            batch_req.extend(frame(1, 0x4, id, &req));
            batch_req.extend(frame(0, 0x1, id, &msg));
            batch_resp.extend(frame(1, 0x4, id, &resp));
            batch_resp.extend(frame(0, 0, id, &msg));
            batch_resp.extend(frame(1, 0x5, id, &trail));
            if call % 8 == 7 {
                let (q, p) = (
                    Bytes::from(std::mem::take(&mut batch_req)),
                    Bytes::from(std::mem::take(&mut batch_resp)),
                );
                round.push(data(
                    fd,
                    Role::Client,
                    Direction::Egress,
                    call as u64,
                    &q,
                    q.len() as u64,
                ));
                round.push(data(
                    fd,
                    Role::Client,
                    Direction::Ingress,
                    call as u64 + 1,
                    &p,
                    p.len() as u64,
                ));
            }
        }
    }
    Workload {
        name: match hpack {
            Hpack::Loona => "grpc unary, 8 in flight, 100 B, literal fields",
            Hpack::IndexAll => "grpc unary, 8 in flight, 100 B, indexed fields",
            Hpack::TracePerCall => "grpc unary, 8 in flight, 100 B, a new traceparent per call",
            Hpack::TracePerCallHuffman => {
                "grpc unary, 8 in flight, 100 B, a new traceparent per call, Huffman-coded"
            }
            Hpack::TracePerCallAsGo => {
                "grpc unary, 8 in flight, 100 B, a new traceparent per call, as grpc-go encodes"
            }
        },
        setup,
        round,
        exchanges_per_round: (GRPC_CONNS * CALLS) as usize,
    }
}
