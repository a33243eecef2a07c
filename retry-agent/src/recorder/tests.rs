//! Recorder unit tests: ring bounds, dump round trip, corruption recovery, privacy, storm dumps.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::{collections::BTreeSet, os::unix::fs::PermissionsExt, path::PathBuf};

use bytes::Bytes;

use super::{format::BlockSpan, *};
use crate::{
    capture::{ConnId, DataEvent, Direction, Role, Syscall},
    decide::Reason,
    pipeline::{Pipeline, Record, StageOutput},
    testkit::{Rng, synth, temp_dir},
};

fn cfg(dir: PathBuf) -> RecorderConfig {
    RecorderConfig {
        dump_dir: dir,
        // The whole synthetic storm fits (the default budget's ring evicts its start).
        max_mib: 64,
        ..RecorderConfig::default()
    }
}

fn data(fd: u32, dir: Direction, ts: u64, payload: &[u8]) -> Event {
    Event::Data(DataEvent {
        conn: ConnId {
            pid: 10,
            fd,
            generation: 1,
        },
        role: Role::Client,
        direction: dir,
        syscall: Syscall::Write,
        tuple: None,
        pid: 10,
        tid: 11,
        goid: None,
        interleaved: false,
        ts_enter_ns: ts,
        ts_exit_ns: ts,
        len: payload.len() as u64,
        payload: Bytes::copy_from_slice(payload),
    })
}

fn marker(i: u64) -> Record {
    // Unique, cheap, and its identity survives the round trip.
    Record::Event(Event::ProcessExit {
        pid: i as u32,
        ts_ns: i,
    })
}

fn decision(ts: u64) -> Record {
    Record::Decision(Decision {
        issued_at_ns: ts,
        ..crate::testkit::decision(
            "a",
            "b",
            Action::SuppressRetries,
            Reason::CalleeUnclaimed,
            1000,
        )
    })
}

/// A dump of `n` marker records, with the byte span of each block.
fn build_dump(n: u64) -> (Vec<u8>, Vec<BlockSpan>) {
    let header = DumpHeader::new(
        DumpReason::Other("test".into()),
        RecorderConfig::default(),
        0,
        n,
    );
    let mut w = DumpWriter::new(Vec::new(), &header).unwrap();
    for i in 0..n {
        w.push(&marker(i)).unwrap();
    }
    w.finish_with_spans().unwrap()
}

fn ids(out: &ReadOutcome) -> BTreeSet<u64> {
    out.records
        .iter()
        .filter_map(|r| match r {
            Record::Event(Event::ProcessExit { ts_ns, .. }) => Some(*ts_ns),
            _ => None,
        })
        .collect()
}

/// Records of the blocks `spans[k]` (writer order: block k holds the next `records` markers).
fn ids_of_blocks(spans: &[BlockSpan], keep: impl Fn(&BlockSpan) -> bool) -> BTreeSet<u64> {
    let mut next = 0u64;
    let mut set = BTreeSet::new();
    for s in spans {
        let r = u64::from(s.records);
        if keep(s) {
            set.extend(next..next + r);
        }
        next += r;
    }
    set
}

#[test]
fn round_trip_keeps_every_record_in_order() {
    let (bytes, spans) = build_dump(10_000);
    assert!(spans.len() > 3, "want several blocks, got {}", spans.len());
    let out = DumpReader::read(&bytes).unwrap();
    assert!(out.loss.is_clean(), "{}", out.loss);
    assert_eq!(out.loss.blocks_ok, spans.len() as u64);
    assert_eq!(out.records, (0..10_000).map(marker).collect::<Vec<_>>());
    assert_eq!(out.header.unwrap().reason, DumpReason::Other("test".into()));
}

#[test]
fn truncation_keeps_every_whole_block_and_reports_the_cut() {
    let (bytes, spans) = build_dump(6_000);
    let mut rng = Rng::new(7);
    for _ in 0..300 {
        let cut = rng.below(bytes.len());
        let out = match DumpReader::read(&bytes[..cut]) {
            Ok(o) => o,
            // Only a cut inside the 8-byte magic leaves nothing to call a dump.
            Err(FormatError::NotADump) => {
                assert!(
                    cut < 8 || spans.first().is_some_and(|s| (cut as u64) < s.end),
                    "cut {cut}"
                );
                continue;
            }
            Err(e) => panic!("cut {cut}: {e}"),
        };
        let want = ids_of_blocks(&spans, |s| s.end <= cut as u64);
        assert_eq!(ids(&out), want, "cut at {cut}");
        assert!(out.loss.truncated, "cut at {cut} not reported");
        assert!(!out.loss.is_clean());
    }
}

