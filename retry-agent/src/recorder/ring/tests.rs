//! The ring: records in and out, in order, charged what they store, let go by block.
use std::net::{SocketAddr, SocketAddrV6};

use super::{
    codec::{HEADER, SYSCALLS, meta_len},
    *,
};
use crate::capture::{ConnId, DataEvent, Direction, Role, SummaryEvent, Syscall, Tuple};

#[test]
fn every_syscall_decodes_to_itself() {
    for (i, s) in SYSCALLS.iter().enumerate() {
        assert_eq!(*s as usize, i, "{s:?}");
    }
    // A variant added to Syscall must be added to SYSCALLS too.
    assert_eq!(Syscall::Other as usize, SYSCALLS.len() - 1);
}

fn event(tuple: Option<Tuple>, goid: Option<u64>, payload: &[u8]) -> DataEvent {
    DataEvent {
        conn: ConnId {
            pid: 7,
            fd: 9,
            generation: u64::MAX - 3,
        },
        role: Role::Unknown,
        direction: Direction::Ingress,
        syscall: Syscall::SslRead,
        tuple,
        pid: 7,
        tid: 8,
        goid,
        interleaved: false,
        ts_enter_ns: 100,
        ts_exit_ns: 200,
        len: 1 << 40,
        payload: bytes::Bytes::copy_from_slice(payload),
    }
}

#[test]
fn data_events_come_back_as_they_went_in() {
    let v6 = "[fe80::1%3]:8080".parse::<SocketAddrV6>().map(|mut a| {
        a.set_flowinfo(0x12345);
        SocketAddr::V6(a)
    });
    let tuples = [
        None,
        Some(Tuple {
            local: "10.0.0.1:1".parse().unwrap(),
            remote: v6.unwrap(),
        }),
    ];
    let mut ring = Ring::default();
    let mut want = Vec::new();
    for t in tuples {
        for g in [None, Some(42)] {
            for p in [&b""[..], b"GET / HTTP/1.1\r\n\r\n"] {
                // Entry and exit the same clock read (a syscall's) or not (TLS); the thread's
                // process the connection's or another (an inherited socket); read among others
                // its thread had not answered or not.
                for (enter, pid) in [(100, 7), (200, 7), (100, 70), (200, 70)] {
                    let mut d = event(t, g, p);
                    (d.ts_enter_ns, d.pid) = (enter, pid);
                    d.interleaved = pid == 70;
                    ring.push_data(&d, |b| b.len());
                    want.push(d);
                }
            }
        }
    }
    let got: Vec<DataEvent> = ring
        .iter()
        .map(|(ts, e)| {
            assert_eq!(ts, 200);
            match e.to_record() {
                Some(Record::Event(Event::Data(d))) => d,
                _ => panic!("not a data event"),
            }
        })
        .collect();
    assert_eq!(got, want);
}

/// A summary comes back whole: its answer on the request's connection and tuple (kept once,
/// so stored shorter) or, where the kernel learnt the tuple between the two, on its own.
#[test]
fn summaries_come_back_as_they_went_in() {
    let tuple = Some(Tuple {
        local: "10.0.0.1:1".parse().unwrap(),
        remote: "10.0.0.2:80".parse().unwrap(),
    });
    let summary = |response_tuple: Option<Tuple>| {
        let mut request = event(tuple, None, b"GET / HTTP/1.1\r\n\r\n");
        (request.role, request.direction, request.syscall) =
            (Role::Client, Direction::Egress, Syscall::Write);
        (request.ts_enter_ns, request.ts_exit_ns, request.len) = (100, 100, 18);
        let mut response = event(response_tuple, Some(5), b"");
        (response.role, response.tid) = (Role::Client, 11);
        (response.ts_enter_ns, response.ts_exit_ns, response.len) = (300, 300, 99);
        SummaryEvent {
            request,
            response,
            status: 204,
            weight: 1,
        }
    };
    let mut ring = Ring::default();
    let (same, learnt) = (summary(tuple), summary(None));
    // Status, the request's exit, its fields, which layout the answer has, the answer's
    // fields without its connection (16 bytes) and tuple (two IPv4 addresses, 14), the bytes.
    let compact = HEADER + 2 + 8 + meta_len(&same.request) + 1 + meta_len(&same.response) - 16 - 14
        + same.request.payload.len();
    ring.push_summary(&same, |b| b.len());
    assert_eq!(ring.bytes, compact);
    let after_same = ring.bytes;
    ring.push_summary(&learnt, |b| b.len());
    let got: Vec<SummaryEvent> = ring
        .iter()
        .map(|(_, e)| match e.to_record() {
            Some(Record::Event(Event::Summary(s))) => s,
            _ => panic!("not a summary"),
        })
        .collect();
    assert_eq!(got, vec![same.clone(), learnt]);
    // The learnt one keeps its answer's connection (and would its tuple, had it one).
    assert_eq!(ring.bytes - after_same, after_same + 16);
    // A weight other than one takes 4 bytes, and comes back; so does a tally's.
    for (status, weight) in [(204, 16), (0, 3)] {
        let mut ring = Ring::default();
        let weighted = SummaryEvent {
            status,
            weight,
            ..same.clone()
        };
        ring.push_summary(&weighted, |b| b.len());
        assert_eq!(ring.bytes, compact + 4);
        let back = ring.iter().map(|(_, e)| e.to_record()).next().flatten();
        assert!(matches!(back, Some(Record::Event(Event::Summary(s))) if s == weighted));
    }
}

