//! One budget, every bound: how `--memory-budget-mib` becomes the caps of the stages.
//!
//! What the process costs whatever its bounds ([`FIXED_BYTES`]) comes off first; the rest is
//! shared out in sixteenths ([`SHARES`]) and each share divided by what one entry of its table
//! costs. A bound given on its own flag or env var wins; the ceiling printed at start
//! ([`Ceiling`]) is computed from the bounds in force, derived or given, so an override that
//! breaks the budget is visible. The stages' flag defaults are the caps derived from the
//! default budget (a unit test holds them equal), so `trace`, `forensics` and tests bound
//! themselves like `run` does.
use std::fmt;

use crate::{cmd::run::RunArgs, settings::MemoryBudget};

const MIB: u64 = 1 << 20;

/// What the agent costs with every bound near zero: the binary's and libraries' pages (18 MiB of
/// a release build), the runtime and its threads, BTF, the API, /proc scans (idle RSS of a
/// release `retry-agent run` measured 23–24 MiB), plus the allocator's slack over the tables'
/// estimates (6% under a flood).
pub const FIXED_BYTES: u64 = 28 * MIB;
/// A decoded event waiting in the reader's channel, beyond its payload prefix: the `Event`
/// itself (352 bytes since summaries are held inline) and its payload's share of the arena.
pub const EVENT_OVERHEAD_BYTES: u64 = 384;
/// One l7 connection with a request pending: measured 2.8 KiB (50,000 connections, one HTTP/1
/// request head each); idle connections cost less, one holding a long head up to
/// `--l7-conn-buffer-bytes` more.
pub const L7_CONNECTION_BYTES: u64 = 3 << 10;
/// One thread context: the seven per-thread tables (threads, listeners, client sockets, recent
/// verdicts, abandoned, mismatched, header claims) sized by `--correlate-max-threads`.
pub const THREAD_BYTES: u64 = 1024;
/// One inbound exchange waiting for its verdict (the exchange and its children's links).
pub const PENDING_BYTES: u64 = 1536;
/// One remembered request for retry matching.
pub const RETRY_KEY_BYTES: u64 = 96;
/// One inbound request in a process's history (48 bytes, 8 of span index, ~40 of trace index),
/// with a quarter of a failed call's (112, 8, ~40 of retry-key index) and of a response's
/// (16), and the deques' growth slack.
pub const HISTORY_BYTES: u64 = 160;

/// Shares of what the fixed costs leave, in sixteenths: ring, channel, recorder, l7, correlate.
/// The ring's pages count twice in RSS (the reader maps them twice, so a record that wraps reads
/// contiguously): it takes the largest power of two within half its share, so some of the share
/// stays unused.
pub const SHARES: [(&str, u64); 5] = [
    ("ring", 4),
    ("channel", 1),
    ("recorder", 4),
    ("l7", 3),
    ("correlate", 4),
];

/// The flags whose default the budget replaces (long names, without dashes).
pub const DERIVED_FLAGS: [&str; 8] = [
    "capture-ring-bytes",
    "capture-channel-capacity",
    "recorder-max-mib",
    "l7-max-connections",
    "correlate-max-threads",
    "correlate-max-pending",
    "correlate-max-retry-keys",
    "correlate-max-history",
];

/// The bounds a budget gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    pub ring_bytes: u32,
    pub channel_capacity: usize,
    pub recorder_max_mib: u64,
    pub l7_max_connections: usize,
    pub correlate_max_threads: usize,
    pub correlate_max_pending: usize,
    pub correlate_max_retry_keys: usize,
    pub correlate_max_history: usize,
}

fn share(budget: MemoryBudget, part: &str) -> u64 {
    let sixteenths = SHARES.iter().find(|(p, _)| *p == part).map_or(0, |s| s.1);
    budget.bytes().saturating_sub(FIXED_BYTES) / 16 * sixteenths
}

fn count(bytes: u64, per_entry: u64) -> usize {
    usize::try_from(bytes / per_entry.max(1))
        .unwrap_or(usize::MAX)
        .max(1)
}

