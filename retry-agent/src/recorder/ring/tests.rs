//! The ring: records in and out, in order, charged what they store, let go by block.
use std::net::{SocketAddr, SocketAddrV6};

use super::{
    codec::{HEADER, SYSCALLS, meta_len},
    *,
};
use crate::capture::{ConnId, DataEvent, Direction, Role, Syscall, Tuple};

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
                let d = event(t, g, p);
                ring.push_data(&d, |b| b.len());
                want.push(d);
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
    assert_eq!(ring.blocks.len(), 1, "passed blocks are freed");
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
        ring.push_exchange(exchange(i));
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
    let frozen = ring.freeze(0);
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
    let late = ring.freeze(2500);
    assert!(late.skipped > 0 && late.iter().count() as u64 + late.skipped == 400);
    assert!(late.iter().all(|(ts, _)| ts >= 1000));
}
