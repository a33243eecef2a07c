use retry_common::{
    AF_INET, AF_INET6, ConnRecord, DataHeader, KIND_CONN, KIND_DATA, KIND_PROCESS_EXIT,
    ProcessExitRecord, SockTuple, conn_kind, data_flags, direction, role, syscall,
};

use super::*;

fn as_bytes<T: aya::Pod>(v: &T) -> Vec<u8> {
    // SAFETY: Pod types have no padding; reading their bytes is defined.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

fn v4_tuple() -> SockTuple {
    let mut t = SockTuple {
        family: AF_INET,
        lport: 40000,
        rport: 8080,
        ..Default::default()
    };
    t.laddr[..4].copy_from_slice(&[127, 0, 0, 1]);
    t.raddr[..4].copy_from_slice(&[127, 0, 0, 2]);
    t
}

fn data_record(payload: &[u8], captured: u32) -> Vec<u8> {
    let h = DataHeader {
        kind: KIND_DATA,
        syscall: syscall::WRITE,
        pid: 10,
        tid: 11,
        fd: 5,
        role: role::CLIENT,
        direction: direction::EGRESS,
        flags: 0,
        captured,
        generation: 77,
        ts_enter_ns: 100,
        ts_exit_ns: 150,
        ret: 1000,
        len: 1000,
        tuple: v4_tuple(),
        goroutine: 0,
    };
    let mut raw = as_bytes(&h);
    raw.extend_from_slice(payload);
    raw
}

#[test]
fn data_record_decodes_every_field() {
    let raw = data_record(b"GET / HTTP/1.1\r\n", 16);
    let Ok(Event::Data(d)) = decode(&raw) else {
        panic!("not data: {:?}", decode(&raw))
    };
    assert_eq!(
        d.conn,
        ConnId {
            pid: 10,
            fd: 5,
            generation: 77
        }
    );
    assert_eq!((d.pid, d.tid), (10, 11));
    assert_eq!(d.role, Role::Client);
    assert_eq!(d.direction, Direction::Egress);
    assert_eq!(d.syscall, Syscall::Write);
    assert_eq!((d.ts_enter_ns, d.ts_exit_ns, d.len), (100, 150, 1000));
    assert_eq!(&d.payload[..], b"GET / HTTP/1.1\r\n");
    assert!(!d.is_complete());
    assert_eq!(d.goid, None, "not a Go program: no goroutine context");
    let t = d.tuple.unwrap();
    assert_eq!(t.local, "127.0.0.1:40000".parse().unwrap());
    assert_eq!(t.remote, "127.0.0.2:8080".parse().unwrap());
}

#[test]
fn a_go_programs_goroutine_context_is_kept() {
    let mut raw = data_record(b"GET / HTTP/1.1\r\n", 16);
    raw[112..120].copy_from_slice(&0xc000_1234_u64.to_le_bytes());
    let Ok(Event::Data(d)) = decode(&raw) else {
        panic!("not data")
    };
    assert_eq!(d.goid, Some(0xc000_1234));
}

#[test]
fn payload_shorter_than_captured_is_an_error_not_a_panic() {
    let raw = data_record(b"GET", 16);
    assert!(matches!(
        decode(&raw),
        Err(DecodeError::Short {
            what: "payload",
            ..
        })
    ));
    let raw = data_record(b"", u32::MAX);
    assert!(decode(&raw).is_err());
}

#[test]
fn truncated_and_garbage_records_are_errors() {
    let raw = data_record(b"x", 1);
    for cut in 0..raw.len() - 1 {
        assert!(decode(&raw[..cut]).is_err(), "cut at {cut}");
    }
    assert_eq!(
        decode(&[9, 0, 0, 0, 0, 0, 0, 0]),
        Err(DecodeError::UnknownKind(9))
    );
    let mut bad_dir = data_record(b"", 0);
    bad_dir[24] = 7; // direction field
    assert!(matches!(
        decode(&bad_dir),
        Err(DecodeError::UnknownValue {
            what: "direction",
            value: 7
        })
    ));
    let mut bad_role = data_record(b"", 0);
    bad_role[20] = 9;
    assert!(matches!(
        decode(&bad_role),
        Err(DecodeError::UnknownValue { what: "role", .. })
    ));
}

#[test]
fn arbitrary_bytes_never_panic() {
    // Cheap deterministic fuzz: every prefix of several pseudo-random buffers tagged with each kind.
    let mut x: u64 = 0x9e3779b97f4a7c15;
    for kind in [KIND_DATA, KIND_CONN, KIND_PROCESS_EXIT, 0, 4] {
        for _ in 0..50 {
            let mut buf: Vec<u8> = (0..300)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            buf[..4].copy_from_slice(&kind.to_ne_bytes());
            for len in [0, 3, 4, 15, 16, 95, 96, 111, 112, 113, 300] {
                let _ = decode(&buf[..len]);
            }
        }
    }
}

#[test]
fn conn_records_map_to_kinds_with_errno() {
    let cases = [
        (
            conn_kind::CONNECT,
            111,
            ConnEventKind::Connect { errno: 111 },
        ),
        (conn_kind::ESTABLISHED, 0, ConnEventKind::Established),
        (conn_kind::FAILED, 110, ConnEventKind::Failed { errno: 110 }),
        (conn_kind::ACCEPT, 0, ConnEventKind::Accept),
        (conn_kind::CLOSE, 0, ConnEventKind::Close),
        (conn_kind::RESET, 104, ConnEventKind::Reset { errno: 104 }),
        (
            conn_kind::STREAM,
            0,
            ConnEventKind::Stream {
                id: 7,
                context: 0xc000 | retry_common::GOROUTINE_ROOTED,
            },
        ),
    ];
    for (k, errno, want) in cases {
        let r = ConnRecord {
            kind: KIND_CONN,
            conn_kind: k,
            pid: 3,
            tid: 4,
            fd: 9,
            role: role::SERVER,
            errno,
            generation: 5,
            ts_ns: 6,
            tuple: v4_tuple(),
            stream_id: 7,
            context: 0xc000 | retry_common::GOROUTINE_ROOTED,
            ..Default::default()
        };
        let Ok(Event::Conn(c)) = decode(&as_bytes(&r)) else {
            panic!("kind {k}")
        };
        assert_eq!(c.kind, want);
        assert_eq!(
            c.conn,
            ConnId {
                pid: 3,
                fd: 9,
                generation: 5
            }
        );
        assert_eq!((c.pid, c.tid, c.ts_ns, c.role), (3, 4, 6, Role::Server));
    }
    let r = ConnRecord {
        kind: KIND_CONN,
        conn_kind: 42,
        ..Default::default()
    };
    assert!(decode(&as_bytes(&r)).is_err());
}

#[test]
fn process_exit_decodes() {
    let r = ProcessExitRecord {
        kind: KIND_PROCESS_EXIT,
        pid: 1234,
        ts_ns: 99,
        ..Default::default()
    };
    assert_eq!(
        decode(&as_bytes(&r)),
        Ok(Event::ProcessExit {
            pid: 1234,
            ts_ns: 99
        })
    );
}

/// A process gone before /proc was read (a short-lived curl) is named by its exit record.
#[test]
fn exit_records_carry_the_comm() {
    let mut comm = [0u8; 16];
    comm[..4].copy_from_slice(b"curl");
    let r = ProcessExitRecord {
        kind: KIND_PROCESS_EXIT,
        pid: 5,
        ts_ns: 1,
        comm,
    };
    assert_eq!(exit_comm(&as_bytes(&r)).as_deref(), Some("curl"));
    // All 16 bytes used (the kernel keeps 15 and a NUL, but never trust the record).
    let r = ProcessExitRecord {
        comm: *b"abcdefghijklmnop",
        ..r
    };
    assert_eq!(
        exit_comm(&as_bytes(&r)).as_deref(),
        Some("abcdefghijklmnop")
    );
    let nameless = ProcessExitRecord { comm: [0; 16], ..r };
    assert_eq!(
        exit_comm(&as_bytes(&nameless)),
        None,
        "an empty comm names nothing"
    );
    let exec = ProcessExitRecord {
        kind: retry_common::KIND_PROCESS_EXEC,
        comm,
        ..r
    };
    assert_eq!(exit_comm(&as_bytes(&exec)), None, "only exits");
    assert_eq!(exit_comm(&as_bytes(&r)[..16]), None, "truncated");
}

#[test]
fn exec_records_are_recognised_not_decoded() {
    let r = ProcessExitRecord {
        kind: retry_common::KIND_PROCESS_EXEC,
        pid: 77,
        ts_ns: 1,
        ..Default::default()
    };
    assert_eq!(exec_pid(&as_bytes(&r)), Some(77));
    assert_eq!(decode(&as_bytes(&r)), Err(DecodeError::UnknownKind(4)));
    let exit = ProcessExitRecord {
        kind: KIND_PROCESS_EXIT,
        pid: 77,
        ts_ns: 1,
        ..Default::default()
    };
    assert_eq!(exec_pid(&as_bytes(&exit)), None);
    assert_eq!(exec_pid(&[4, 0, 0]), None);
}

#[test]
fn v6_tuples_and_mapped_v4() {
    let mut t = SockTuple {
        family: AF_INET6,
        lport: 1,
        rport: 2,
        ..Default::default()
    };
    t.laddr = "::1".parse::<std::net::Ipv6Addr>().unwrap().octets();
    t.raddr = "::ffff:10.1.2.3"
        .parse::<std::net::Ipv6Addr>()
        .unwrap()
        .octets();
    let got = tuple_of(&t).unwrap();
    assert_eq!(got.local, "[::1]:1".parse().unwrap());
    assert_eq!(got.remote, "10.1.2.3:2".parse().unwrap());
    assert_eq!(tuple_of(&SockTuple::default()), None);
}

#[test]
fn sock_tuple_round_trips() {
    for (l, r) in [
        ("127.0.0.1:5", "127.0.0.9:80"),
        ("[fe80::1]:7", "[::1]:443"),
    ] {
        let t = Tuple {
            local: l.parse().unwrap(),
            remote: r.parse().unwrap(),
        };
        assert_eq!(tuple_of(&sock_tuple(&t)), Some(t));
    }
}

/// Payloads cut from a shared arena decode to the same events, each with its own bytes, also
/// past a chunk's end and for a payload larger than a chunk.
#[test]
fn payloads_from_the_arena_equal_copied_ones() {
    let mut arena = PayloadArena::default();
    let mut kept = Vec::new();
    for (i, n) in [10usize, 1000, 70_000, 5, 64 * 1024]
        .into_iter()
        .enumerate()
    {
        let payload: Vec<u8> = (0..n).map(|j| (i * 7 + j) as u8).collect();
        let raw = data_record(&payload, n as u32);
        let a = decode_in(&raw, Some(&mut arena)).unwrap();
        assert_eq!(a, decode(&raw).unwrap());
        kept.push((a, payload));
    }
    for (ev, payload) in kept {
        let Event::Data(d) = ev else { panic!("data") };
        assert_eq!(&d.payload[..], &payload[..]);
    }
}

fn summary_record(line: &[u8], status: u16) -> Vec<u8> {
    record_of(retry_common::KIND_SUMMARY, line, status, 1)
}

/// A `SummaryRecord` of `kind` (summary or tally) as the kernel sends it.
fn record_of(kind: u32, line: &[u8], status: u16, weight: u16) -> Vec<u8> {
    let request = DataHeader {
        kind: KIND_DATA,
        syscall: syscall::RECVFROM,
        pid: 10,
        tid: 11,
        fd: 5,
        role: role::SERVER,
        direction: direction::INGRESS,
        flags: data_flags::INTERLEAVED,
        captured: line.len() as u32,
        generation: 77,
        ts_enter_ns: 100,
        ts_exit_ns: 100,
        ret: 300,
        len: 300,
        tuple: v4_tuple(),
        goroutine: 0,
    };
    let response = DataHeader {
        syscall: syscall::SENDTO,
        tid: 12,
        direction: direction::EGRESS,
        flags: 0,
        captured: 0,
        ts_enter_ns: 180,
        ts_exit_ns: 180,
        ret: 2000,
        len: 2000,
        ..request
    };
    let mut r = retry_common::SummaryRecord {
        kind,
        status,
        weight,
        response,
        request,
        bytes: [0; retry_common::HELD_BYTES],
    };
    r.bytes[..line.len()].copy_from_slice(line);
    // As the kernel sends it: up to the request's captured bytes.
    let mut raw = as_bytes(&r);
    raw.truncate(retry_common::SUMMARY_HEAD + line.len());
    raw
}

#[test]
fn a_summary_is_its_two_records_and_the_held_request() {
    let raw = summary_record(
        b"GET /a/1?token=x HTTP/1.1\r\nAuthorization: Bearer s\r\n",
        204,
    );
    let Ok(Event::Summary(s)) = decode(&raw) else {
        panic!("not a summary: {:?}", decode(&raw))
    };
    assert_eq!(s.status, 204);
    let (q, a) = (&s.request, &s.response);
    assert_eq!(q.conn, a.conn);
    assert_eq!(
        (q.role, q.direction, q.tid),
        (Role::Server, Direction::Ingress, 11)
    );
    assert_eq!((a.direction, a.tid), (Direction::Egress, 12));
    // The kernel's word that the request was read among others its thread had not answered.
    assert!(q.interleaved && !a.interleaved);
    assert_eq!(
        (q.ts_exit_ns, q.len, a.ts_exit_ns, a.len),
        (100, 300, 180, 2000)
    );
    // The request as the kernel held it (`captured` bytes of it), headers and all: downstream
    // reads and redacts it as a whole one.
    assert_eq!(
        &q.payload[..],
        b"GET /a/1?token=x HTTP/1.1\r\nAuthorization: Bearer s\r\n"
    );
    assert!(a.payload.is_empty());
    assert_eq!(Event::Summary(s.clone()).ts_ns(), 180);
    assert_eq!(Event::Summary(s).pid(), 10);
}

#[test]
fn malformed_summaries_are_errors() {
    let good = summary_record(b"GET / HTTP/1.1\r\n", 200);
    for cut in [4, 100, good.len() - 1] {
        assert!(decode(&good[..cut]).is_err(), "cut at {cut}");
    }
    // A record with room past its request (the whole struct) reads the same.
    let mut padded = good.clone();
    padded.resize(size_of::<retry_common::SummaryRecord>(), 0xAA);
    assert_eq!(decode(&padded).ok(), decode(&good).ok());
    assert!(decode(&good).is_ok());
    // A summary says its status; only a tally has none.
    assert!(decode(&summary_record(b"GET / HTTP/1.1\r\n", 0)).is_err());
    // An inner header that is not a data header (the kernel's copy failed).
    let mut bad = good.clone();
    let at = std::mem::offset_of!(retry_common::SummaryRecord, request);
    bad[at..at + 4].copy_from_slice(&0u32.to_le_bytes());
    assert!(decode(&bad).is_err());
    // A request longer than the record holds is an error, never read past the record.
    let mut long = good;
    let captured = at + std::mem::offset_of!(DataHeader, captured);
    long[captured..captured + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(decode(&long).is_err());
}

#[test]
fn weights_and_tallies() {
    use retry_common::{KIND_SUMMARY, KIND_TALLY};
    let line = b"GET /a HTTP/1.1\r\n";
    let Ok(Event::Summary(s)) = decode(&record_of(KIND_SUMMARY, line, 200, 16)) else {
        panic!("not a summary")
    };
    assert_eq!((s.status, s.weight, s.is_tally()), (200, 16, false));
    // A kernel that does not weigh (0) sends each: one.
    let Ok(Event::Summary(s)) = decode(&record_of(KIND_SUMMARY, line, 200, 0)) else {
        panic!("not a summary")
    };
    assert_eq!(s.weight, 1);
    // A tally: the count, the connection's last request for its identity, no status (whatever
    // the entry's field held from its last summary).
    let Ok(Event::Summary(t)) = decode(&record_of(KIND_TALLY, line, 204, 5)) else {
        panic!("not a tally")
    };
    assert_eq!((t.status, t.weight, t.is_tally()), (0, 5, true));
    assert_eq!(&t.request.payload[..], line);
}
