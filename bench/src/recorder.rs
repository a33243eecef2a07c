//! `cargo xtask bench recorder`: what the flight recorder costs and how fast a dump replays.
//!
//! - recording: records/s into the ring and CPU ns per record (redaction included);
//! - redaction alone: the payload copy and masking every data record pays (`Redactor`), in
//!   records and captured MB per CPU-second;
//! - the same pipeline (l7 → correlate → decide) with the recorder on vs off over the same events:
//!   the CPU ratio is the recorder's share of the agent's userspace work;
//! - dump: write and read MB/s, bytes per record on disk;
//! - replay: events/s through the shared `Pipeline` from a dump.
//!
//! In-process on synthetic, wire-faithful HTTP/1 storm traffic (`testkit::synth`). Figures,
//! never pass/fail.
use std::{hint::black_box, time::Instant};

use anyhow::Result;
use retry_agent::{
    capture::Event,
    correlate::CorrelateConfig,
    decide::DecideConfig,
    l7::L7Config,
    pipeline::{Pipeline, Record, StageOutput},
    recorder::{
        DumpReader, DumpReason, Recorder, RecorderConfig, SharedRecorder, redact::Redactor, replay,
    },
    testkit::StormScenario,
};

use crate::thread_cpu_ns;

/// Wall and CPU time of a loop: the timed loops run on one thread, so CPU time (the thread's
/// own) does not count other work on the same box against them.
struct Timed {
    wall_s: f64,
    cpu_s: f64,
}

fn timed(f: impl FnOnce()) -> Timed {
    let (w, c) = (Instant::now(), thread_cpu_ns());
    f();
    Timed {
        wall_s: w.elapsed().as_secs_f64(),
        cpu_s: (thread_cpu_ns().saturating_sub(c)) as f64 / 1e9,
    }
}

fn pipeline() -> Pipeline {
    Pipeline::new(
        L7Config::default(),
        CorrelateConfig::default(),
        DecideConfig::default(),
    )
}

