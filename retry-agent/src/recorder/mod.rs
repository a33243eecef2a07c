//! Flight recorder: an always-on bounded ring of kernel events and the records derived from them
//! (exchanges, verdicts, decisions), written on demand or on a storm into a self-checking dump
//! file that `retry-agent forensics` replays offline.
//!
//! Invariants:
//! - Privacy is applied at record time ([`redact`]): secrets never enter the ring, so no dump,
//!   on-disk ring or crash can leak them.
//! - The ring is bounded by time (`window`) and bytes (`max_mib`); recording never blocks and
//!   never fails (it only counts what it evicts).
//! - Dump IO happens outside the recording path: [`SharedRecorder::dump`] snapshots under the
//!   lock (sharing the ring's blocks, nothing decoded or copied) and writes after releasing it;
//!   storm auto-dumps write on their own thread.
use std::{collections::HashMap, path::PathBuf};

use clap::{ArgAction, Args};
use serde::{Deserialize, Serialize};

use self::ring::Ring;
use crate::{
    capture::{DataEvent, Event, ProcessInfo, SummaryEvent},
    decide::{Action, Decision},
    l7::Exchange,
    pipeline::{Derived, Input, PipelineConfig, Record},
    settings::{InvalidConfig, Settings},
};

pub mod client;
pub mod format;
pub mod key;
pub mod redact;
pub mod replay;
mod ring;
mod shared;
mod snapshot;

#[cfg(test)]
mod tests;

pub use client::{dump_api_response, spawn_sigusr1_dumps};
pub use format::{DumpHeader, DumpReader, DumpWriter, FormatError, Loss, ReadOutcome};
pub use replay::{Replayed, replay};
pub use shared::SharedRecorder;
use snapshot::ensure_dir;
pub use snapshot::{DumpReason, Snapshot, Span};

/// Recorder settings (`--recorder-*`): every one a flag with an env var and a default.
#[derive(Args, Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecorderConfig {
    /// Keep a flight recorder of recent events and derived records (off: nothing is kept).
    #[arg(long = "recorder", env = "RETRY_AGENT_RECORDER", default_value_t = true, action = ArgAction::Set)]
    pub enabled: bool,
    /// How much history the ring keeps, in seconds.
    #[arg(
        long = "recorder-window-secs",
        env = "RETRY_AGENT_RECORDER_WINDOW_SECS",
        default_value_t = 300
    )]
    pub window_secs: u64,
    /// Memory bound of the ring, in MiB (whichever of window and size is hit first evicts;
    /// default: derived from --memory-budget-mib).
    #[arg(
        long = "recorder-max-mib",
        env = "RETRY_AGENT_RECORDER_MAX_MIB",
        default_value_t = 9
    )]
    pub max_mib: u64,
    /// Where dump files are written (created 0700 if missing; files are 0600).
    #[arg(
        long = "recorder-dump-dir",
        env = "RETRY_AGENT_RECORDER_DUMP_DIR",
        default_value = "/var/lib/retry-agent/dumps"
    )]
    pub dump_dir: PathBuf,
    /// Write a dump automatically when a storm is detected (a suppression decision).
    #[arg(long = "recorder-auto-dump", env = "RETRY_AGENT_RECORDER_AUTO_DUMP", default_value_t = true, action = ArgAction::Set)]
    pub auto_dump: bool,
    /// Seconds of history before the storm trigger an auto-dump covers.
    #[arg(
        long = "recorder-auto-before-secs",
        env = "RETRY_AGENT_RECORDER_AUTO_BEFORE_SECS",
        default_value_t = 120
    )]
    pub auto_before_secs: u64,
    /// Seconds after the trigger an auto-dump waits for (and covers) before writing.
    #[arg(
        long = "recorder-auto-after-secs",
        env = "RETRY_AGENT_RECORDER_AUTO_AFTER_SECS",
        default_value_t = 60
    )]
    pub auto_after_secs: u64,
    /// Pack each full block (64 KiB) of the ring with zstd: redacted traffic packs several times
    /// over, so the same memory bound keeps that much more history (off: blocks stay plain,
    /// the CPU for packing is saved; dumps read either).
    #[arg(long = "recorder-pack", env = "RETRY_AGENT_RECORDER_PACK", default_value_t = true, action = ArgAction::Set)]
    pub pack: bool,
    /// The node's secret key for the query and body digests in exchanges and dumps (created
    /// 0600 at first start): without it, a dump's digests of short secrets cannot be brute-forced.
    #[arg(
        long = "recorder-digest-key-file",
        alias = "digest-key-file",
        env = "RETRY_AGENT_RECORDER_DIGEST_KEY_FILE",
        default_value = "/var/lib/retry-agent/digest.key"
    )]
    #[serde(default = "default_key_file")]
    pub digest_key_file: PathBuf,
}