#[test]
fn redaction_writes_into_the_ring() {
    let mut ring = Ring::default();
    ring.push_data(&event(None, None, b"secret"), |b| {
        b.fill(b'*');
        b.len()
    });
    let Some((_, e)) = ring.iter().next() else {
        panic!("empty ring")
    };
    let Some(Record::Event(Event::Data(d))) = e.to_record() else {
        panic!("not a data event")
    };
    assert_eq!(&d.payload[..], b"******");
}

/// What the redaction says to keep is stored, the rest left out as uncaptured (the
/// event's `len` unchanged); the record is charged what it stores.
#[test]
fn only_the_kept_prefix_is_stored() {
    let mut ring = Ring::default();
    let head = b"HTTP/1.1 200 OK\r\n\r\n";
    let mut p = head.to_vec();
    p.extend_from_slice(&[b'x'; 3000]);
    let d = event(None, None, &p);
    for keep in [head.len(), 0, p.len()] {
        ring.push_data(&d, |b| {
            b[keep..].fill(b'.');
            keep
        });
    }
    let full = HEADER + meta_len(&d);
    assert_eq!(ring.bytes(), 3 * full + head.len() + p.len());
    let got: Vec<DataEvent> = ring
        .iter()
        .filter_map(|(_, e)| match e.to_record() {
            Some(Record::Event(Event::Data(d))) => Some(d),
            _ => None,
        })
        .collect();
    let payloads: Vec<&[u8]> = got.iter().map(|g| &g.payload[..]).collect();
    assert_eq!(payloads, [&head[..], b"", &p[..]]);
    assert!(
        got.iter().all(|g| g.len == d.len),
        "lengths are the syscall's"
    );
}

#[test]
fn blocks_are_let_go_as_records_leave() {
    let mut ring = Ring::default();
    let body = vec![b'x'; 1000];
    for i in 0..1000u64 {
        let mut d = event(None, None, &body);
        d.ts_exit_ns = i;
        ring.push_data(&d, |b| b.len());
    }
    assert!(ring.blocks.len() > 10);
    let ev = ring.evict(990, usize::MAX);
    assert_eq!(ev.aged, 990);
    assert_eq!(ring.len(), 10);
    assert_eq!(ring.front_ts(), Some(990));
    // The ten records left (~10 KB) lie in at most two blocks.
    assert!(ring.blocks.len() <= 2, "passed blocks are freed");
    let ev = ring.evict(0, 0);
    assert_eq!((ev.aged, ev.sized), (0, 10));
    assert_eq!((ring.len(), ring.bytes()), (0, 0));
    assert!(ring.blocks.is_empty() && ring.iter().next().is_none());
}

