//! `cargo xtask bench correlate`: exchanges per second through the correlation engine on one
//! core, and its memory at 10k concurrent connections and with every table at its cap.
//! Exchanges are built in memory first; only `Engine::push`/`tick` are timed. Figures, never
//! pass/fail.
use std::{
    hint::black_box,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    process::Command,
    time::Instant,
};

use anyhow::Result;
use retry_agent::{
    correlate::{CorrelateConfig, Engine},
    decide::{DecideConfig, Decider},
    l7::Exchange,
    testkit::ExchangeBuilder as X,
};

const MS: u64 = 1_000_000;

pub fn run() -> Result<()> {
    pin_to_one_core();
    println!("correlation engine, one core, release build");
    throughput(
        "steady mix: 3 hops, 2 calls per request, 5% failures, retries",
        0.05,
        400,
        10,
    )?;
    throughput("storm: 60% failures, every failure retried", 0.60, 400, 10)?;
    memory_concurrent(10_000)?;
    memory_at_caps()?;
    Ok(())
}

pub(crate) fn pin_to_one_core() {
    // Best effort: the figure is per core; without taskset the scheduler may still move us.
    let pid = std::process::id().to_string();
    let _ = Command::new("taskset")
        .args(["-p", "-c", "0", &pid])
        .output();
}

fn ip(n: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | (n & 0x00ff_ffff)))
}

/// One round of traffic: `threads` workers per service on a chain of 3 services (front → mid →
/// back, plus a cache called by mid), thread-per-request, so every inbound exchange has
/// children on its thread. Failures at `back` with probability `fail`, retried once by `mid`.
fn workload(fail: f64, threads: u32, requests_per_thread: u32) -> Vec<Exchange> {
    let mut out = Vec::new();
    let mut id = 0u64;
    let mut rng = 0x1234_5678_9abc_def0u64;
    let mut next = |p: f64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % 10_000) as f64 / 10_000.0 < p
    };
    let svc = |i: u32| SocketAddr::new(ip(i), 8080);
    let (front, mid, back, cache) = (1u32, 2u32, 3u32, 4u32);
    let mut port = 10_000u16;
    let mut eph = |host: u32| {
        port = if port == 60_000 { 10_000 } else { port + 1 };
        SocketAddr::new(ip(host), port)
    };
    for r in 0..requests_per_thread {
        for th in 0..threads {
            let t0 = (u64::from(r) * u64::from(threads) + u64::from(th)) * MS / 4;
            let path = format!("/orders/{r}-{th}");
            let mut ids = || {
                id += 1;
                id
            };
            // mid → cache (always fine), mid → back (fails with `fail`, retried once).
            let mid_tid = 20_000 + th;
            let c_local = eph(mid);
            out.push(
                X::server(
                    ids(),
                    cache * 100,
                    40_000 + th,
                    svc(cache),
                    c_local,
                    t0 + 3 * MS / 100,
                    t0 + 5 * MS / 100,
                )
                .build(),
            );
            out.push(
                X::client(
                    ids(),
                    mid * 100,
                    mid_tid,
                    c_local,
                    svc(cache),
                    t0 + 2 * MS / 100,
                    t0 + 6 * MS / 100,
                )
                .route(&path)
                .build(),
            );
            let mut t = t0 + 7 * MS / 100;
            let mut ok = false;
            for _attempt in 0..2 {
                let failed = next(fail);
                let status = if failed { 503 } else { 200 };
                let b_local = eph(mid);
                out.push(
                    X::server(
                        ids(),
                        back * 100,
                        30_000 + th,
                        svc(back),
                        b_local,
                        t + MS / 100,
                        t + 9 * MS / 100,
                    )
                    .status(status)
                    .build(),
                );
                out.push(
                    X::client(
                        ids(),
                        mid * 100,
                        mid_tid,
                        b_local,
                        svc(back),
                        t,
                        t + 10 * MS / 100,
                    )
                    .route(&path)
                    .status(status)
                    .build(),
                );
                t += 12 * MS / 100;
                if !failed {
                    ok = true;
                    break;
                }
            }
            let status = if ok { 200 } else { 502 };
            let m_local = eph(front);
            out.push(
                X::server(
                    ids(),
                    mid * 100,
                    mid_tid,
                    svc(mid),
                    m_local,
                    t0 + MS / 100,
                    t + MS / 100,
                )
                .status(status)
                .build(),
            );
            out.push(
                X::client(
                    ids(),
                    front * 100,
                    10_000 + th,
                    m_local,
                    svc(mid),
                    t0,
                    t + 2 * MS / 100,
                )
                .route(&path)
                .status(status)
                .build(),
            );
            let from = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 168, 0, 1)), 40_000);
            out.push(
                X::server(
                    ids(),
                    front * 100,
                    10_000 + th,
                    svc(front),
                    from,
                    t0,
                    t + 3 * MS / 100,
                )
                .status(status)
                .build(),
            );
        }
    }
    // The engine sees exchanges in completion order, as l7 emits them.
    out.sort_by_key(Exchange::end_ns);
    out
}