pub fn run() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("ra-recorder-bench-{}", std::process::id()));
    let cfg = RecorderConfig {
        dump_dir: dir.clone(),
        auto_dump: false,
        max_mib: 256,
        window_secs: 3600,
        ..Default::default()
    };
    let events = StormScenario {
        requests: 20_000,
        interval_ns: 1_000_000,
        fault: 8_000..12_000,
        ..Default::default()
    }
    .events();
    let n = events.len() as f64;
    let payload: usize = events
        .iter()
        .map(|e| {
            if let Event::Data(d) = e {
                d.payload.len()
            } else {
                0
            }
        })
        .sum();
    println!(
        "recorder bench, release build, one core: {} events ({:.1} MB of captured payload)",
        events.len(),
        payload as f64 / 1e6
    );

    // 1. Recording alone: into a ring still growing, and into a full one (steady state: every
    // record evicts an old one).
    let mut ring_per_record = 0.0;
    for (label, mib) in [("growing ring", 256), ("full ring (8 MiB)", 8)] {
        let mut rec = Recorder::new(RecorderConfig {
            max_mib: mib,
            ..cfg.clone()
        })?;
        if mib == 8 {
            events
                .iter()
                .for_each(|e| rec.record(Record::Event(e.clone())));
        }
        let t = timed(|| {
            for e in &events {
                rec.record(Record::Event(black_box(e.clone())));
            }
        });
        println!(
            "  record, {label:<18} {:>10.0} records/CPU-s   {:>6.0} ns CPU/record   (ring {:.1} MB, {} records)",
            n / t.cpu_s,
            t.cpu_s * 1e9 / n,
            rec.stats().bytes_in_ring as f64 / 1e6,
            rec.stats().records_in_ring
        );
        let st = rec.stats();
        ring_per_record = st.bytes_in_ring as f64 / st.records_in_ring.max(1) as f64;
    }
    println!(
        "  (ring bytes per record: {:.0}, of which captured payload {:.0})",
        ring_per_record,
        payload as f64 / events.len() as f64
    );

    // 1b. Redaction alone (best of 5, a fresh redactor each time): what every data record
    // pays before it enters the ring.
    let data: Vec<_> = events
        .iter()
        .filter_map(|e| {
            if let Event::Data(d) = e {
                Some(d)
            } else {
                None
            }
        })
        .collect();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let mut r = Redactor::new();
        let t = timed(|| {
            for d in &data {
                black_box(r.redact_payload(black_box(d)));
            }
        });
        best = best.min(t.cpu_s);
    }
    println!(
        "  redact alone:      {:>10.0} records/CPU-s   {:>6.0} ns CPU/record   {:>6.0} MB/s captured   ({} data records)",
        data.len() as f64 / best,
        best * 1e9 / data.len() as f64,
        payload as f64 / 1e6 / best,
        data.len()
    );

    // 1c. The same on gRPC as grpc-go sends it (HPACK: every header block decoded to judge its
    // names, each call's `traceparent` a Huffman-coded literal entering the table).
    let (setup, round) = crate::l7::grpc_as_go_events();
    let data_of = |e: &Event| match e {
        Event::Data(d) => Some(d.clone()),
        _ => None,
    };
    let (setup, round): (Vec<_>, Vec<_>) = (
        setup.iter().filter_map(data_of).collect(),
        round.iter().filter_map(data_of).collect(),
    );
    let round_bytes: usize = round.iter().map(|d| d.payload.len()).sum();
    const ROUNDS: usize = 10;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let mut r = Redactor::new();
        setup.iter().for_each(|d| drop(r.redact_payload(d)));
        let t = timed(|| {
            for _ in 0..ROUNDS {
                for d in &round {
                    black_box(r.redact_payload(black_box(d)));
                }
            }
        });
        best = best.min(t.cpu_s);
    }
    let records = (round.len() * ROUNDS) as f64;
    println!(
        "  redact alone, gRPC as grpc-go encodes: {:>10.0} records/CPU-s   {:>6.0} ns CPU/record   {:>6.0} MB/s captured   ({} data records)",
        records / best,
        best * 1e9 / records,
        (round_bytes * ROUNDS) as f64 / 1e6 / best,
        round.len() * ROUNDS
    );

    // 2. The pipeline with the recorder off and on, same events (best of 5 each, CPU time). The recorder
    // runs at its default bound and is filled first: the steady state of a running agent, where
    // each record evicts an old one (a growing ring also pays first-touch page faults, once).
    let mut off = f64::MAX;
    let mut on = f64::MAX;
    let mut live_out = StageOutput::default();
    let steady = SharedRecorder::new(Recorder::new(RecorderConfig {
        max_mib: 64,
        ..cfg.clone()
    })?);
    let mut warm = pipeline().with_tap(steady.clone());
    events
        .iter()
        .for_each(|e| warm.push(e, &mut StageOutput::default()));
    for _ in 0..5 {
        let mut p = pipeline();
        let mut out = StageOutput::default();
        let t = timed(|| events.iter().for_each(|e| p.push(e, &mut out)));
        off = off.min(t.cpu_s);
        let mut p = pipeline().with_tap(steady.clone());
        let mut out = StageOutput::default();
        let t = timed(|| events.iter().for_each(|e| p.push(e, &mut out)));
        on = on.min(t.cpu_s);
        live_out = out;
    }
    let st = steady.stats();
    println!(
        "    (steady ring: {:.1} MB, {} records, {} evicted for size)",
        st.bytes_in_ring as f64 / 1e6,
        st.records_in_ring,
        st.evicted_size_total
    );
    // What a dump asks of the live agent: the recorder's lock is held while the snapshot is
    // taken (the pipeline waits), and the snapshot lives until the file is written.
    let rss0 = rss_bytes();
    let t0 = Instant::now();
    let snap = steady.with(|r| r.snapshot(DumpReason::Other("bench".into())))?;
    let held = t0.elapsed();
    let grown = rss_bytes().saturating_sub(rss0);
    black_box(&snap);
    drop(snap);
    println!(
        "  snapshot of that ring:  lock held {:.1} ms   process RSS +{:.1} MB while the snapshot lives",
        held.as_secs_f64() * 1e3,
        grown as f64 / 1e6
    );
    // A dump of one whole live run (its own ring, large enough to hold it).
    let shared = SharedRecorder::new(Recorder::new(cfg.clone())?);
    let mut p = pipeline().with_tap(shared.clone());
    events
        .iter()
        .for_each(|e| p.push(e, &mut StageOutput::default()));
    let shared = Some(shared);
    println!(
        "  pipeline, recorder off: {:>10.0} events/CPU-s   recorder on: {:>10.0} events/CPU-s   CPU on/off = {:.2}",
        n / off,
        n / on,
        on / off
    );
    println!(
        "    (live run derived {} exchanges, {} verdicts, {} decisions)",
        live_out.exchanges.len(),
        live_out.verdicts.len(),
        live_out.decisions.len()
    );

    // 3. Dump write and read.
    let shared = shared.ok_or_else(|| anyhow::anyhow!("no run"))?;
    let records = shared.stats().records_in_ring;
    let mut path = None;
    let t = timed(|| path = Some(shared.with(|r| r.dump(DumpReason::Other("bench".into())))));
    let path = path.ok_or_else(|| anyhow::anyhow!("no dump"))???;
    let size = std::fs::metadata(&path)?.len();
    println!(
        "  dump write:             {:>10.1} MB/s of file   {} records, {:.1} MB ({:.0} B/record)   {:.2} s",
        size as f64 / 1e6 / t.wall_s,
        records,
        size as f64 / 1e6,
        size as f64 / records.max(1) as f64,
        t.wall_s
    );
    let mut read = None;
    let t = timed(|| read = Some(DumpReader::open(&path)));
    let read = read.ok_or_else(|| anyhow::anyhow!("no read"))??;
    println!(
        "  dump read:              {:>10.0} records/s   ({})",
        read.records.len() as f64 / t.wall_s,
        read.loss
    );

    // 4. Replay.
    let mut p = pipeline();
    let mut rep = None;
    let t = timed(|| rep = Some(replay(&mut p, &read.records)));
    let rep = rep.ok_or_else(|| anyhow::anyhow!("no replay"))?;
    println!(
        "  replay:                 {:>10.0} events/s   ({} events → {} exchanges, {} verdicts, {} decisions)",
        rep.events as f64 / t.wall_s,
        rep.events,
        rep.exchanges.len(),
        rep.verdicts.len(),
        rep.decisions.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// This process's resident set (0 when /proc says nothing).
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map_or(0, |pages| pages * 4096)
}
