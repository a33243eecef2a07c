//! Counters: the capture's own (readable from any thread), and the kernel's run-time figures of
//! this project's loaded programs (for benchmarks and leak checks).
use retry_common::arg_map;
use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

/// Counters readable at any time from any thread.
#[derive(Debug, Default)]
pub struct StatsInner {
    pub(super) events: AtomicU64,
    pub(super) kernel_drops: AtomicU64,
    pub(super) channel_drops: AtomicU64,
    pub(super) decode_errors: AtomicU64,
    pub(super) polls: AtomicU64,
    pub(super) arg_insert_failures: [AtomicU64; arg_map::COUNT as usize],
}

/// A snapshot of the capture counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CaptureStats {
    /// Records decoded from the ring buffer (and /proc pick-ups).
    pub events: u64,
    /// Records the kernel could not put into a full ring buffer (refreshed about once a second).
    pub kernel_drops: u64,
    /// Decoded events dropped because the pipeline's channel was full.
    pub channel_drops: u64,
    /// Malformed records.
    pub decode_errors: u64,
    /// Poll rounds of the ring reader: it moves on a quiet node too, so `/healthz` can tell a
    /// live reader from a dead one.
    pub polls: u64,
    /// Failed inserts into the kernel's per-thread argument maps (their syscalls went
    /// unrecorded), by `retry_common::arg_map` slot (refreshed about once a second).
    pub arg_insert_failures: [u64; arg_map::COUNT as usize],
}

/// Shared handle to the counters (clone it into metrics).
#[derive(Clone, Debug, Default)]
pub struct StatsHandle(pub(super) Arc<StatsInner>);

impl StatsHandle {
    pub fn snapshot(&self) -> CaptureStats {
        let s = &self.0;
        CaptureStats {
            events: s.events.load(Ordering::Relaxed),
            kernel_drops: s.kernel_drops.load(Ordering::Relaxed),
            channel_drops: s.channel_drops.load(Ordering::Relaxed),
            decode_errors: s.decode_errors.load(Ordering::Relaxed),
            polls: s.polls.load(Ordering::Relaxed),
            arg_insert_failures: std::array::from_fn(|i| {
                s.arg_insert_failures[i].load(Ordering::Relaxed)
            }),
        }
    }
}

/// Ids of every program loaded in the kernel right now (to check nothing outlives a capture).
pub fn loaded_program_ids() -> Vec<u32> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| p.id())
        .collect()
}

/// Cumulative kernel run time of one of this project's loaded programs (names `ra_*`). Counts only
/// grow while BPF statistics are enabled (see [`enable_bpf_stats`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramStat {
    pub id: u32,
    pub name: String,
    pub run_ns: u64,
    pub runs: u64,
}

/// Every loaded `ra_*` program of any capture on this host, with its run-time counters.
pub fn program_stats() -> Vec<ProgramStat> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter_map(|p| {
            let name = p.name_as_str()?.to_string();
            name.starts_with("ra_").then(|| ProgramStat {
                id: p.id(),
                name,
                run_ns: p.run_time().as_nanos() as u64,
                runs: p.run_count(),
            })
        })
        .collect()
}

/// Turns on kernel BPF run-time statistics for as long as the returned fd is open (they cost a
/// little per program run, so they are off by default; benchmarks use them).
pub fn enable_bpf_stats() -> std::io::Result<std::os::fd::OwnedFd> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .map_err(|e| std::io::Error::other(e.to_string()))
}
