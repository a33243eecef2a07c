//! `POST /v1/dump` on the private socket, guarded: one dump at a time (a second request is
//! refused at once, 409), at most one started per `--api-dump-min-interval-secs` (429), and the
//! dump directory pruned to `--api-dump-keep` files and `--api-dump-max-bytes` after each dump
//! (oldest first; the newest dump is always kept).
use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use tokio::time::Instant;

use crate::recorder::{SharedRecorder, dump_api_response};

/// Why a dump request was refused before any work was done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("a dump is already being written")]
    Busy,
    #[error("dumps are rate limited: try again in {} s", .0.as_secs().max(1))]
    RateLimited(Duration),
}

impl Refused {
    pub fn status(&self) -> u16 {
        match self {
            Refused::Busy => 409,
            Refused::RateLimited(_) => 429,
        }
    }
}

/// Single flight and a minimum interval between dump starts.
#[derive(Debug)]
pub struct DumpGate {
    busy: Arc<tokio::sync::Mutex<()>>,
    last_start: Mutex<Option<Instant>>,
    min_interval: Duration,
}

/// Held while a dump is written; the next one may start once it is dropped.
pub struct Permit {
    _held: tokio::sync::OwnedMutexGuard<()>,
}

impl DumpGate {
    pub fn new(min_interval: Duration) -> DumpGate {
        DumpGate {
            busy: Arc::default(),
            last_start: Mutex::new(None),
            min_interval,
        }
    }

    /// Never waits: either a permit or the reason there is none.
    pub fn try_start(&self) -> Result<Permit, Refused> {
        let held = self
            .busy
            .clone()
            .try_lock_owned()
            .map_err(|_| Refused::Busy)?;
        let now = Instant::now();
        let mut last = self.last_start.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = *last {
            let next = t + self.min_interval;
            if now < next {
                return Err(Refused::RateLimited(next - now));
            }
        }
        *last = Some(now);
        Ok(Permit { _held: held })
    }
}

/// The dump directory's cap.
#[derive(Debug, Clone)]
pub struct Retention {
    pub dir: PathBuf,
    pub keep: usize,
    pub max_bytes: u64,
}

/// Everything the dump route needs.
#[derive(Clone)]
pub struct DumpService {
    pub recorder: SharedRecorder,
    pub gate: Arc<DumpGate>,
    pub retention: Retention,
}

impl DumpService {
    /// Status and JSON body of one `POST /v1/dump`.
    pub async fn handle(&self, body: &[u8]) -> (u16, String) {
        let permit = match self.gate.try_start() {
            Ok(p) => p,
            Err(r) => {
                let body = serde_json::json!({ "path": null, "error": r.to_string() }).to_string();
                return (r.status(), body);
            }
        };
        let answer = dump_api_response(&self.recorder, body).await;
        let retention = self.retention.clone();
        match tokio::task::spawn_blocking(move || prune(&retention)).await {
            Ok(Ok(removed)) if removed > 0 => {
                tracing::info!(removed, "recorder: old dumps removed")
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "recorder: pruning the dump directory failed"),
            _ => {}
        }
        drop(permit);
        answer
    }
}

/// Removes the oldest `*.radump` files until at most `keep` remain and they total at most
/// `max_bytes`; the newest is always kept. Returns how many were removed.
pub fn prune(r: &Retention) -> std::io::Result<usize> {
    let mut dumps: Vec<(SystemTime, PathBuf, u64)> = Vec::new();
    for e in std::fs::read_dir(&r.dir)? {
        let Ok(e) = e else { continue };
        let path = e.path();
        if path.extension().is_none_or(|x| x != "radump") {
            continue;
        }
        let Ok(meta) = e.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        dumps.push((
            meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            path,
            meta.len(),
        ));
    }
    // Newest first (names carry a timestamp, so they order mtime ties the same way).
    dumps.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.cmp(&a.1)));
    let mut total = 0u64;
    let mut removed = 0;
    for (i, (_, path, len)) in dumps.iter().enumerate() {
        total = total.saturating_add(*len);
        if i > 0 && (i >= r.keep || total > r.max_bytes) {
            remove(path)?;
            removed += 1;
        }
    }
    Ok(removed)
}

fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_dump_at_a_time_and_one_per_interval() {
        let gate = DumpGate::new(Duration::from_secs(10));
        let first = gate.try_start().expect("first");
        assert_eq!(
            gate.try_start().err(),
            Some(Refused::Busy),
            "second while the first runs"
        );
        drop(first);
        // Done, but too soon after the last start.
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(
            gate.try_start().err(),
            Some(Refused::RateLimited(Duration::from_secs(6)))
        );
        assert_eq!(Refused::Busy.status(), 409);
        assert_eq!(Refused::RateLimited(Duration::ZERO).status(), 429);
        tokio::time::advance(Duration::from_secs(6)).await;
        let again = gate.try_start().expect("after the interval");
        drop(again);
        // A zero interval keeps only the single flight.
        let gate = DumpGate::new(Duration::ZERO);
        let a = gate.try_start().expect("a");
        assert_eq!(gate.try_start().err(), Some(Refused::Busy));
        drop(a);
        assert!(gate.try_start().is_ok());
    }

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ra-prune-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn write(d: &Path, name: &str, len: usize, age_s: u64) {
        let p = d.join(name);
        std::fs::write(&p, vec![0u8; len]).unwrap();
        let t = SystemTime::now() - Duration::from_secs(age_s);
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }

    fn names(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn prune_keeps_the_newest_under_both_caps() {
        let d = dir("caps");
        for (i, age) in [50, 40, 30, 20, 10].iter().enumerate() {
            write(&d, &format!("d{i}.radump"), 100, *age);
        }
        write(&d, "notes.txt", 10_000, 100);
        let removed = prune(&Retention {
            dir: d.clone(),
            keep: 3,
            max_bytes: u64::MAX,
        })
        .unwrap();
        assert_eq!(removed, 2);
        assert_eq!(
            names(&d),
            ["d2.radump", "d3.radump", "d4.radump", "notes.txt"],
            "other files are left alone"
        );
        // The size cap: 250 bytes hold two 100-byte dumps.
        assert_eq!(
            prune(&Retention {
                dir: d.clone(),
                keep: 10,
                max_bytes: 250
            })
            .unwrap(),
            1
        );
        assert_eq!(names(&d), ["d3.radump", "d4.radump", "notes.txt"]);
        // The newest dump is kept even when it alone is over the cap.
        assert_eq!(
            prune(&Retention {
                dir: d.clone(),
                keep: 10,
                max_bytes: 1
            })
            .unwrap(),
            1
        );
        assert_eq!(names(&d), ["d4.radump", "notes.txt"]);
        let _ = std::fs::remove_dir_all(&d);
    }
}
