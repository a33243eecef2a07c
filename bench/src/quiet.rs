//! `cargo xtask bench quiet`: the agent's userspace CPU per quiet keep-alive request, as the
//! kernel sends it with `--capture-summarize` (one summary record per exchange end), on one
//! core: the same records the overhead bench's haproxy row makes (a client and a server on one
//! node, 16 connections), decoded from their kernel bytes, then through the live pipeline
//! (l7 → correlate → decide) with and without the flight recorder. The overhead bench's
//! "agent CPU per request" is this plus the ring reader and scheduling; this one holds still
//! enough to compare builds (best of 5, thread CPU time). Figures, never pass/fail.
use std::hint::black_box;

use crate::thread_cpu_ns;
use anyhow::Result;
use retry_agent::{
    capture::{
        Event, ProcessInfo,
        decode::{PayloadArena, decode_in},
    },
    correlate::CorrelateConfig,
    decide::DecideConfig,
    l7::L7Config,
    pipeline::{Pipeline, StageOutput},
    recorder::{Recorder, RecorderConfig, SharedRecorder},
};
use retry_common::{
    AF_INET, ConnRecord, DataHeader, KIND_CONN, KIND_DATA, KIND_SUMMARY, SUMMARY_HEAD, SockTuple,
    SummaryRecord, conn_kind, direction, role, syscall,
};

const CONNS: u32 = 16;
const REQUESTS: u64 = 200_000;
/// What a ring drain hands the pipeline at once under that load.
const BATCH: usize = 512;
const SERVER: u32 = 100;
const CLIENT: u32 = 200;
const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: 127.0.0.1:18080\r\n\r\n";

fn bytes_of<T: Copy>(v: &T) -> Vec<u8> {
    // SAFETY: the retry-common records are repr(C) with explicit padding (their layout tests
    // pin it): every byte is initialised.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

fn tuple(lport: u16, rport: u16) -> SockTuple {
    let mut t = SockTuple {
        family: AF_INET,
        lport,
        rport,
        ..Default::default()
    };
    t.laddr[..4].copy_from_slice(&[127, 0, 0, 1]);
    t.raddr[..4].copy_from_slice(&[127, 0, 0, 1]);
    t
}

fn conn(kind: u32, pid: u32, fd: u32, r: u32, t: SockTuple, ts_ns: u64) -> Vec<u8> {
    bytes_of(&ConnRecord {
        kind: KIND_CONN,
        conn_kind: kind,
        pid,
        tid: pid,
        fd,
        role: r,
        generation: 1,
        ts_ns,
        tuple: t,
        ..Default::default()
    })
}

/// The summary record of one end of an exchange, cut where the kernel cuts it.
fn summary(pid: u32, fd: u32, r: u32, t: SockTuple, (start, end): (u64, u64)) -> Vec<u8> {
    let (i, e) = (direction::INGRESS, direction::EGRESS);
    let (req_sc, resp_sc, req_dir, resp_dir) = if r == role::SERVER {
        (syscall::RECVFROM, syscall::SENDTO, i, e)
    } else {
        (syscall::WRITE, syscall::READ, e, i)
    };
    let request = DataHeader {
        kind: KIND_DATA,
        syscall: req_sc,
        pid,
        tid: pid,
        fd,
        role: r,
        direction: req_dir,
        captured: REQUEST.len() as u32,
        generation: 1,
        ts_enter_ns: start,
        ts_exit_ns: start,
        ret: REQUEST.len() as i64,
        len: REQUEST.len() as u64,
        tuple: t,
        ..Default::default()
    };
    let response = DataHeader {
        syscall: resp_sc,
        direction: resp_dir,
        captured: 0,
        ts_enter_ns: end,
        ts_exit_ns: end,
        ret: 76,
        len: 76,
        ..request
    };
    let mut rec = SummaryRecord {
        kind: KIND_SUMMARY,
        status: 200,
        weight: 1,
        response,
        request,
        bytes: [0; retry_common::HELD_BYTES],
    };
    rec.bytes[..REQUEST.len()].copy_from_slice(REQUEST);
    let mut raw = bytes_of(&rec);
    raw.truncate(SUMMARY_HEAD + REQUEST.len());
    raw
}

/// The kernel's records of the load: connections opened, then each request's two summaries
/// (the server's answer, then the client's read of it), 5 µs apart.
fn records() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for c in 0..CONNS {
        let (fd, port) = (10 + c, 40_000 + c as u16);
        out.push(conn(
            conn_kind::CONNECT,
            CLIENT,
            fd,
            role::CLIENT,
            tuple(port, 18080),
            1_000,
        ));
        out.push(conn(
            conn_kind::ESTABLISHED,
            CLIENT,
            fd,
            role::CLIENT,
            tuple(port, 18080),
            1_100,
        ));
        out.push(conn(
            conn_kind::ACCEPT,
            SERVER,
            fd,
            role::SERVER,
            tuple(18080, port),
            1_200,
        ));
    }
    for i in 0..REQUESTS {
        let c = (i % u64::from(CONNS)) as u32;
        let (fd, port) = (10 + c, 40_000 + c as u16);
        let t = 1_000_000 + i * 5_000;
        out.push(summary(
            SERVER,
            fd,
            role::SERVER,
            tuple(18080, port),
            (t + 1_000, t + 2_000),
        ));
        out.push(summary(
            CLIENT,
            fd,
            role::CLIENT,
            tuple(port, 18080),
            (t, t + 3_000),
        ));
    }
    out
}