/// A frozen ring reads as the ring did when it was frozen, whatever the ring does next: the
/// ring appends to no block a snapshot holds, and what it lets go lives on in the snapshot.
#[test]
fn a_frozen_ring_is_unmoved_by_what_the_ring_does_next() {
    let mut ring = Ring::default();
    let exchange = |i: u64| {
        let a: std::net::SocketAddr = "127.0.0.1:1000".parse().unwrap();
        crate::testkit::ExchangeBuilder::server(i, 1, 1, a, a, i * 10, i * 10 + 1).build()
    };
    let push = |ring: &mut Ring, i: u64| {
        // ~1 KB a record: the ring spans many blocks.
        let mut p = format!("GET /{i} HTTP/1.1\r\n\r\n").into_bytes();
        p.resize(1000, b'x');
        let mut d = event(None, None, &p);
        d.ts_exit_ns = i * 10;
        ring.push_data(&d, |b| b.len());
        ring.push_exchange(&exchange(i));
    };
    let read = |entries: Vec<(u64, Entry<'_>)>| -> Vec<(u64, bool)> {
        entries
            .into_iter()
            .map(|(_, e)| match e.to_record() {
                Some(Record::Exchange(x)) => (x.id.0, true),
                Some(Record::Event(Event::Data(d))) => (d.ts_exit_ns / 10, false),
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    };
    for i in 0..100 {
        push(&mut ring, i);
    }
    let frozen = ring.freeze(0, 0, usize::MAX);
    let before = read(frozen.iter().collect());
    assert_eq!(before, read(ring.iter().collect()));
    assert_eq!(before.len(), 200);
    // The ring goes on: new records (into new blocks), every old one let go.
    for i in 100..300 {
        push(&mut ring, i);
    }
    ring.evict(1000, usize::MAX);
    assert_eq!(read(frozen.iter().collect()), before, "the snapshot moved");
    let now = read(ring.iter().collect());
    assert_eq!(now.len(), 400);
    assert_eq!(now.first(), Some(&(100, false)));
    // Frozen from a time on: whole blocks before it are left out and counted.
    assert!(ring.blocks.len() > 2);
    let late = ring.freeze(2500, 0, usize::MAX);
    assert!(late.skipped > 0 && late.iter().count() as u64 + late.skipped == 400);
    assert!(late.iter().all(|(ts, _)| ts >= 1000));
}

/// Blocks the ring lets go while a snapshot holds them stay on its books until the snapshot
/// lets them go; draining a snapshot lets each block go once its records were read, so the
/// ring's bound (which counts them) gets the memory back as a dump is written.
#[test]
fn retired_blocks_count_until_the_snapshot_lets_them_go() {
    let mut ring = Ring::default();
    let push = |ring: &mut Ring, i: u64| {
        let mut d = event(None, None, &[b'x'; 1000]);
        d.ts_exit_ns = i;
        ring.push_data(&d, |b| b.len());
    };
    for i in 0..300 {
        push(&mut ring, i);
    }
    let frozen = ring.freeze(0, 0, usize::MAX);
    let blocks = frozen.blocks.len();
    assert!(blocks >= 4, "{blocks} blocks");
    assert_eq!(
        ring.held(),
        0,
        "still in the ring: counted once, as its records"
    );
    // The ring lets every frozen block go: nothing is freed, all of it is counted.
    ring.evict(300, usize::MAX);
    assert_eq!(ring.len(), 0);
    assert_eq!(ring.held(), blocks * BLOCK);
    assert_eq!(ring.recount_held(), blocks * BLOCK);
    // Over a bound the held blocks alone exceed, new records do not stay.
    for i in 300..400 {
        push(&mut ring, i);
    }
    ring.evict(0, blocks * BLOCK);
    assert_eq!(ring.len(), 0, "the held blocks take the whole bound");
    // Drained: each block is let go once read, while the next ones are still held.
    let first = Arc::downgrade(&frozen.blocks[0].buf);
    let mut read = 0;
    frozen
        .drain(|ts, _| {
            if ts == 299 {
                assert_eq!(first.strong_count(), 0, "the first block was let go");
            }
            read += 1;
            Ok::<_, ()>(())
        })
        .unwrap();
    assert_eq!(read, 300);
    assert_eq!((ring.held(), ring.recount_held()), (0, 0));
}

/// An exchange with every optional field set and every flag raised, each to a value no other
/// field has: a field the codec dropped or swapped would not come back equal.
fn full_exchange() -> Exchange {
    use crate::l7::{Claim, ExchangeId, Failure, Method, OutcomeClass, Protocol, RetryMarkers};
    Exchange {
        id: ExchangeId(1),
        conn: crate::capture::ConnId {
            pid: 2,
            fd: 3,
            generation: 4,
        },
        role: crate::capture::Role::Server,
        protocol: Protocol::Http2,
        stream_id: Some(5),
        local: Some("10.0.0.1:6".parse().unwrap()),
        remote: Some("[fe80::1%2]:7".parse().unwrap()),
        pid: 8,
        tid: 9,
        response_tid: Some(10),
        goid: Some(11),
        request_start_ns: 12,
        request_end_ns: 13,
        response_start_ns: Some(14),
        response_end_ns: Some(15),
        method: Some(Method::Other("PROPFIND".into())),
        authority: Some("orders.shop.svc:8080".into()),
        path: Some("/a/very/long/path/beyond/twenty-four/bytes/é".into()),
        query_hash: Some(16),
        route: Some("/items/{id}".into()),
        status: Some(503),
        grpc_status: Some(17),
        outcome: OutcomeClass::Overload,
        failure: Some(Failure::RstStream(18)),
        idempotent: true,
        idempotency_key: true,
        retry_markers: RetryMarkers {
            envoy_attempt_count: Some(19),
            retry_attempt: Some(20),
            grpc_previous_attempts: Some(21),
        },
        trace_id: Some(22),
        retry_after: true,
        claim_header: Some(Claim::Unclaimed),
        body_hash: Some(23),
        unknown: true,
        request_bytes: 24,
        response_bytes: 25,
        sole_on_thread: true,
        handler_start_ns: Some(26),
        handler_end_ns: Some(27),
        threads_multiplexed: true,
        ended_ns: Some(28),
        weight: 29,
        tally: true,
    }
}

#[test]
fn exchanges_come_back_as_they_went_in() {
    use crate::l7::{Claim, Failure, Method, OutcomeClass, Protocol};
    let a: std::net::SocketAddr = "127.0.0.1:1000".parse().unwrap();
    let bare = crate::testkit::ExchangeBuilder::client(7, 1, 1, a, a, 10, 20).build();
    let mut cases = vec![full_exchange(), bare.clone()];
    // Each enum's every value, one field at a time on the bare exchange.
    for (i, m) in [
        Method::Get,
        Method::Head,
        Method::Post,
        Method::Put,
        Method::Delete,
        Method::Patch,
        Method::Options,
        Method::Connect,
        Method::Trace,
    ]
    .into_iter()
    .enumerate()
    {
        let f = [
            Failure::ConnectRefused,
            Failure::ConnectTimeout,
            Failure::Reset,
            Failure::ResetMidResponse,
            Failure::ClosedNoResponse,
            Failure::RstStream(1),
            Failure::GoAway(2),
            Failure::Abandoned,
            Failure::Reset,
        ][i];
        cases.push(Exchange {
            method: Some(m),
            failure: Some(f),
            outcome: OutcomeClass::ALL[i % 5],
            protocol: [Protocol::Http1, Protocol::Http2, Protocol::Opaque][i % 3],
            role: [Role::Client, Role::Server, Role::Unknown][i % 3],
            claim_header: Some([Claim::Claimed, Claim::Unclaimed, Claim::Missing][i % 3]),
            ..bare.clone()
        });
    }
    let mut ring = Ring::default();
    for x in &cases {
        ring.push_exchange(x);
    }
    let got: Vec<Exchange> = ring
        .iter()
        .map(|(ts, e)| match e.to_record() {
            Some(Record::Exchange(x)) => {
                assert_eq!(ts, x.end_ns());
                *x
            }
            other => panic!("not an exchange: {other:?}"),
        })
        .collect();
    assert_eq!(got, cases);
    // Even the full exchange (its strings long enough for the heap) costs the ring less than
    // its struct did; a typical one, a third of it.
    let mut one = Ring::default();
    one.push_exchange(&full_exchange());
    assert!(one.bytes() < size_of::<Exchange>(), "{} bytes", one.bytes());
    let mut one = Ring::default();
    one.push_exchange(&bare);
    assert!(
        one.bytes() < size_of::<Exchange>() / 2,
        "{} bytes",
        one.bytes()
    );
}

/// A cut or damaged exchange encoding decodes to nothing rather than to a wrong exchange or a
/// panic.
#[test]
fn a_cut_exchange_does_not_decode() {
    let mut enc = Vec::new();
    codec::put_exchange(&mut enc, &full_exchange());
    assert_eq!(codec::decode_exchange(&enc), Some(full_exchange()));
    for n in 0..enc.len() {
        assert_eq!(codec::decode_exchange(&enc[..n]), None, "cut at {n}");
    }
    let mut longer = enc.clone();
    longer.push(0);
    assert_eq!(codec::decode_exchange(&longer), None);
    // Every byte flipped in turn: never a panic.
    for i in 0..enc.len() {
        let mut bad = enc.clone();
        bad[i] ^= 0xff;
        let _ = codec::decode_exchange(&bad);
    }
}

/// A second snapshot from the first one's end holds every record after it once; what the ring
/// let go in between is the gap between their sequence numbers.
#[test]
fn a_snapshot_from_an_earlier_ones_end_takes_up_where_it_ended() {
    let push = |ring: &mut Ring, i: u64| {
        let mut p = format!("GET /{i} HTTP/1.1\r\n\r\n").into_bytes();
        p.resize(1000, b'x');
        let mut d = event(None, None, &p);
        d.ts_exit_ns = i;
        ring.push_data(&d, |b| b.len());
        if i.is_multiple_of(10) {
            ring.push_other(Record::Tick { now_ns: i });
        }
    };
    let times = |f: &Frozen| -> Vec<u64> { f.iter().map(|(ts, _)| ts).collect() };
    let mut ring = Ring::default();
    for i in 0..300 {
        push(&mut ring, i);
    }
    let first = ring.freeze(0, 0, usize::MAX);
    assert_eq!((first.first_seq, first.end_seq), (0, 330));
    // Nothing let go: the second part is exactly what came after, markers and all.
    for i in 300..400 {
        push(&mut ring, i);
    }
    let second = ring.freeze(0, first.end_seq, usize::MAX);
    assert_eq!((second.first_seq, second.end_seq), (330, 440));
    let mut both = times(&first);
    both.extend(times(&second));
    let mut want: Vec<u64> = Vec::new();
    for i in 0..400 {
        want.push(i);
        if i.is_multiple_of(10) {
            want.push(i);
        }
    }
    assert_eq!(both, want);
    assert!(second.iter().all(|(_, e)| e.to_record().is_some()));
    // The ring turns over: the part after the first one starts where the ring now starts.
    for i in 400..2000 {
        push(&mut ring, i);
    }
    ring.evict(1500, usize::MAX);
    let third = ring.freeze(0, first.end_seq, usize::MAX);
    assert!(third.first_seq > first.end_seq);
    assert_eq!(times(&third).first(), Some(&1500));
    assert_eq!(third.iter().count() as u64, third.end_seq - third.first_seq);
}

/// `n` requests (and a tick every ten) into `ring`.
fn fill(ring: &mut Ring, n: u64) {
    for i in 0..n {
        let p = format!(
            "GET /orders/{i}?page={} HTTP/1.1\r\nHost: orders\r\nUser-Agent: ********\r\n\r\n",
            i % 50
        );
        let mut d = event(None, None, p.as_bytes());
        d.ts_exit_ns = i;
        ring.push_data(&d, |b| b.len());
        if i.is_multiple_of(10) {
            ring.push_other(Record::Tick { now_ns: i });
        }
    }
}

/// A ring that packs its full blocks and one that does not, fed the same records.
fn plain_and_packed(n: u64) -> (Ring, Ring) {
    let (mut plain, mut packed) = (Ring::new(None), Ring::new(Some(0)));
    fill(&mut plain, n);
    fill(&mut packed, n);
    (plain, packed)
}

/// A ring packs only once it holds what it was told to pack above: a ring that never fills
/// spends nothing on packing.
#[test]
fn a_ring_packs_only_above_its_threshold() {
    let (plain, _) = plain_and_packed(5000);
    let mut ring = Ring::new(Some(plain.bytes() / 2));
    fill(&mut ring, 5000);
    let packed: Vec<bool> = ring.blocks.iter().map(|b| b.packed.is_some()).collect();
    let first = packed.iter().position(|&p| p).unwrap();
    assert!(
        first > 0 && packed[first..packed.len() - 1].iter().all(|&p| p),
        "{packed:?}"
    );
    assert_eq!(records(ring.iter()), records(plain.iter()));
}

fn records<'a>(entries: impl Iterator<Item = (u64, Entry<'a>)>) -> Vec<(u64, Option<Record>)> {
    entries.map(|(ts, e)| (ts, e.to_record())).collect()
}