#[test]
fn flipped_bytes_lose_only_the_blocks_they_hit() {
    let (bytes, spans) = build_dump(6_000);
    let all: BTreeSet<u64> = (0..6_000).collect();
    let mut rng = Rng::new(42);
    for round in 0..300 {
        let mut b = bytes.clone();
        let flips: Vec<usize> = (0..1 + rng.below(4)).map(|_| rng.below(b.len())).collect();
        for &f in &flips {
            b[f] ^= 1 << rng.below(8);
        }
        let out =
            DumpReader::read(&b).unwrap_or_else(|e| panic!("round {round}, flips {flips:?}: {e}"));
        let got = ids(&out);
        let intact = ids_of_blocks(&spans, |s| {
            !flips
                .iter()
                .any(|&f| (s.start..s.end).contains(&(f as u64)))
        });
        assert!(
            got.is_superset(&intact),
            "round {round}: lost an intact block (flips {flips:?})"
        );
        assert!(got.is_subset(&all), "round {round}: invented records");
        assert!(
            !out.loss.is_clean(),
            "round {round}: damage not reported (flips {flips:?})"
        );
        if got.len() < all.len() {
            assert!(
                out.loss.blocks_lost > 0 || out.loss.truncated,
                "round {round}: {}",
                out.loss
            );
        }
    }
}

#[test]
fn random_garbage_never_panics() {
    let mut rng = Rng::new(99);
    let (dump, _) = build_dump(500);
    for _ in 0..500 {
        let mut b: Vec<u8> = (0..rng.below(4096)).map(|_| rng.next() as u8).collect();
        // Sprinkle real magics and real dump pieces so the parser goes deep.
        if rng.below(2) == 0 {
            let at = rng.below(dump.len());
            b.extend_from_slice(&dump[at..(at + rng.below(2000)).min(dump.len())]);
        }
        if rng.below(2) == 0 {
            b.splice(0..0, b"RAFLTREC\x01\x00\x00\x00".iter().copied());
        }
        let _ = DumpReader::read(&b);
    }
}

