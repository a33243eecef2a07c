//! What a dump holds and why it was asked for: a consistent copy of the ring, written off the
//! recording path into a new private file that appears only once complete.
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{DumpHeader, DumpWriter, RecorderConfig, RecorderError, format, ring::Frozen};
use crate::pipeline::{PipelineConfig, Record};

/// Why a dump was written (goes into the header and the file name).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DumpReason {
    /// `retry-agent dump` / the HTTP API.
    OnDemand,
    Signal,
    /// A storm was detected at `trigger_ns` (first suppression decision).
    Storm {
        trigger_ns: u64,
        edge: String,
    },
    /// Tests, benchmarks, tools.
    Other(String),
}

impl std::fmt::Display for DumpReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DumpReason::OnDemand => f.write_str("on demand"),
            DumpReason::Signal => f.write_str("SIGUSR1"),
            DumpReason::Storm { trigger_ns, edge } => {
                write!(f, "storm on {edge} at {trigger_ns} ns")
            }
            DumpReason::Other(why) => f.write_str(why),
        }
    }
}

impl DumpReason {
    fn slug(&self) -> &str {
        match self {
            DumpReason::OnDemand => "ondemand",
            DumpReason::Signal => "signal",
            DumpReason::Storm { .. } => "storm",
            DumpReason::Other(_) => "other",
        }
    }
}

/// A consistent copy of the ring, taken under the recorder's lock and written off it. Cheap to
/// take: the ring's blocks are shared, not copied, and records are decoded one at a time as
/// the dump is written, so a dump neither stalls the pipeline for long nor holds the ring twice
/// over in memory: the blocks the ring lets go while a snapshot holds them count against the
/// ring's bound, and writing lets each block go once its records are in the file.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub reason: DumpReason,
    pub config: RecorderConfig,
    /// Settings of the pipeline that fed the recorder, if it said.
    pub pipeline: Option<PipelineConfig>,
    /// Process metadata, first in the dump so a replay names services from the first event on.
    pub(super) processes: Vec<Record>,
    /// The ring as frozen once, or twice for a storm (at the trigger, and once its after-window
    /// passed), each part taking up where the one before it ended.
    pub(super) ring: Vec<Frozen>,
    /// The range asked for (records outside it are left out when written).
    pub(super) from_ns: u64,
    pub(super) to_ns: u64,
    /// Records the ring had already evicted when the snapshot was taken.
    pub(super) evicted: u64,
}

/// Where a snapshot's records fall in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// The first and last time of a record in the range (0, 0 when none).
    pub from_ns: u64,
    pub to_ns: u64,
    /// Records evicted before the snapshot or left out as older than the range: a replay then
    /// starts mid-stream and its first figures may differ from the live ones.
    pub missing_before: u64,
    /// Records the ring let go between its parts (a storm's after-window longer than the ring
    /// reaches): the replay has a gap there.
    pub missing_between: u64,
}

impl Snapshot {
    /// Every record of the dump in order: the process metadata, then the ring's records in the
    /// range, each decoded as it is asked for (writing a dump drains the snapshot instead).
    #[cfg(test)]
    pub fn records(&self) -> impl Iterator<Item = Record> + '_ {
        let (from, to) = (self.from_ns, self.to_ns);
        self.processes.iter().cloned().chain(
            self.ring
                .iter()
                .flat_map(Frozen::iter)
                .filter(move |(ts, _)| (from..=to).contains(ts))
                .filter_map(|(_, e)| e.to_record()),
        )
    }

    /// The records' span, from their headers alone (nothing decoded).
    pub fn span(&self) -> Span {
        let (mut lo, mut hi) = (u64::MAX, 0);
        let mut missing_before = self.evicted + self.ring.first().map_or(0, |f| f.skipped);
        let missing_between = self
            .ring
            .windows(2)
            .map(|w| w[1].first_seq.saturating_sub(w[0].end_seq))
            .sum();
        for (ts, _) in self.ring.iter().flat_map(Frozen::iter) {
            if ts < self.from_ns {
                missing_before += 1;
            } else if ts <= self.to_ns {
                lo = lo.min(ts);
                hi = hi.max(ts);
            }
        }
        if lo > hi {
            lo = 0;
        }
        Span {
            from_ns: lo,
            to_ns: hi,
            missing_before,
            missing_between,
        }
    }

    /// Write into `dir` as a new 0600 file; returns its path. The file appears under its final
    /// name only once complete (written under a hidden name, then linked), so whoever watches
    /// the directory never reads half a dump.
    pub fn write_to_dir(self, dir: &Path) -> Result<PathBuf, RecorderError> {
        ensure_dir(dir)?;
        let node = format::node_name();
        let wall_ms = format::unix_ms();
        let base = format!("retry-agent-{node}-{wall_ms}-{}", self.reason.slug());
        let tmp = dir.join(format!(".{base}-{}.partial", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let written = self.write_file(&tmp);
        let result = written.and_then(|()| {
            for n in 0..100u32 {
                let suffix = if n == 0 {
                    String::new()
                } else {
                    format!("-{n}")
                };
                let path = dir.join(format!("{base}{suffix}.radump"));
                match std::fs::hard_link(&tmp, &path) {
                    Ok(()) => return Ok(path),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                    Err(source) => return Err(RecorderError::Write { path, source }),
                }
            }
            Err(RecorderError::Write {
                path: tmp.clone(),
                source: std::io::ErrorKind::AlreadyExists.into(),
            })
        });
        let _ = std::fs::remove_file(&tmp);
        result
    }

    /// Write to exactly `path` (must not exist), mode 0600. Each of the ring's blocks is let go
    /// once its records are written.
    pub fn write_file(self, path: &Path) -> Result<(), RecorderError> {
        let werr = |source| RecorderError::Write {
            path: path.to_path_buf(),
            source,
        };
        let file = format::create_private(path).map_err(werr)?;
        let span = self.span();
        let mut header = DumpHeader::new(
            self.reason.clone(),
            self.config.clone(),
            span.from_ns,
            span.to_ns,
        );
        header.missing_before = span.missing_before;
        header.missing_between = span.missing_between;
        if let Some(p) = &self.pipeline {
            header.pipeline = serde_json::to_value(p).unwrap_or(serde_json::Value::Null);
        }
        let mut w = DumpWriter::new(std::io::BufWriter::new(file), &header).map_err(werr)?;
        for r in &self.processes {
            w.push(r).map_err(werr)?;
        }
        let (from, to) = (self.from_ns, self.to_ns);
        for part in self.ring {
            part.drain(
                |ts, e| match (from..=to).contains(&ts).then(|| e.to_record()) {
                    Some(Some(r)) => w.push(&r).map_err(werr),
                    _ => Ok(()),
                },
            )?;
        }
        let mut inner = w.finish().map_err(werr)?;
        std::io::Write::flush(&mut inner).map_err(werr)?;
        inner.get_ref().sync_all().map_err(werr)?;
        Ok(())
    }
}

pub(super) fn ensure_dir(dir: &Path) -> Result<(), RecorderError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| RecorderError::DumpDir {
            path: dir.to_path_buf(),
            source,
        })
}
