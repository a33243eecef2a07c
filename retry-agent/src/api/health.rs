//! `/healthz`: whether capture is alive. The run loop reports the ring reader's progress (events
//! plus poll rounds, which move on a quiet node too) and the programs attached once a second;
//! the probe fails when the reader has not moved for the stall window or nothing is attached.
use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::Instant;

/// Why `/healthz` answers 503.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unhealthy {
    #[error("capture has not reported yet")]
    NotStarted,
    #[error("no eBPF programs attached")]
    NoPrograms,
    #[error("the ring reader has not progressed for {} s", .0.as_secs())]
    Stalled(Duration),
}

#[derive(Debug)]
struct Progress {
    counter: u64,
    changed: Instant,
    programs: usize,
}

/// Shared between the run loop (which observes) and the API (which checks). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Health {
    progress: Arc<Mutex<Option<Progress>>>,
    stall: Duration,
}

impl Health {
    pub fn new(stall: Duration) -> Health {
        Health {
            progress: Arc::default(),
            stall,
        }
    }

    /// Records the reader's progress counter (events + poll rounds) and the programs attached.
    pub fn observe(&self, counter: u64, programs: usize) {
        let now = Instant::now();
        let mut g = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_mut() {
            Some(p) => {
                if counter != p.counter {
                    p.counter = counter;
                    p.changed = now;
                }
                p.programs = programs;
            }
            None => {
                *g = Some(Progress {
                    counter,
                    changed: now,
                    programs,
                })
            }
        }
    }

    pub fn check(&self) -> Result<(), Unhealthy> {
        let g = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        let p = g.as_ref().ok_or(Unhealthy::NotStarted)?;
        if p.programs == 0 {
            return Err(Unhealthy::NoPrograms);
        }
        let idle = Instant::now().saturating_duration_since(p.changed);
        if idle > self.stall {
            return Err(Unhealthy::Stalled(idle));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn healthy_only_while_the_reader_moves_with_programs_attached() {
        let h = Health::new(Duration::from_secs(30));
        assert_eq!(h.check(), Err(Unhealthy::NotStarted));
        h.observe(10, 0);
        assert_eq!(h.check(), Err(Unhealthy::NoPrograms));
        h.observe(10, 12);
        assert_eq!(h.check(), Ok(()));
        // Same counter for longer than the window: stalled.
        tokio::time::advance(Duration::from_secs(20)).await;
        h.observe(10, 12);
        assert_eq!(h.check(), Ok(()), "within the window");
        tokio::time::advance(Duration::from_secs(11)).await;
        h.observe(10, 12);
        assert!(matches!(h.check(), Err(Unhealthy::Stalled(d)) if d >= Duration::from_secs(31)));
        // Progress again: healthy again.
        h.observe(11, 12);
        assert_eq!(h.check(), Ok(()));
    }
}