/// Full blocks are packed: the ring reads the same records in the same order (live, frozen,
/// drained, frozen from an earlier snapshot's end inside a packed block), and is charged what
/// the packed blocks hold, so the same bound keeps several times the history.
#[test]
fn packed_blocks_read_as_plain_ones_for_less() {
    let (plain, packed) = plain_and_packed(5000);
    let n_packed = packed.blocks.iter().filter(|b| b.packed.is_some()).count();
    assert!(n_packed >= 2, "{n_packed} blocks packed");
    assert_eq!(n_packed + 1, packed.blocks.len(), "every full block packed");
    assert!(
        packed.bytes() * 3 < plain.bytes(),
        "{} vs {} bytes",
        packed.bytes(),
        plain.bytes()
    );
    assert_eq!((packed.len(), packed.front_ts()), (plain.len(), Some(0)));
    let want = records(plain.iter());
    assert_eq!(want.len(), 5500);
    assert!(want.iter().all(|(_, r)| r.is_some()));
    assert_eq!(records(packed.iter()), want);
    let frozen = packed.freeze(0, 0, usize::MAX);
    assert_eq!(records(frozen.iter()), want);
    let mut drained = Vec::new();
    frozen
        .drain(|ts, e| {
            drained.push((ts, e.to_record()));
            Ok::<(), ()>(())
        })
        .unwrap();
    assert_eq!(drained, want);
    // An earlier snapshot ended inside the second block, a packed one.
    let second = &packed.blocks[1];
    assert!(second.packed.is_some());
    let since = second.start_seq + second.records as u64 / 2;
    let (a, b) = (
        plain.freeze(0, since, usize::MAX),
        packed.freeze(0, since, usize::MAX),
    );
    assert_eq!((b.first_seq, b.end_seq), (a.first_seq, a.end_seq));
    assert_eq!(records(b.iter()), records(a.iter()));
}