fn throughput(name: &str, fail: f64, threads: u32, per_thread: u32) -> Result<()> {
    let mut w = workload(fail, threads, per_thread);
    let span = w.iter().map(Exchange::end_ns).max().unwrap_or(0) + MS;
    let mut engine = Engine::new(CorrelateConfig::default());
    let mut decider = Decider::new(DecideConfig::default());
    let mut verdicts = Vec::new();
    let rounds = 25u64;
    let mut pushed = 0u64;
    let mut elapsed = 0.0f64;
    let mut max_id = w.iter().map(|x| x.id.0).max().unwrap_or(0);
    for round in 0..rounds {
        if round > 0 {
            // Untimed: move the round forward in time with fresh ids.
            for x in &mut w {
                x.request_start_ns += span;
                x.request_end_ns += span;
                x.response_start_ns = x.response_start_ns.map(|t| t + span);
                x.response_end_ns = x.response_end_ns.map(|t| t + span);
                x.id.0 += max_id;
            }
            max_id = w.iter().map(|x| x.id.0).max().unwrap_or(0);
        }
        let start = Instant::now();
        for (i, x) in w.iter().enumerate() {
            engine.push(x, &mut verdicts);
            if i % 4096 == 0 {
                engine.tick(x.end_ns(), &mut verdicts);
                verdicts.clear();
            }
        }
        elapsed += start.elapsed().as_secs_f64();
        pushed += w.len() as u64;
        black_box(&verdicts);
        verdicts.clear();
    }
    // The decider and the read-out run about once a second live; time one pass.
    let start = Instant::now();
    let edges = engine.edges();
    let paths = engine.paths();
    let decisions = decider.evaluate_edges(&edges, engine.now_ns());
    let readout = start.elapsed();
    let s = engine.stats();
    println!(
        "  {name}: {:.2} M exchanges/s ({pushed} exchanges in {elapsed:.3} s); verdicts c/u/m {}/{}/{}, retries {}; \
         edges+paths+decide read-out {:.1} µs ({} edges, {} decisions, radius {})",
        pushed as f64 / elapsed / 1e6,
        s.verdicts.claimed,
        s.verdicts.unclaimed,
        s.verdicts.missing,
        s.retries,
        readout.as_secs_f64() * 1e6,
        edges.len(),
        decisions.len(),
        paths.storm_radius,
    );
    Ok(())
}

/// glibc's `struct mallinfo2`.
#[repr(C)]
struct MallInfo2 {
    arena: usize,
    ordblks: usize,
    smblks: usize,
    hblks: usize,
    hblkhd: usize,
    usmblks: usize,
    fsmblks: usize,
    uordblks: usize,
    fordblks: usize,
    keepcost: usize,
}

unsafe extern "C" {
    fn mallinfo2() -> MallInfo2;
}

