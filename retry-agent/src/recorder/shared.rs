//! The recorder behind a lock: how the live pipeline (its tap), the API and the signal handler
//! reach the one recorder.
use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
};

use super::{DumpReason, Recorder, RecorderError, RecorderStats};
use crate::pipeline::{Derived, Input, PipelineConfig, Record, Tap};

/// The recorder behind a lock, for the pipeline, the API route and the signal handler.
#[derive(Clone)]
pub struct SharedRecorder(Arc<Mutex<Recorder>>);

impl SharedRecorder {
    pub fn new(rec: Recorder) -> Self {
        SharedRecorder(Arc::new(Mutex::new(rec)))
    }

    pub fn record(&self, rec: Record) {
        if let Ok(mut r) = self.0.lock() {
            r.record(rec);
        }
    }

    /// Run `f` with the recorder locked (batch recording: one lock per batch).
    pub fn with<T>(&self, f: impl FnOnce(&mut Recorder) -> T) -> Result<T, RecorderError> {
        let mut g = self.0.lock().map_err(|_| RecorderError::Poisoned)?;
        Ok(f(&mut g))
    }

    pub fn stats(&self) -> RecorderStats {
        self.0.lock().map(|r| r.stats()).unwrap_or_default()
    }

    /// Snapshot under the lock, write after releasing it (on a blocking thread).
    pub async fn dump(&self, reason: DumpReason) -> Result<PathBuf, RecorderError> {
        let (snap, dir) = self.with(|r| {
            if !r.cfg.enabled {
                return Err(RecorderError::Disabled);
            }
            Ok((r.snapshot(reason), r.cfg.dump_dir.clone()))
        })??;
        let result = tokio::task::spawn_blocking(move || snap.write_to_dir(&dir))
            .await
            .unwrap_or(Err(RecorderError::Poisoned));
        let _ = self.with(|r| r.count_dump(&result));
        result
    }
}

/// The live agent's tap: one lock per push or tick. A poisoned lock loses the records (the
/// pipeline never stops for the recorder).
impl Tap for SharedRecorder {
    fn attach(&mut self, config: &PipelineConfig) {
        let _ = self.with(|r| r.set_pipeline_config(config.clone()));
    }

    fn tap(&mut self, input: Input<'_>, derived: Derived<'_>) {
        let _ = self.with(|r| r.tap(input, derived));
    }
}
