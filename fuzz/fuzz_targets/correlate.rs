//! The correlation engine on arbitrary exchanges: processes, threads, times (out of order too),
//! outcomes, trace ids and retry keys from the fuzzer's bytes, with ticks and exits between, and
//! caps small enough that every history evicts. Whatever the order, the engine must not panic,
//! judges each failed inbound request at most once, and the verdict counts add up.
#![no_main]
use std::net::{Ipv4Addr, SocketAddr};

use libfuzzer_sys::fuzz_target;
use retry_agent::{
    correlate::{CorrelateConfig, Engine},
    testkit::ExchangeBuilder as X,
};

const MS: u64 = 1_000_000;

fn addr(host: u8, port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::new(10, 0, 0, host), port))
}

fuzz_target!(|data: &[u8]| {
    let mut cfg = CorrelateConfig::default();
    cfg.max_history = 32;
    cfg.max_pending = 16;
    cfg.max_threads = 16;
    cfg.max_retry_keys = 16;
    let mut e = Engine::new(cfg);
    let mut out = Vec::new();
    let mut now = 1_000 * MS;
    let mut inbound = 0u64;
    // Records of 8 bytes: [op, pid, tid, start, duration, status, trace, path].
    for (id, r) in (1u64..).zip(data.chunks_exact(8)) {
        let [op, pid, tid, start, dur, status, trace, path] =
            [r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]];
        let pid = u32::from(pid % 4) + 1;
        let tid = u32::from(tid % 4) + 1;
        // Starts up to ~1 s around the clock, either side: exchanges arrive out of order.
        let start = (now + u64::from(start) * 8 * MS).saturating_sub(1_000 * MS);
        let end = start + u64::from(dur) * u64::from(dur) * MS / 4;
        let status = match status % 4 {
            0 => 200,
            1 => 500,
            2 => 503,
            _ => 404,
        };
        let trace = u64::from(trace % 8);
        let route = format!("/{}", path % 4);
        match op % 8 {
            0..=2 => {
                inbound += 1;
                // Callers on other hosts, or the engine's other processes' ports.
                let remote = addr(1 + pid as u8, 40_000 + id as u16);
                let mut b = X::server(id, pid, tid, addr(100, 8000 + pid as u16), remote, start, end)
                    .status(status)
                    .route(&route);
                if trace != 0 {
                    b = b.trace_id(trace);
                }
                e.push(&b.build(), &mut out);
            }
            3..=5 => {
                let callee = (op % 4) + 1;
                let mut b = X::client(
                    id,
                    pid,
                    tid,
                    addr(100, 30_000 + id as u16),
                    addr(100, 8000 + u16::from(callee)),
                    start,
                    end,
                )
                .status(status)
                .route(&route);
                if trace != 0 {
                    b = b.trace_id(trace);
                }
                e.push(&b.build(), &mut out);
            }
            6 => {
                now += u64::from(dur) * 50 * MS;
                e.tick(now, &mut out);
            }
            _ => e.on_process_exit(pid),
        }
    }
    e.tick(now + 60_000 * MS, &mut out);
    let mut judged: Vec<_> = out.iter().map(|v| v.exchange).collect();
    let n = judged.len();
    judged.sort_unstable_by_key(|x| x.0);
    judged.dedup();
    assert_eq!(judged.len(), n, "an exchange judged twice");
    assert!(n as u64 <= inbound, "{n} verdicts for {inbound} inbound exchanges");
    let s = e.stats();
    assert!(s.inbound <= inbound && s.exchanges <= inbound + s.outbound);
});