/// Bytes the allocator has handed out and not taken back (heap in use plus mmapped blocks):
/// unlike RSS, not hidden by memory an earlier phase freed.
fn heap_in_use() -> u64 {
    // SAFETY: mallinfo2 only reads the allocator's statistics; glibc is the allocator here.
    let m = unsafe { mallinfo2() };
    let _ = (
        m.arena, m.ordblks, m.smblks, m.hblks, m.usmblks, m.fsmblks, m.fordblks, m.keepcost,
    );
    (m.uordblks + m.hblkhd) as u64
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// 10k concurrent connections: 10k inbound requests in flight on 10k threads, each with an
/// outbound connection of its own, all distinct tuples, paths and threads.
fn memory_concurrent(conns: u32) -> Result<()> {
    let half = conns;
    let mut w = Vec::with_capacity(conns as usize * 2);
    let mut id = 0;
    for i in 0..half {
        let t0 = 1_000 * MS + u64::from(i) * 1_000;
        let local = SocketAddr::new(ip(2), 10_000 + (i % 50_000) as u16);
        let callee = SocketAddr::new(ip(3 + i % 50), 8080);
        id += 1;
        w.push(
            X::client(id, 200, 100_000 + i, local, callee, t0 + 10, t0 + 5 * MS)
                .route(&format!("/c/{i}"))
                .status(if i % 10 == 0 { 503 } else { 200 })
                .build(),
        );
        id += 1;
        let from = SocketAddr::new(ip(1), 10_000 + (i % 50_000) as u16);
        w.push(
            X::server(
                id,
                200,
                100_000 + i,
                SocketAddr::new(ip(2), 8080),
                from,
                t0,
                t0 + 6 * MS,
            )
            .status(if i % 10 == 0 { 502 } else { 200 })
            .build(),
        );
    }
    w.sort_by_key(Exchange::end_ns);
    let before = heap_in_use();
    let mut engine = Engine::new(CorrelateConfig::default());
    let mut v = Vec::new();
    for x in &w {
        engine.push(x, &mut v);
    }
    let after = heap_in_use();
    black_box(&engine);
    println!(
        "  memory at {conns} concurrent inbound + {conns} outbound connections (one request each in flight): {:.1} MiB heap",
        mib(after.saturating_sub(before))
    );
    drop(engine);
    drop(w);
    Ok(())
}

/// Worst case: every bounded table filled to its default cap: as many threads as the engine
/// keeps, each with a full ring of children (all failed, so every process-wide failure ring is
/// full too), every request distinct (retry keys), every socket distinct; streamed, so the
/// exchanges themselves are not held.
fn memory_at_caps() -> Result<()> {
    let cfg = CorrelateConfig::default();
    let (threads, keys) = (cfg.max_threads as u32, cfg.max_retry_keys as u32);
    let children = 16u32;
    let before = heap_in_use();
    let mut engine = Engine::new(cfg);
    let mut v = Vec::new();
    let mut id = 0u64;
    let rounds = (keys / threads / children + 1).max(2);
    for r in 0..rounds {
        for th in 0..threads {
            let t0 = 1_000 * MS + (u64::from(r) * u64::from(threads) + u64::from(th)) * 100_000;
            let pid = 200 + th % 64;
            for c in 0..children {
                id += 1;
                let n = (r * threads + th) * children + c;
                let local = SocketAddr::new(ip(100_000 + n / 50_000), 10_000 + (n % 50_000) as u16);
                let callee = SocketAddr::new(ip(3 + n % 2_000), 8080);
                let t = t0 + u64::from(c) * 1_000;
                let x = X::client(id, pid, th, local, callee, t, t + 500)
                    .route(&format!("/k/{n}"))
                    .status(503)
                    .build();
                engine.push(&x, &mut v);
            }
            id += 1;
            let from = SocketAddr::new(ip(200_000 + th / 50_000), 10_000 + (th % 50_000) as u16);
            let s = X::server(
                id,
                pid,
                th,
                SocketAddr::new(ip(2), 8080),
                from,
                t0,
                t0 + 50_000,
            )
            .status(502)
            .build();
            engine.push(&s, &mut v);
            v.clear();
        }
    }
    let after = heap_in_use();
    black_box(&engine);
    println!(
        "  memory with every table at its default cap ({threads} threads x {children} children, {} exchanges streamed): {:.1} MiB heap",
        id,
        mib(after.saturating_sub(before))
    );
    Ok(())
}
