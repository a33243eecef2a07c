//! The recorder behind a lock: how the live pipeline (its tap), the API and the signal handler
//! reach the one recorder.
use std::{path::PathBuf, sync::Arc};

use parking_lot::{Mutex, RawMutex, lock_api::ArcMutexGuard};

use super::{DumpReason, Recorder, RecorderError, RecorderStats};
use crate::pipeline::{Derived, Input, PipelineConfig, Record, Tap};

/// The recorder behind a lock, for the pipeline, the API route and the signal handler. No
/// poisoning: the recorder never panics on what it records, and a dump must stay possible.
pub struct SharedRecorder {
    inner: Arc<Mutex<Recorder>>,
    /// The lock, while this handle's pipeline runs a batch ([`Tap::hold`]).
    held: Option<ArcMutexGuard<RawMutex, Recorder>>,
}

impl Clone for SharedRecorder {
    /// Another handle on the same recorder (never holding the lock).
    fn clone(&self) -> Self {
        SharedRecorder {
            inner: Arc::clone(&self.inner),
            held: None,
        }
    }
}

impl SharedRecorder {
    pub fn new(rec: Recorder) -> Self {
        SharedRecorder {
            inner: Arc::new(Mutex::new(rec)),
            held: None,
        }
    }

    pub fn record(&self, rec: Record) {
        self.inner.lock().record(rec);
    }

    /// Run `f` with the recorder locked (batch recording: one lock per batch).
    pub fn with<T>(&self, f: impl FnOnce(&mut Recorder) -> T) -> Result<T, RecorderError> {
        Ok(f(&mut self.inner.lock()))
    }

    pub fn stats(&self) -> RecorderStats {
        self.inner.lock().stats()
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
            .unwrap_or(Err(RecorderError::WriterPanicked));
        let _ = self.with(|r| r.count_dump(&result));
        result
    }
}

/// The live agent's tap: one lock per batch of pushes ([`crate::pipeline::Pipeline::batch`]),
/// or per push or tick outside one. The API and the signal handler wait at most one batch (one
/// drain of the ring, a few ms at most).
impl Tap for SharedRecorder {
    fn attach(&mut self, config: &PipelineConfig) {
        let _ = self.with(|r| r.set_pipeline_config(config.clone()));
    }

    fn tap(&mut self, input: Input<'_>, derived: Derived<'_>) {
        match &mut self.held {
            Some(g) => g.tap(input, derived),
            None => self.inner.lock().tap(input, derived),
        }
    }

    fn hold(&mut self) {
        if self.held.is_none() {
            self.held = Some(self.inner.lock_arc());
        }
    }

    fn release(&mut self) {
        self.held = None;
    }
}