fn default_key_file() -> PathBuf {
    PathBuf::from("/var/lib/retry-agent/digest.key")
}

impl Default for RecorderConfig {
    fn default() -> Self {
        crate::settings::defaults()
    }
}

impl Settings for RecorderConfig {
    fn check(&self, p: &mut InvalidConfig) {
        if !self.enabled {
            return;
        }
        p.check(
            self.window_secs > 0,
            "recorder-window-secs",
            self.window_secs,
            "at least 1",
        );
        p.check(
            self.max_mib > 0,
            "recorder-max-mib",
            self.max_mib,
            "at least 1",
        );
        let dir = &self.dump_dir;
        p.check(
            !dir.as_os_str().is_empty(),
            "recorder-dump-dir",
            dir.display(),
            "a directory",
        );
        if self.auto_dump {
            // The ring cannot give an auto-dump more history than it keeps.
            let before = self.auto_before_secs;
            p.check(
                before <= self.window_secs,
                "recorder-auto-before-secs",
                before,
                "at most --recorder-window-secs",
            );
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RecorderError {
    #[error("the flight recorder is turned off")]
    Disabled,
    #[error("cannot create dump directory {path}")]
    DumpDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write dump {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("dump format")]
    Format(#[from] FormatError),
    #[error("the dump writer panicked")]
    WriterPanicked,
}

/// Counters the metrics module can export.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecorderStats {
    pub records_total: u64,
    pub records_in_ring: u64,
    pub bytes_in_ring: u64,
    /// Bytes of the blocks the ring let go that a dump being written or a storm's held onset
    /// still holds: within the same bound as the ring.
    pub bytes_held_by_dumps: u64,
    /// Evicted because they aged out of the window.
    pub evicted_age_total: u64,
    /// Evicted early because the byte bound was hit.
    pub evicted_size_total: u64,
    /// Header values masked and body bytes dropped at record time.
    pub redacted_headers_total: u64,
    pub redacted_body_bytes_total: u64,
    pub dumps_total: u64,
    pub dump_errors_total: u64,
    pub oldest_ns: u64,
    pub newest_ns: u64,
}

/// A storm seen; the dump is written once `after` has passed (in record time).
struct PendingAuto {
    trigger_ns: u64,
    edge: String,
    /// The newest half of the ring at the trigger: under load the ring turns over long before
    /// the after-window passes, and the storm's onset is what a dump is for. Held until the
    /// dump is written; what the ring lets go of it meanwhile counts against the ring's bound,
    /// so the ring keeps at least the other half for the after-window.
    before: ring::Frozen,
    /// Records evicted before the trigger.
    evicted: u64,
}

/// Most processes we keep metadata for; more are dropped (the ring still has their events).
const MAX_PROCESSES: usize = 16_384;

/// The flight recorder. Owned by the pipeline task (`record` is `&mut self`, no locking); wrap it
/// in a [`SharedRecorder`] when the API or a signal handler must reach it.
/// Over its byte bound, the ring sheds down to 1/`EVICT_SLACK` of the bound below it.
const EVICT_SLACK: usize = 64;

pub struct Recorder {
    cfg: RecorderConfig,
    /// Settings of the pipeline feeding this recorder (written into every dump's header).
    pipeline: Option<PipelineConfig>,
    ring: Ring,
    processes: HashMap<u32, ProcessInfo>,
    redactor: redact::Redactor,
    max_bytes: usize,
    window_ns: u64,
    stats: RecorderStats,
    pending: Option<PendingAuto>,
    /// No new storm auto-dump before this record time (one dump per storm, not per decision).
    auto_quiet_until_ns: u64,
    /// Capture losses (kernel ring + channel) already told to the redactor.
    losses_seen: u64,
    /// Auto-dump threads still writing (joined by `wait_auto_dumps`, in tests and at shutdown).
    auto_threads: Vec<std::thread::JoinHandle<Result<PathBuf, RecorderError>>>,
}

impl Recorder {
    pub fn new(cfg: RecorderConfig) -> Result<Self, RecorderError> {
        if cfg.enabled && cfg.auto_dump {
            // Fail at start-up, not during the storm, when the dump directory is unusable.
            ensure_dir(&cfg.dump_dir)?;
        }
        let max_bytes = usize::try_from(cfg.max_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
        Ok(Recorder {
            window_ns: cfg.window_secs.saturating_mul(1_000_000_000),
            max_bytes,
            // Packing starts when the ring is half full: a ring that never fills (a quiet node)
            // spends nothing on it.
            ring: Ring::new(cfg.pack.then_some(max_bytes / 2)),
            cfg,
            pipeline: None,
            processes: HashMap::new(),
            redactor: redact::Redactor::new(),
            stats: RecorderStats::default(),
            pending: None,
            auto_quiet_until_ns: 0,
            losses_seen: 0,
            auto_threads: Vec::new(),
        })
    }

    pub fn config(&self) -> &RecorderConfig {
        &self.cfg
    }

    /// The settings of the pipeline that feeds this recorder (written into every dump).
    pub fn set_pipeline_config(&mut self, c: PipelineConfig) {
        self.pipeline = Some(c);
    }

    /// One tap of the pipeline: its input (a tick as [`Record::Tick`]), then what it derived.
    fn tap(&mut self, input: Input<'_>, mut derived: Derived<'_>) {
        match input {
            Input::Event(ev) => self.record_event(ev),
            Input::Tick { now_ns } => self.record(Record::Tick { now_ns }),
        }
        while let Some(x) = derived.next_exchange() {
            self.record_exchange(x);
        }
        for r in derived {
            self.record(r);
        }
    }

    /// The capture's running count of lost records: when it grows, every connection the
    /// redactor follows may have lost bytes, so each is masked until it starts a message again.
    pub fn note_capture_loss(&mut self, total: u64) {
        if total > self.losses_seen {
            self.redactor.lost_all();
        }
        self.losses_seen = total;
    }

    /// Record one item. Never fails, never blocks on IO (a due storm dump is written on its own
    /// thread).
    pub fn record(&mut self, rec: Record) {
        match rec {
            Record::Event(ev) => self.record_event(&ev),
            other => {
                if self.cfg.enabled {
                    self.stats.records_total += 1;
                    self.admit(other);
                }
            }
        }
    }

    /// Record a kernel event by reference: the payload is copied (redacted) once, the event is
    /// never cloned.
    pub fn record_event(&mut self, ev: &Event) {
        if !self.cfg.enabled {
            return;
        }
        self.stats.records_total += 1;
        let rec = match ev {
            Event::Process(p) => {
                if self.processes.len() < MAX_PROCESSES || self.processes.contains_key(&p.pid) {
                    self.processes.insert(p.pid, p.clone());
                }
                return;
            }
            Event::Data(d) => return self.admit_data(d),
            Event::Summary(s) => return self.admit_summary(s),
            Event::ProcessExit { pid, ts_ns } => {
                self.redactor.forget_pid(*pid);
                Record::Event(Event::ProcessExit {
                    pid: *pid,
                    ts_ns: *ts_ns,
                })
            }
            Event::Conn(c) => Record::Event(Event::Conn(c.clone())),
        };
        self.admit(rec);
    }

    /// Record an exchange (the ring keeps its encoding).
    pub fn record_exchange(&mut self, x: &Exchange) {
        if !self.cfg.enabled {
            return;
        }
        self.stats.records_total += 1;
        self.admit_exchange(x);
    }

    /// A data event goes into the ring as its redacted copy, written in place.
    fn admit_data(&mut self, d: &DataEvent) {
        let (redactor, mut red) = (&mut self.redactor, redact::Redacted::default());
        self.ring.push_data(d, |b| {
            red = redactor.redact_in_place(d, None, b);
            b.len() - red.dots_at_end
        });
        self.stats.redacted_headers_total += red.headers;
        self.stats.redacted_body_bytes_total += red.body_bytes;
        self.stored(d.ts_exit_ns);
    }

    /// A kernel summary goes into the ring with its request redacted as a whole one would be
    /// (the connection's request stream is between messages: the kernel held a whole one).
    fn admit_summary(&mut self, s: &SummaryEvent) {
        let (redactor, mut red) = (&mut self.redactor, redact::Redacted::default());
        self.ring.push_summary(s, |b| {
            red = redactor.redact_summary_request(&s.request, b);
            b.len() - red.dots_at_end
        });
        self.stats.redacted_headers_total += red.headers;
        self.stats.redacted_body_bytes_total += red.body_bytes;
        self.stored(s.response.ts_exit_ns);
    }

    fn admit_exchange(&mut self, x: &Exchange) {
        let ts_ns = x.end_ns();
        self.ring.push_exchange(x);
        self.stored(ts_ns);
    }

    fn admit(&mut self, rec: Record) {
        match rec {
            Record::Exchange(x) => return self.admit_exchange(&x),
            Record::Event(Event::Data(d)) => return self.admit_data(&d),
            Record::Event(Event::Summary(s)) => return self.admit_summary(&s),
            _ => {}
        }
        let storm = match &rec {
            Record::Decision(d) => self.storm_begins(d),
            _ => None,
        };
        let ts_ns = rec.ts_ns();
        self.ring.push_other(rec);
        if let Some((trigger_ns, edge)) = storm {
            // Frozen with the decision in it: under load it would be gone by the dump.
            self.pending = Some(PendingAuto {
                trigger_ns,
                edge,
                before: self
                    .ring
                    .freeze(self.storm_range(trigger_ns).0, 0, self.max_bytes / 2),
                evicted: self.evicted(),
            });
        }
        self.stored(ts_ns);
    }

    /// After a record went into the ring: time moves on, old records go, a due dump is written.
    fn stored(&mut self, ts_ns: u64) {
        self.stats.newest_ns = self.stats.newest_ns.max(ts_ns);
        self.evict();
        self.maybe_auto_dump();
    }

    /// Let go of what is too old or over the byte bound, which also counts what dumps still
    /// hold of the blocks the ring let go (a dump being written, a storm's onset). Over the
    /// bound, the ring sheds down to [`EVICT_SLACK`] below it at once: one pass per batch
    /// instead of one per push.
    fn evict(&mut self) {
        let horizon = self.stats.newest_ns.saturating_sub(self.window_ns);
        let mut over = self.ring.bytes() + self.ring.held_at_most() > self.max_bytes;
        if over && self.ring.held_at_most() > 0 {
            // Counted again only when it matters: dumps may have let blocks go.
            over = self.ring.bytes() + self.ring.recount_held() > self.max_bytes;
        }
        if !over && self.ring.front_ts().is_none_or(|ts| ts >= horizon) {
            return;
        }
        let target = if over {
            self.max_bytes - self.max_bytes / EVICT_SLACK
        } else {
            self.max_bytes
        };
        let ev = self.ring.evict(horizon, target);
        self.stats.evicted_age_total += ev.aged;
        self.stats.evicted_size_total += ev.sized;
    }

    /// A decision that starts a storm dump: its time and edge.
    fn storm_begins(&self, d: &Decision) -> Option<(u64, String)> {
        let starts = self.cfg.auto_dump
            && d.action == Action::SuppressRetries
            && self.pending.is_none()
            && d.issued_at_ns >= self.auto_quiet_until_ns;
        if starts {
            tracing::info!(edge = %d.edge, "recorder: storm detected, dump follows after the after-window");
        }
        starts.then(|| (d.issued_at_ns, d.edge.to_string()))
    }

    fn maybe_auto_dump(&mut self) {
        let due = |p: &PendingAuto| self.stats.newest_ns >= self.storm_range(p.trigger_ns).1;
        if !self.pending.as_ref().is_some_and(due) {
            return;
        }
        let Some(p) = self.pending.take() else { return };
        let (from, to) = self.storm_range(p.trigger_ns);
        let reason = DumpReason::Storm {
            trigger_ns: p.trigger_ns,
            edge: p.edge,
        };
        self.auto_quiet_until_ns = to;
        let snap = if self.ring.front_seq() <= p.before.first_seq {
            // The ring still holds the onset: it alone is the dump.
            self.snapshot_range(reason, from, to)
        } else {
            // The onset as the ring held it at the trigger, then what came after it.
            let after = self.ring.freeze(0, p.before.end_seq, usize::MAX);
            self.snapshot_of(reason, vec![p.before, after], (from, to), p.evicted)
        };
        let dir = self.cfg.dump_dir.clone();
        self.stats.dumps_total += 1;
        let spawned = std::thread::Builder::new()
            .name("recorder-dump".into())
            .spawn(move || {
                let r = snap.write_to_dir(&dir);
                match &r {
                    Ok(path) => {
                        tracing::info!(path = %path.display(), "recorder: storm dump written")
                    }
                    Err(e) => tracing::warn!(error = %e, "recorder: storm dump failed"),
                }
                r
            });
        match spawned {
            Ok(h) => self.auto_threads.push(h),
            Err(e) => {
                self.stats.dump_errors_total += 1;
                tracing::warn!(error = %e, "recorder: cannot start the dump thread");
            }
        }
        self.auto_threads.retain(|h| !h.is_finished());
    }

    /// Wait for storm dumps still being written; returns their results (tests, shutdown).
    pub fn wait_auto_dumps(&mut self) -> Vec<Result<PathBuf, RecorderError>> {
        self.auto_threads
            .drain(..)
            .map(|h| h.join().unwrap_or(Err(RecorderError::WriterPanicked)))
            .collect()
    }

    /// Everything in the ring.
    pub fn snapshot(&self, reason: DumpReason) -> Snapshot {
        self.snapshot_range(reason, 0, u64::MAX)
    }

    /// Ring records with `from_ns <= ts <= to_ns` (plus all process metadata and timeless
    /// records). Takes no copy of the ring: its blocks are shared with the snapshot.
    pub fn snapshot_range(&self, reason: DumpReason, from_ns: u64, to_ns: u64) -> Snapshot {
        let ring = vec![self.ring.freeze(from_ns, 0, usize::MAX)];
        self.snapshot_of(reason, ring, (from_ns, to_ns), self.evicted())
    }

    /// A snapshot of frozen parts of the ring, with the process metadata as it is now.
    fn snapshot_of(
        &self,
        reason: DumpReason,
        ring: Vec<ring::Frozen>,
        (from_ns, to_ns): (u64, u64),
        evicted: u64,
    ) -> Snapshot {
        let mut pids: Vec<&ProcessInfo> = self.processes.values().collect();
        pids.sort_by_key(|p| p.pid);
        Snapshot {
            reason,
            config: self.cfg.clone(),
            pipeline: self.pipeline.clone(),
            processes: pids
                .into_iter()
                .map(|p| Record::Event(Event::Process(p.clone())))
                .collect(),
            ring,
            from_ns,
            to_ns,
            evicted,
        }
    }

    /// A storm dump's range around its trigger.
    fn storm_range(&self, trigger_ns: u64) -> (u64, u64) {
        let ns = |secs: u64| secs.saturating_mul(1_000_000_000);
        (
            trigger_ns.saturating_sub(ns(self.cfg.auto_before_secs)),
            trigger_ns.saturating_add(ns(self.cfg.auto_after_secs)),
        )
    }

    /// Records let go so far.
    fn evicted(&self) -> u64 {
        self.stats.evicted_age_total + self.stats.evicted_size_total
    }

    /// Write the whole ring into the dump directory now (synchronous; prefer
    /// [`SharedRecorder::dump`] from async code).
    pub fn dump(&mut self, reason: DumpReason) -> Result<PathBuf, RecorderError> {
        if !self.cfg.enabled {
            return Err(RecorderError::Disabled);
        }
        let r = self.snapshot(reason).write_to_dir(&self.cfg.dump_dir);
        self.count_dump(&r);
        r
    }

    fn count_dump<T>(&mut self, r: &Result<T, RecorderError>) {
        self.stats.dumps_total += 1;
        if r.is_err() {
            self.stats.dump_errors_total += 1;
        }
    }

    pub fn stats(&self) -> RecorderStats {
        RecorderStats {
            records_in_ring: self.ring.len() as u64,
            bytes_in_ring: self.ring.bytes() as u64,
            bytes_held_by_dumps: self.ring.held() as u64,
            oldest_ns: self.ring.front_ts().unwrap_or(0),
            ..self.stats
        }
    }
}