fn processes() -> Vec<Event> {
    [(SERVER, "haproxy"), (CLIENT, "wrk")]
        .into_iter()
        .map(|(pid, comm)| {
            Event::Process(ProcessInfo {
                exe: Some(format!("/usr/bin/{comm}")),
                netns: Some(4_026_531_840),
                ..ProcessInfo::named_at_exit(pid, comm.into())
            })
        })
        .collect()
}

fn pipeline() -> Pipeline {
    Pipeline::new(
        L7Config::default(),
        CorrelateConfig::default(),
        DecideConfig::default(),
    )
}

/// Best of 5: CPU ns of `f`.
fn best(mut f: impl FnMut()) -> f64 {
    (0..5)
        .map(|_| {
            let c = thread_cpu_ns();
            f();
            thread_cpu_ns().saturating_sub(c) as f64
        })
        .fold(f64::MAX, f64::min)
}

pub fn run() -> Result<()> {
    crate::correlate::pin_to_one_core();
    let raw = records();
    let bytes: usize = raw.iter().map(Vec::len).sum();
    println!(
        "quiet keep-alive requests as summaries, one core, release build: {REQUESTS} requests \
         ({} records, {:.0} bytes a summary)",
        raw.len(),
        (bytes - 3 * CONNS as usize * size_of::<ConnRecord>()) as f64 / (2 * REQUESTS) as f64
    );
    // As the reader does: a ring drain's records decoded into one batch, handed on, dropped.
    let decode = best(|| {
        let mut arena = PayloadArena::default();
        let mut batch = Vec::with_capacity(BATCH);
        for b in raw.chunks(BATCH) {
            batch.extend(b.iter().filter_map(|r| decode_in(r, Some(&mut arena)).ok()));
            black_box(&batch);
            batch.clear();
        }
    });
    let mut arena = PayloadArena::default();
    let batches: Vec<Vec<Event>> = raw
        .chunks(BATCH)
        .map(|b| {
            b.iter()
                .filter_map(|r| decode_in(r, Some(&mut arena)).ok())
                .collect()
        })
        .collect();
    let events: usize = batches.iter().map(Vec::len).sum();
    anyhow::ensure!(
        events == raw.len(),
        "{} of {} records decoded",
        events,
        raw.len()
    );
    let feed = |p: &mut Pipeline| {
        let mut out = StageOutput::default();
        for ev in &processes() {
            p.push(ev, &mut out);
        }
        for b in &batches {
            // As the live loop does: each push's output handed on and cleared.
            p.batch(|p| {
                for ev in b {
                    p.push(ev, &mut out);
                    black_box(out.verdicts.len());
                    out.clear();
                }
            });
        }
    };
    let bare = best(|| {
        feed(&mut pipeline().hand_exchanges_to_tap());
    });
    let recorder = SharedRecorder::new(Recorder::new(RecorderConfig {
        auto_dump: false,
        ..RecorderConfig::default()
    })?);
    // Filled first: a running agent's ring evicts as it records.
    feed(
        &mut pipeline()
            .with_tap(recorder.clone())
            .hand_exchanges_to_tap(),
    );
    let recorded = best(|| {
        feed(
            &mut pipeline()
                .with_tap(recorder.clone())
                .hand_exchanges_to_tap(),
        );
    });
    let per = |ns: f64| ns / REQUESTS as f64;
    println!(
        "  decode                      {:>6.0} ns CPU per request",
        per(decode)
    );
    println!(
        "  pipeline, recorder off      {:>6.0} ns CPU per request",
        per(bare)
    );
    println!(
        "  pipeline, recorder on       {:>6.0} ns CPU per request   (recorder {:.0})",
        per(recorded),
        per(recorded - bare)
    );
    println!(
        "  decode + pipeline + recorder {:>5.0} ns CPU per request ({} exchanges each)",
        per(decode + recorded),
        2
    );
    Ok(())
}