impl Caps {
    /// The caps of `budget`; the channel's entries cost their payload prefix too.
    pub fn derive(budget: MemoryBudget, payload_bytes: u32) -> Caps {
        let ring = (share(budget, "ring") / 2).clamp(4096, 1 << 30);
        let ring = 1u64 << ring.ilog2();
        let correlate = share(budget, "correlate");
        Caps {
            ring_bytes: u32::try_from(ring).unwrap_or(1 << 30),
            channel_capacity: count(
                share(budget, "channel"),
                u64::from(payload_bytes) + EVENT_OVERHEAD_BYTES,
            ),
            recorder_max_mib: (share(budget, "recorder") / MIB).max(1),
            l7_max_connections: count(share(budget, "l7"), L7_CONNECTION_BYTES),
            // 3/8 of the share to thread contexts, 3/8 to pending verdicts, 1/8 to retry keys,
            // 1/8 to the processes' histories.
            correlate_max_threads: count(correlate / 8 * 3, THREAD_BYTES),
            correlate_max_pending: count(correlate / 8 * 3, PENDING_BYTES),
            correlate_max_retry_keys: count(correlate / 8, RETRY_KEY_BYTES),
            correlate_max_history: count(correlate / 8, HISTORY_BYTES),
        }
    }
}

/// Replaces every derived bound that `given` (a flag's long name → set on the command line or in
/// the environment) says was not set explicitly.
pub fn apply(args: &mut RunArgs, given: impl Fn(&str) -> bool) {
    let caps = Caps::derive(args.budget, args.capture.largest_prefix());
    let set = |flag: &str| !given(flag);
    if set("capture-ring-bytes") {
        args.capture.ring_bytes = caps.ring_bytes;
    }
    if set("capture-channel-capacity") {
        args.capture.channel_capacity = caps.channel_capacity;
    }
    if set("recorder-max-mib") {
        args.recorder.max_mib = caps.recorder_max_mib;
    }
    if set("l7-max-connections") {
        args.pipeline.l7.max_connections = caps.l7_max_connections;
    }
    let c = &mut args.pipeline.correlate;
    if set("correlate-max-threads") {
        c.max_threads = caps.correlate_max_threads;
    }
    if set("correlate-max-pending") {
        c.max_pending = caps.correlate_max_pending;
    }
    if set("correlate-max-retry-keys") {
        c.max_retry_keys = caps.correlate_max_retry_keys;
    }
    if set("correlate-max-history") {
        c.max_history = caps.correlate_max_history;
    }
}

/// The long names of the flags of `cmd` that `m` got from the command line or the environment.
pub fn given_flags(cmd: &clap::Command, m: &clap::ArgMatches) -> Vec<String> {
    use clap::parser::ValueSource;
    cmd.get_arguments()
        .filter(|a| {
            matches!(
                m.value_source(a.get_id().as_str()),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        })
        .filter_map(|a| a.get_long().map(str::to_string))
        .collect()
}

/// What each bounded part can hold at most, from the bounds in force (bytes of RSS: the ring
/// counts twice).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ceiling {
    pub fixed: u64,
    pub ring: u64,
    pub channel: u64,
    pub recorder: u64,
    pub l7: u64,
    pub correlate: u64,
}

impl Ceiling {
    pub fn of(args: &RunArgs) -> Ceiling {
        let c = &args.pipeline.correlate;
        let n = |v: usize| v as u64;
        Ceiling {
            fixed: FIXED_BYTES,
            ring: 2 * u64::from(args.capture.ring_bytes),
            channel: n(args.capture.channel_capacity)
                * (u64::from(args.capture.largest_prefix()) + EVENT_OVERHEAD_BYTES),
            recorder: if args.recorder.enabled {
                args.recorder.max_mib.saturating_mul(MIB)
            } else {
                0
            },
            l7: n(args.pipeline.l7.max_connections) * L7_CONNECTION_BYTES,
            correlate: n(c.max_threads) * THREAD_BYTES
                + n(c.max_pending) * PENDING_BYTES
                + n(c.max_retry_keys) * RETRY_KEY_BYTES
                + n(c.max_history) * HISTORY_BYTES,
        }
    }

    pub fn total(&self) -> u64 {
        self.fixed + self.ring + self.channel + self.recorder + self.l7 + self.correlate
    }
}

impl fmt::Display for Ceiling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = |b: u64| b as f64 / MIB as f64;
        write!(
            f,
            "{:.1} MiB = fixed {:.1} + ring {:.1} + channel {:.1} + recorder {:.1} + l7 {:.1} + correlate {:.1}",
            m(self.total()),
            m(self.fixed),
            m(self.ring),
            m(self.channel),
            m(self.recorder),
            m(self.l7),
            m(self.correlate)
        )
    }
}

/// The shim's share: its failure cache and per-client counters (a quarter of its budget; the
/// rest is its connections' buffers and runtime).
pub fn shim_cache_bytes(budget: MemoryBudget) -> u64 {
    budget.bytes() / 4
}

#[cfg(test)]
mod tests;