#[test]
fn future_version_is_refused_with_a_clear_message() {
    let (mut bytes, _) = build_dump(10);
    bytes[8..10].copy_from_slice(&2u16.to_le_bytes());
    let len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    let crc = crc32c::crc32c_append(crc32c::crc32c(&bytes[8..16]), &bytes[20..20 + len]);
    bytes[16..20].copy_from_slice(&crc.to_le_bytes());
    let err = DumpReader::read(&bytes).unwrap_err();
    assert!(
        matches!(
            err,
            FormatError::FutureVersion {
                found: 2,
                supported: 1
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("newer"), "{err}");
}

#[test]
fn a_bit_flip_in_the_version_does_not_refuse_the_file() {
    let (mut bytes, _) = build_dump(10);
    bytes[9] ^= 0x40;
    let out = DumpReader::read(&bytes).unwrap();
    assert!(out.loss.header_damaged);
    assert_eq!(out.records.len(), 10);
}

#[test]
fn ring_is_bounded_by_window() {
    let dir = temp_dir("window");
    let mut r = Recorder::new(RecorderConfig {
        window_secs: 10,
        auto_dump: false,
        ..cfg(dir)
    })
    .unwrap();
    for s in 0..100u64 {
        r.record(Record::Event(Event::ProcessExit {
            pid: 1,
            ts_ns: s * 1_000_000_000,
        }));
    }
    let st = r.stats();
    assert_eq!(st.records_total, 100);
    assert_eq!(st.records_in_ring, 11, "{st:?}");
    assert_eq!(st.oldest_ns, 89_000_000_000);
    assert_eq!(st.evicted_age_total, 89);
}

#[test]
fn ring_is_bounded_by_bytes() {
    let dir = temp_dir("bytes");
    let mut r = Recorder::new(RecorderConfig {
        max_mib: 1,
        // Plain blocks: the bound is met by what is written, however it packs.
        pack: false,
        auto_dump: false,
        ..cfg(dir)
    })
    .unwrap();
    // A request line the redaction keeps whole (a masked body would be stored as its count).
    let mut body = b"GET /".to_vec();
    body.extend_from_slice(&[b'x'; 3980]);
    body.extend_from_slice(b" HTTP/1.1\r\n\r\n");
    for i in 0..1000u64 {
        r.record(Record::Event(data(3, Direction::Egress, i, &body)));
    }
    let st = r.stats();
    assert!(st.bytes_in_ring <= 1 << 20, "{st:?}");
    assert!(st.evicted_size_total > 600, "{st:?}");
    assert!(st.records_in_ring > 200, "{st:?}");
}

/// A dump being written holds the blocks it was taken from: what the ring lets go of them
/// meanwhile counts against the same bound, so the recorder does not hold its bound twice over
/// (it did: a ring frozen, then turned over, held both), the ring keeps what the dump leaves of
/// the bound, the dump still has every record it was taken with, and once it is written the
/// ring grows back. (A dump of a full ring leaves nothing until the writer lets its first
/// blocks go: `ring::tests::retired_blocks_count_until_the_snapshot_lets_them_go`.)
#[test]
fn a_dump_being_written_counts_against_the_bound() {
    let dir = temp_dir("held");
    let mut r = Recorder::new(RecorderConfig {
        max_mib: 1,
        // Plain blocks: the bound is met by what is written, however it packs.
        pack: false,
        auto_dump: false,
        ..cfg(dir.clone())
    })
    .unwrap();
    let mut line = b"GET /".to_vec();
    line.extend_from_slice(&[b'x'; 3980]);
    line.extend_from_slice(b" HTTP/1.1\r\n\r\n");
    let push = |r: &mut Recorder, from: u64, to: u64| {
        for i in from..to {
            r.record(Record::Event(data(3, Direction::Egress, i, &line)));
        }
    };
    // ~600 KB: more than half the bound.
    push(&mut r, 0, 150);
    let snap = r.snapshot(DumpReason::Other("held".into()));
    let taken = snap.records().count();
    assert_eq!(taken, 150);
    push(&mut r, 150, 1200);
    let st = r.stats();
    assert!(st.bytes_held_by_dumps > 1 << 19, "{st:?}");
    assert!(
        st.bytes_in_ring + st.bytes_held_by_dumps <= 1 << 20,
        "{st:?}"
    );
    // What the dump leaves: ~400 KB, the newest records.
    assert!(
        (50..120).contains(&st.records_in_ring) && st.oldest_ns > 1000,
        "{st:?}"
    );
    let path = snap.write_to_dir(&dir).unwrap();
    let out = DumpReader::open(&path).unwrap();
    assert_eq!(out.records.len(), taken);
    push(&mut r, 1200, 1600);
    let st = r.stats();
    assert_eq!(st.bytes_held_by_dumps, 0, "{st:?}");
    assert!(st.bytes_in_ring > 900 << 10, "{st:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A masked body at a record's end is not stored (the event's length still counts it): 1,000
/// responses with 4,000-byte bodies fit in a fraction of the bound, and come back from the
/// ring as their heads.
#[test]
fn masked_bodies_at_the_end_cost_the_ring_nothing() {
    let dir = temp_dir("elided");
    let mut r = Recorder::new(RecorderConfig {
        max_mib: 1,
        auto_dump: false,
        ..cfg(dir)
    })
    .unwrap();
    let head = b"HTTP/1.1 200 OK\r\nContent-Length: 4000\r\n\r\n";
    let mut resp = head.to_vec();
    resp.extend_from_slice(&[b'x'; 4000]);
    for i in 0..1000u64 {
        r.record(Record::Event(data(3, Direction::Ingress, i, &resp)));
    }
    let st = r.stats();
    assert_eq!(
        (st.records_in_ring, st.evicted_size_total),
        (1000, 0),
        "{st:?}"
    );
    assert!(st.bytes_in_ring < 1000 * 200, "{st:?}");
    let snap = r.snapshot(DumpReason::Other("t".into()));
    let data: Vec<_> = snap
        .records()
        .filter_map(|r| match r {
            Record::Event(Event::Data(d)) => Some(d),
            _ => None,
        })
        .collect();
    assert_eq!(data.len(), 1000);
    assert!(
        data.iter()
            .all(|d| d.payload == head[..] && d.len == resp.len() as u64)
    );
}

/// Shedding a batch over the byte bound lets exchanges go with the records around them: what
/// stays still pairs each exchange with the record that followed it.
#[test]
fn exchanges_leave_with_their_neighbours_when_the_bound_sheds() {
    let dir = temp_dir("exchange-bytes");
    let mut r = Recorder::new(RecorderConfig {
        max_mib: 1,
        // Plain blocks: the bound is met by what is written, however it packs.
        pack: false,
        auto_dump: false,
        ..cfg(dir)
    })
    .unwrap();
    let a: std::net::SocketAddr = "127.0.0.1:1000".parse().unwrap();
    let b: std::net::SocketAddr = "127.0.0.1:2000".parse().unwrap();
    let body = vec![b'x'; 2000];
    // ~120 bytes a record (the body's dots are not stored): several MiB in all.
    for i in 0..20_000u64 {
        let x = crate::testkit::ExchangeBuilder::server(i, 1, 1, a, b, i * 10, i * 10 + 1).build();
        r.record(Record::Exchange(Box::new(x)));
        r.record(Record::Event(data(3, Direction::Egress, i * 10 + 2, &body)));
    }
    let st = r.stats();
    assert!(st.bytes_in_ring <= 1 << 20, "{st:?}");
    assert!(st.evicted_size_total > 1000, "{st:?}");
    let snap = r.snapshot(DumpReason::Other("t".into()));
    let mut pairs = 0;
    let records: Vec<Record> = snap.records().collect();
    for w in records.windows(2) {
        if let (Record::Exchange(x), Record::Event(Event::Data(d))) = (&w[0], &w[1]) {
            assert_eq!(
                d.ts_exit_ns,
                x.id.0 * 10 + 2,
                "exchange {} paired with a stranger",
                x.id.0
            );
            pairs += 1;
        }
    }
    assert!(
        pairs > 100 && pairs as u64 * 2 + 1 >= st.records_in_ring,
        "{pairs} {st:?}"
    );
    assert_eq!(
        records
            .iter()
            .filter(|r| matches!(r, Record::Exchange(_)))
            .count(),
        pairs
    );
}

/// Exchanges live in a ring of their own: through evictions and range cuts each exchange item of
/// the main ring must still find its own exchange, in order.
#[test]
fn exchanges_stay_in_order_through_eviction_and_ranges() {
    let dir = temp_dir("exchange-ring");
    let mut r = Recorder::new(RecorderConfig {
        window_secs: 10,
        auto_dump: false,
        ..cfg(dir)
    })
    .unwrap();
    let a: std::net::SocketAddr = "127.0.0.1:1000".parse().unwrap();
    let b: std::net::SocketAddr = "127.0.0.1:2000".parse().unwrap();
    let sec = 1_000_000_000u64;
    // Enough exchanges to fill and let go of several of the exchange ring's blocks.
    for s in 0..200u64 {
        let x = crate::testkit::ExchangeBuilder::server(s, 1, 1, a, b, s * sec, s * sec + 1)
            .route(&format!("/r/{}", s))
            .build();
        r.record(Record::Exchange(Box::new(x)));
        // Other records between exchanges, some of them every other second.
        r.record(marker(s * sec + 2));
        if s % 2 == 0 {
            r.record(Record::Event(data(
                3,
                Direction::Egress,
                s * sec + 3,
                b"GET / HTTP/1.1\r\n\r\n",
            )));
        }
    }
    // The window (10 s behind the newest record, 199 s + 3 ns) kept seconds 190..=199; a range
    // inside it starts mid-ring.
    let routes = |snap: &Snapshot| -> Vec<(u64, String)> {
        snap.records()
            .filter_map(|rec| match rec {
                Record::Exchange(x) => Some((x.id.0, x.route.as_deref().unwrap_or("").to_string())),
                _ => None,
            })
            .collect()
    };
    let all = routes(&r.snapshot(DumpReason::Other("t".into())));
    let want: Vec<(u64, String)> = (190..200).map(|s| (s, format!("/r/{s}"))).collect();
    assert_eq!(all, want);
    let part = routes(&r.snapshot_range(DumpReason::Other("t".into()), 193 * sec, 195 * sec + 5));
    let want: Vec<(u64, String)> = (193..196).map(|s| (s, format!("/r/{s}"))).collect();
    assert_eq!(part, want);
}

#[test]
fn disabled_recorder_keeps_nothing_and_refuses_dumps() {
    let dir = temp_dir("off");
    let mut r = Recorder::new(RecorderConfig {
        enabled: false,
        ..cfg(dir.clone())
    })
    .unwrap();
    r.record(marker(1));
    assert_eq!(r.stats().records_total, 0);
    assert!(matches!(
        r.dump(DumpReason::OnDemand),
        Err(RecorderError::Disabled)
    ));
    assert!(!dir.exists());
}

const SECRET_REQ: &[u8] = b"POST /pay?token=SECRETQUERY HTTP/1.1\r\nHost: shop\r\nAuthorization: Bearer SECRETAUTH\r\n\
Cookie: session=SECRETCOOKIE\r\nX-Error-Claim: claimed\r\nProxy-Authorization: Basic SECRETPROXY\r\n\
Content-Length: 18\r\n\r\ncard=SECRETBODY123";
const SECRET_RESP: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nSet-Cookie: id=SECRETSETCOOKIE\r\nRetry-After: 1\r\n\
Content-Length: 0\r\n\r\n";

#[test]
fn secrets_never_reach_a_dump_file() {
    let dir = temp_dir("secrets");
    let mut r = Recorder::new(RecorderConfig {
        auto_dump: false,
        ..cfg(dir.clone())
    })
    .unwrap();
    // Whole, and split mid-header across two syscalls.
    r.record(Record::Event(data(3, Direction::Egress, 1, SECRET_REQ)));
    r.record(Record::Event(data(3, Direction::Ingress, 2, SECRET_RESP)));
    let (a, b) = SECRET_REQ.split_at(60);
    r.record(Record::Event(data(4, Direction::Egress, 3, a)));
    r.record(Record::Event(data(4, Direction::Egress, 4, b)));
    let path = r.dump(DumpReason::OnDemand).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let raw = std::fs::read(&path).unwrap();
    let out = DumpReader::read(&raw).unwrap();
    assert_eq!(out.records.len(), 4);
    // The file is compressed: check both its bytes and everything that decodes from it.
    let mut decoded = serde_json::to_vec(&out.records).unwrap();
    for rec in &out.records {
        if let Record::Event(Event::Data(d)) = rec {
            decoded.extend_from_slice(&d.payload);
        }
    }
    for hay in [&raw, &decoded] {
        let text = String::from_utf8_lossy(hay);
        assert!(!text.contains("SECRET"), "a secret leaked: {text}");
    }
    let text = String::from_utf8_lossy(&decoded);
    // What the product needs is still there.
    for kept in [
        "POST /pay?",
        "Host: shop",
        "X-Error-Claim: claimed",
        "Content-Length: 18",
        "HTTP/1.1 503",
        "Retry-After: 1",
        "Authorization: ",
    ] {
        assert!(text.contains(kept), "{kept:?} missing: {text}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn storm_writes_a_dump_covering_before_and_after() {
    let dir = temp_dir("storm");
    let mut r = Recorder::new(RecorderConfig {
        auto_before_secs: 5,
        auto_after_secs: 5,
        ..cfg(dir.clone())
    })
    .unwrap();
    let s = 1_000_000_000u64;
    for t in 0..30 {
        r.record(Record::Event(Event::ProcessExit {
            pid: 1,
            ts_ns: t * s,
        }));
        if t == 20 {
            r.record(decision(20 * s));
            r.record(decision(20 * s + 1)); // a second decision of the same storm: no second dump
        }
    }
    let done = r.wait_auto_dumps();
    assert_eq!(done.len(), 1);
    let path = done.into_iter().next().unwrap().unwrap();
    let out = DumpReader::open(&path).unwrap();
    let h = out.header.unwrap();
    assert!(matches!(h.reason, DumpReason::Storm { trigger_ns, .. } if trigger_ns == 20 * s));
    // The 15 records before the window are said to be missing (a replay starts mid-stream).
    assert_eq!(h.missing_before, 15);
    let ts: Vec<u64> = out.records.iter().map(Record::ts_ns).collect();
    assert_eq!(ts.first(), Some(&(15 * s)));
    assert_eq!(ts.last(), Some(&(25 * s)));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    let _ = std::fs::remove_dir_all(dir);
}

/// Under load the ring turns over long before a storm's after-window passes: the dump still
/// holds the onset (the newest half of what the ring held at the trigger) and the end of the
/// after-window, in order, and says how many records fell between them.
#[test]
fn a_storm_dump_keeps_the_onset_when_the_ring_turns_over() {
    let dir = temp_dir("storm-turnover");
    let mut r = Recorder::new(RecorderConfig {
        max_mib: 1,
        // Plain blocks: the bound is met by what is written, however it packs.
        pack: false,
        auto_before_secs: 5,
        auto_after_secs: 5,
        ..cfg(dir.clone())
    })
    .unwrap();
    let ms = 1_000_000u64;
    // ~1 KB a record (a masked header value is kept, masked): the 1 MiB ring holds ~2.5 s at
    // 400 records a second, half the after-window.
    let head = format!("GET /x HTTP/1.1\r\nX-Pad: {}\r\n\r\n", "v".repeat(1000));
    for t in 0..12_000u64 {
        let ts = t * 2500 * 1000; // 400 a second, for 30 s
        r.record(Record::Event(data(
            3,
            Direction::Egress,
            ts,
            head.as_bytes(),
        )));
        if ts == 20_000 * ms {
            r.record(decision(ts));
        }
    }
    let done = r.wait_auto_dumps();
    assert_eq!(done.len(), 1);
    let out = DumpReader::open(done[0].as_ref().unwrap()).unwrap();
    let h = out.header.unwrap();
    let ts: Vec<u64> = out.records.iter().map(Record::ts_ns).collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]), "out of order");
    // The onset: the newest half of what the ring held at the trigger (~1.1 s), every record
    // of the second before the trigger.
    let onset = ts
        .iter()
        .filter(|&&t| t >= 19_000 * ms && t < 20_000 * ms)
        .count();
    assert_eq!(onset, 400, "records of the second before the trigger");
    // Not more than half the ring was held: nothing from 1.5 s before the trigger.
    assert!(ts.iter().all(|&t| !(18_000 * ms..18_500 * ms).contains(&t)));
    // The end of the after-window, and the gap between (what the ring let go meanwhile).
    assert_eq!(ts.last(), Some(&(25_000 * ms)));
    assert!(ts.iter().all(|&t| !(21_000 * ms..22_000 * ms).contains(&t)));
    assert!(h.missing_between > 500, "{h:?}");
    assert!(out.records.iter().any(|r| matches!(r, Record::Decision(_))));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn replay_of_a_dump_reproduces_the_live_pipeline() {
    use crate::{correlate::CorrelateConfig, decide::DecideConfig, l7::L7Config};
    let dir = temp_dir("replay");
    let rec = SharedRecorder::new(
        Recorder::new(RecorderConfig {
            auto_dump: false,
            ..cfg(dir.clone())
        })
        .unwrap(),
    );
    let mut live = Pipeline::new(
        L7Config::default(),
        CorrelateConfig::default(),
        DecideConfig::default(),
    )
    .with_tap(rec.clone());
    let mut out = StageOutput::default();
    let events = synth::StormScenario::default().events();
    let last = events.last().map(Event::ts_ns).unwrap();
    // In batches, as the live loop feeds each drain of the ring (the tap holds the lock for
    // one batch): every record still lands, in order.
    for chunk in events.chunks(500) {
        live.batch(|live| {
            for ev in chunk {
                live.push(ev, &mut out);
            }
        });
        assert!(
            rec.stats().records_total > 0,
            "the lock is free between batches"
        );
    }
    // The live loop's idle timer: recorded, so the replay evaluates here too.
    live.tick(last + 3_000_000_000, &mut out);
    live.tick(last + 6_000_000_000, &mut out);
    let path = rec.with(|r| r.dump(DumpReason::OnDemand)).unwrap().unwrap();
    let raw = std::fs::read(&path).unwrap();
    let dump = DumpReader::read(&raw).unwrap();
    assert!(dump.loss.is_clean(), "{}", dump.loss);

    let mut fresh = Pipeline::new(
        L7Config::default(),
        CorrelateConfig::default(),
        DecideConfig::default(),
    );
    let rep = replay(&mut fresh, &dump.records);
    assert_eq!(rep.events, events.len() as u64);
    // Exactly: the replay restores the keyed digests the live run recorded.
    assert_eq!(rep.exchanges, out.exchanges);
    assert_eq!(
        rep.digests_restored,
        out.exchanges.len() as u64,
        "every exchange's digests restored"
    );
    assert_eq!(rep.verdicts, out.verdicts);
    assert_eq!(rep.snapshots, out.snapshots);
    assert_eq!(rep.decisions, out.decisions);
    // The derived records the live run recorded are the live ones.
    let recorded_decisions: Vec<&Decision> = dump
        .records
        .iter()
        .filter_map(|r| {
            if let Record::Decision(d) = r {
                Some(d)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(recorded_decisions, out.decisions.iter().collect::<Vec<_>>());
    assert_eq!(rep.snapshots.len(), out.snapshots.len());
    assert!(
        rep.snapshots.len() >= 30,
        "evaluations on event time: {}",
        rep.snapshots.len()
    );
    // Secrets on every request of the scenario: none in the dump.
    let mut all = raw.clone();
    all.extend(serde_json::to_vec(&dump.records).unwrap());
    assert!(!String::from_utf8_lossy(&all).contains("SECRET"));
    let _ = std::fs::remove_dir_all(dir);
}

/// A process named by identity mid-run (its container resolved after it was first described)
/// is recorded with its workload, so the replay names the service as the live run did.
#[test]
fn replay_keeps_workload_names() {
    use crate::{
        capture::{ProcessInfo, WorkloadKind, WorkloadName},
        correlate::CorrelateConfig,
        decide::DecideConfig,
        l7::L7Config,
    };
    let dir = temp_dir("replay-names");
    let rec = SharedRecorder::new(
        Recorder::new(RecorderConfig {
            auto_dump: false,
            ..cfg(dir.clone())
        })
        .unwrap(),
    );
    let mut live = Pipeline::new(
        L7Config::default(),
        CorrelateConfig::default(),
        DecideConfig::default(),
    )
    .with_tap(rec.clone());
    let mut out = StageOutput::default();
    let mut events = synth::StormScenario::default().events();
    // What `run` pushes when the resolver names pid 200's container: the same process, named.
    let named = events.iter().find_map(|e| match e {
        Event::Process(p) if p.pid == 200 => Some(ProcessInfo {
            workload: Some(WorkloadName {
                namespace: "shop".into(),
                workload: "api".into(),
                workload_kind: WorkloadKind::Deployment,
                pod: "api-5d8c7-x2x9q".into(),
                container: Some("api".into()),
            }),
            ..p.clone()
        }),
        _ => None,
    });
    let at = events
        .iter()
        .rposition(|e| matches!(e, Event::Process(_)))
        .unwrap()
        + 1;
    events.insert(at, Event::Process(named.unwrap()));
    let last = events.last().map(Event::ts_ns).unwrap();
    for ev in &events {
        live.push(ev, &mut out);
    }
    live.tick(last + 3_000_000_000, &mut out);
    let live_edges: Vec<String> = live
        .engine
        .edges()
        .iter()
        .map(|e| e.edge.to_string())
        .collect();
    assert!(
        live_edges.iter().any(|e| e.contains("shop/api")),
        "{live_edges:?}"
    );
    assert!(
        !live_edges.iter().any(|e| e.contains("api:8080")),
        "{live_edges:?}"
    );

    let path = rec.with(|r| r.dump(DumpReason::OnDemand)).unwrap().unwrap();
    let dump = DumpReader::read(&std::fs::read(&path).unwrap()).unwrap();
    let mut fresh = Pipeline::new(
        L7Config::default(),
        CorrelateConfig::default(),
        DecideConfig::default(),
    );
    let rep = replay(&mut fresh, &dump.records);
    assert_eq!(rep.verdicts, out.verdicts);
    let replayed: Vec<String> = fresh
        .engine
        .edges()
        .iter()
        .map(|e| e.edge.to_string())
        .collect();
    assert_eq!(replayed, live_edges);
    let _ = std::fs::remove_dir_all(dir);
}

mod redaction {
    use super::*;
    use crate::recorder::redact::Redactor;

    fn redact_all(r: &mut Redactor, chunks: &[&[u8]], dir: Direction) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            let Event::Data(d) = data(7, dir, i as u64, c) else {
                unreachable!()
            };
            let (d, _) = r.redact(d);
            assert_eq!(d.payload.len(), c.len(), "lengths are kept");
            out.extend_from_slice(&d.payload);
        }
        out
    }

    fn no_secret(b: &[u8]) {
        let t = String::from_utf8_lossy(b);
        assert!(!t.contains("SECRET"), "leak: {t}");
    }

    #[test]
    fn http1_keeps_framing_and_heads_of_pipelined_messages() {
        let two = [
            SECRET_REQ,
            b"GET /next HTTP/1.1\r\nHost: shop\r\nCookie: SECRETC2\r\n\r\n".as_slice(),
        ]
        .concat();
        let mut r = Redactor::new();
        let out = redact_all(&mut r, &[&two], Direction::Egress);
        no_secret(&out);
        let t = String::from_utf8_lossy(&out);
        assert!(
            t.contains("\r\n\r\n")
                && t.contains("GET /next HTTP/1.1\r\nHost: shop\r\nCookie: ********\r\n\r\n"),
            "{t}"
        );
        // The body became a digest of the same length; the same body gives the same digest.
        let body_at = SECRET_REQ.len() - 18;
        let digest = out[body_at..body_at + 16].to_vec();
        let again = redact_all(&mut r, &[SECRET_REQ], Direction::Egress);
        assert_eq!(&again[body_at..body_at + 16], digest.as_slice());
        assert!(digest.iter().all(u8::is_ascii_hexdigit));
    }

    #[test]
    fn body_split_across_syscalls_stays_masked_and_the_next_head_is_kept() {
        let mut r = Redactor::new();
        let head = b"POST /x HTTP/1.1\r\nContent-Length: 20\r\n\r\nSECRET-PA".as_slice();
        let out = redact_all(
            &mut r,
            &[
                head,
                b"RT2-0123",
                b"456GET /y HTTP/1.1\r\nAuthorization: SECRETX\r\n\r\n",
            ],
            Direction::Egress,
        );
        no_secret(&out);
        assert!(
            String::from_utf8_lossy(&out).contains("GET /y HTTP/1.1\r\nAuthorization: *******\r\n")
        );
    }

    #[test]
    fn chunked_bodies_keep_their_size_lines() {
        let mut r = Redactor::new();
        let msg = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nSECRET\r\n0\r\nSet-Cookie: SECRETT\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n";
        let out = redact_all(&mut r, &[msg], Direction::Ingress);
        no_secret(&out);
        let t = String::from_utf8_lossy(&out);
        assert!(
            t.contains("\r\n\r\n6\r\n")
                && t.contains("\r\n0\r\n")
                && t.contains("HTTP/1.1 204 No Content"),
            "{t}"
        );
    }

    #[test]
    fn split_header_line_is_masked_across_the_cut() {
        let mut r = Redactor::new();
        let out = redact_all(
            &mut r,
            &[
                b"GET / HTTP/1.1\r\nAuthorization: Bearer SEC",
                b"RET-TAIL\r\nHost: a\r\n\r\n",
            ],
            Direction::Egress,
        );
        no_secret(&out);
        assert!(!String::from_utf8_lossy(&out).contains("RET-TAIL"));
        assert!(String::from_utf8_lossy(&out).contains("Host: a"));
    }

    fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn hpack_block() -> Vec<u8> {
        let mut b = vec![0x82]; // :method GET
        b.extend_from_slice(&[0x0f, 0x08, 10]); // authorization (static 23), literal without indexing
        b.extend_from_slice(b"SECRETAUTH");
        b.extend_from_slice(&[0x40, 6]); // literal with indexing, new name
        b.extend_from_slice(b"cookie");
        b.push(12);
        b.extend_from_slice(b"SECRETCOOKIE");
        b.extend_from_slice(&[0x41, 3]); // :authority (static 1)
        b.extend_from_slice(b"api");
        b
    }

    #[test]
    fn http2_secret_literals_and_data_are_masked_frames_kept() {
        let mut wire = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        wire.extend(h2_frame(0x4, 0, 0, &[]));
        wire.extend(h2_frame(0x1, 0x4, 1, &hpack_block()));
        wire.extend(h2_frame(0x0, 0x1, 1, b"SECRETBODY"));
        let mut r = Redactor::new();
        let out = redact_all(&mut r, &[&wire], Direction::Egress);
        no_secret(&out);
        assert!(
            String::from_utf8_lossy(&out).contains("api"),
            ":authority kept"
        );
        // Frame headers untouched: every 9-byte header is where it was.
        assert_eq!(out[..24 + 9], wire[..24 + 9]);
        let hdr2 = 24 + 9 + 9 + hpack_block().len();
        assert_eq!(out[hdr2..hdr2 + 9], wire[hdr2..hdr2 + 9]);
        // A header block split across syscalls is masked whole.
        let mut r = Redactor::new();
        let (a, b) = wire.split_at(24 + 9 + 9 + 6);
        let out = redact_all(&mut r, &[a, b], Direction::Egress);
        no_secret(&out);
    }

    #[test]
    fn random_payloads_never_panic_and_keep_lengths() {
        let mut rng = Rng::new(5);
        let mut r = Redactor::new();
        let seeds: [&[u8]; 3] = [
            SECRET_REQ,
            SECRET_RESP,
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x05\x01\x04\x00\x00\x00\x01\x0f\x08\x03abc",
        ];
        for i in 0..3000 {
            let mut p = seeds[i % 3].to_vec();
            for _ in 0..rng.below(6) {
                let at = rng.below(p.len());
                p[at] = rng.next() as u8;
            }
            p.truncate(rng.below(p.len() + 1));
            let fd = rng.below(4) as u32;
            let Event::Data(mut d) = data(fd, Direction::Egress, i as u64, &p) else {
                unreachable!()
            };
            d.len += rng.below(3) as u64 * 100; // sometimes more moved than captured
            let (d2, _) = r.redact(d);
            assert_eq!(d2.payload.len(), p.len());
        }
    }
}

#[test]
fn a_kernel_summary_reaches_a_dump_with_its_query_masked() {
    let dir = temp_dir("summary");
    let mut r = Recorder::new(RecorderConfig {
        auto_dump: false,
        ..cfg(dir.clone())
    })
    .unwrap();
    let part = |ev: Event| match ev {
        Event::Data(d) => d,
        _ => unreachable!(),
    };
    let s = crate::capture::SummaryEvent {
        request: part(data(
            3,
            Direction::Egress,
            10,
            b"GET /pay?card=SECRETCARD HTTP/1.1",
        )),
        response: DataEvent {
            payload: Bytes::new(),
            ..part(data(3, Direction::Ingress, 20, b""))
        },
        status: 200,
        weight: 1,
    };
    r.record(Record::Event(data(3, Direction::Egress, 1, SECRET_REQ)));
    r.record(Record::Event(Event::Summary(s.clone())));
    r.record(Record::Event(data(3, Direction::Ingress, 30, SECRET_RESP)));
    let raw = std::fs::read(r.dump(DumpReason::OnDemand).unwrap()).unwrap();
    let out = DumpReader::read(&raw).unwrap();
    assert_eq!(out.records.len(), 3, "{:?}", out.records);
    let Record::Event(Event::Summary(got)) = &out.records[1] else {
        panic!("not the summary: {:?}", out.records[1])
    };
    assert_eq!(
        &got.request.payload[..],
        b"GET /pay?*************** HTTP/1.1"
    );
    let masked = crate::capture::SummaryEvent {
        request: DataEvent {
            payload: got.request.payload.clone(),
            ..s.request.clone()
        },
        ..s
    };
    assert_eq!(*got, masked, "everything but the query as it was");
    assert!(!String::from_utf8_lossy(&raw).contains("SECRET"));
    let _ = std::fs::remove_dir_all(dir);
}

/// Packed, a ring under the same 1 MiB bound keeps several times the history it keeps in plain
/// blocks, and a dump of it holds every record it kept, in order, redacted as before.
#[test]
fn a_packed_ring_keeps_more_history_and_dumps_it_whole() {
    let run = |pack: bool| {
        let dir = temp_dir(if pack { "packed" } else { "plain" });
        let mut r = Recorder::new(RecorderConfig {
            max_mib: 1,
            pack,
            auto_dump: false,
            ..cfg(dir)
        })
        .unwrap();
        for i in 0..40_000u64 {
            let req = format!(
                "GET /orders/{i}?page={} HTTP/1.1\r\nHost: orders\r\nAuthorization: Bearer {:016x}\r\n\r\n",
                i % 50,
                i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            );
            r.record(Record::Event(data(3, Direction::Egress, i, req.as_bytes())));
        }
        r
    };
    let (plain, mut packed) = (run(false), run(true));
    let (p, k) = (plain.stats(), packed.stats());
    assert!(k.bytes_in_ring <= 1 << 20, "{k:?}");
    assert!(
        k.records_in_ring > 3 * p.records_in_ring,
        "packed {} records, plain {}",
        k.records_in_ring,
        p.records_in_ring
    );
    let raw = std::fs::read(packed.dump(DumpReason::OnDemand).unwrap()).unwrap();
    let out = DumpReader::read(&raw).unwrap();
    let times: Vec<u64> = out
        .records
        .iter()
        .filter_map(|r| match r {
            Record::Event(Event::Data(d)) => {
                assert!(!d.payload.windows(6).any(|w| w == b"Bearer"), "{d:?}");
                Some(d.ts_exit_ns)
            }
            _ => None,
        })
        .collect();
    let first = 40_000 - k.records_in_ring;
    assert_eq!(times, (first..40_000).collect::<Vec<_>>());
}