/// A packed block is let go whole: while its newest record is within the horizon its older
/// ones stay (nothing newer is lost), and once it aged it goes unread.
#[test]
fn a_packed_block_ages_whole() {
    let (mut plain, mut packed) = plain_and_packed(5000);
    let second = &packed.blocks[1];
    let horizon = second.newest_ns - 5;
    plain.evict(horizon, usize::MAX);
    packed.evict(horizon, usize::MAX);
    let newer = |r: &Ring| {
        records(r.iter())
            .into_iter()
            .filter(|(ts, _)| *ts >= horizon)
            .collect::<Vec<_>>()
    };
    assert_eq!(newer(&packed), newer(&plain));
    assert!(
        packed.front_ts() < plain.front_ts(),
        "the second block kept whole"
    );
    assert_eq!(packed.len(), records(packed.iter()).len());
    packed.evict(5000, 0);
    assert_eq!((packed.len(), packed.bytes()), (0, 0));
    assert!(packed.blocks.is_empty());
}

/// A packed block that does not unpack (its frame damaged) loses its own records, never
/// misreads them, and the blocks after it still read.
#[test]
fn a_damaged_packed_block_loses_only_its_records() {
    let (plain, mut packed) = plain_and_packed(5000);
    let (from, lost) = (
        packed.blocks[1].start_seq as usize,
        packed.blocks[1].records,
    );
    assert!(packed.blocks[1].others > 0, "it marks other records too");
    let buf = Arc::get_mut(&mut packed.blocks[1].buf).unwrap();
    let mid = buf.len() / 2;
    buf[mid] ^= 0x55;
    let mut want = records(plain.iter());
    want.drain(from..from + lost);
    assert_eq!(records(packed.iter()), want);
    assert_eq!(records(packed.freeze(0, 0, usize::MAX).iter()), want);
    // Frozen from an earlier snapshot's end inside it: what follows it reads the same.
    let since = (from + lost / 2) as u64;
    let after = packed.freeze(0, since, usize::MAX);
    assert_eq!(records(after.iter()), want[from..]);
}
