//! [`Dispatcher`]: one task per actuator, each fed through its own bounded mailbox, so one hung
//! actuator (an HAProxy socket that never answers) delays neither the others nor the caller.
//!
//! A mailbox coalesces instead of queueing: decisions are kept per edge, the latest one winning
//! (a superseded decision for the same edge is stale and is dropped, counted); claims are a full
//! set, so only the latest is kept; ticks collapse into one. Its size is bounded by the number of
//! edges with a pending decision ([`MAX_PENDING_EDGES`]; beyond that new edges are dropped,
//! counted: the decider re-issues live decisions at half-life).
use std::{
    collections::BTreeMap,
    fmt,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use serde::Serialize;
use tokio::{sync::Notify, task::JoinHandle};

use super::{
    ActuateConfig, ActuateError, Actuator, ActuatorKind, control, decision_log, envoy, haproxy,
};
use crate::{correlate::Edge, correlate::ServiceClaim, decide::Decision};

/// Edges with a decision waiting for one actuator; beyond this, new edges' decisions are dropped.
pub const MAX_PENDING_EDGES: usize = 4096;
/// How long [`Dispatcher::shutdown`] waits for the actuators by default.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Per-actuator outcome counters (for metrics and the API).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ActuatorStats {
    pub name: &'static str,
    pub ok: u64,
    pub failed: u64,
    /// Decisions never handed to the actuator: superseded by a later one for the same edge while
    /// it was busy, or over [`MAX_PENDING_EDGES`].
    pub dropped: u64,
    pub last_error: Option<String>,
}

#[derive(Default)]
struct Pending {
    decisions: BTreeMap<Edge, Decision>,
    claims: Option<Vec<ServiceClaim>>,
    tick: bool,
    closed: bool,
}

#[derive(Default)]
struct Mailbox {
    pending: Mutex<Pending>,
    stats: Mutex<ActuatorStats>,
    wake: Notify,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data behind the lock: a panic elsewhere cannot leave it inconsistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Mailbox {
    fn post(&self, f: impl FnOnce(&mut Pending, &mut u64)) {
        let mut dropped = 0;
        {
            let mut p = lock(&self.pending);
            if p.closed {
                return;
            }
            f(&mut p, &mut dropped);
        }
        if dropped > 0 {
            lock(&self.stats).dropped += dropped;
        }
        self.wake.notify_one();
    }

    fn record(&self, what: &'static str, r: Result<(), ActuateError>) {
        let mut st = lock(&self.stats);
        match r {
            Ok(()) => st.ok += 1,
            Err(e) => {
                st.failed += 1;
                // Failures are expected (HAProxy restarting, no shim yet): warn, count, carry on.
                tracing::warn!(actuator = st.name, what, error = %e, "actuation failed");
                st.last_error = Some(e.to_string());
            }
        }
    }
}

/// One actuator's task: takes whatever is pending, newest state only, until closed; then shuts
/// the actuator down.
async fn work(mut actuator: Box<dyn Actuator>, mb: Arc<Mailbox>) {
    loop {
        let (decisions, claims, tick, closed) = {
            let mut p = lock(&mb.pending);
            let decisions: Vec<Decision> = std::mem::take(&mut p.decisions).into_values().collect();
            let tick = std::mem::take(&mut p.tick);
            (decisions, p.claims.take(), tick, p.closed)
        };
        let idle = decisions.is_empty() && claims.is_none() && !tick;
        if !decisions.is_empty() || tick {
            // A batch of decisions also expires what lapsed, so it stands in for a tick.
            let r = actuator.apply(&decisions).await;
            mb.record("apply", r);
        }
        if let Some(cs) = claims {
            let r = actuator.publish_claims(&cs).await;
            mb.record("publish_claims", r);
        }
        if idle {
            if closed {
                break;
            }
            mb.wake.notified().await;
        }
    }
    let r = actuator.shutdown().await;
    mb.record("shutdown", r);
}

struct Worker {
    mailbox: Arc<Mailbox>,
    task: Option<JoinHandle<()>>,
}

/// Fans decisions out to every configured actuator, each on its own task. Never blocks, never
/// fails and never panics because one actuator did: each outcome is counted per actuator.
#[derive(Default)]
pub struct Dispatcher {
    workers: Vec<Worker>,
}

impl fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.stats()).finish()
    }
}

impl Dispatcher {
    /// Builds the configured actuators. Must run inside a tokio runtime (the control actuator
    /// binds its socket and spawns its server task here, so shims can connect before the first
    /// decision).
    pub fn from_config(cfg: &ActuateConfig) -> Result<Dispatcher, ActuateError> {
        let mut d = Dispatcher::default();
        let mut seen = Vec::new();
        for kind in &cfg.actuators {
            if seen.contains(kind) {
                continue;
            }
            seen.push(*kind);
            let a: Box<dyn Actuator> = match kind {
                ActuatorKind::Control => {
                    Box::new(control::ControlActuator::bind(&cfg.control_socket)?)
                }
                ActuatorKind::Haproxy => Box::new(haproxy::HaproxyActuator::new(
                    cfg.haproxy_socket.clone(),
                    cfg.haproxy_map.clone(),
                )),
                ActuatorKind::Envoy => Box::new(envoy::EnvoyActuator::new(cfg.envoy_admin)),
                ActuatorKind::DecisionLog => {
                    Box::new(decision_log::DecisionLog::open(&cfg.decision_log)?)
                }
            };
            d.push(a)?;
        }
        Ok(d)
    }

    /// Adds an actuator and starts its task (needs a tokio runtime).
    pub fn push(&mut self, actuator: Box<dyn Actuator>) -> Result<(), ActuateError> {
        let rt = tokio::runtime::Handle::try_current().map_err(|_| ActuateError::NoRuntime)?;
        let mailbox = Arc::new(Mailbox::default());
        lock(&mailbox.stats).name = actuator.name();
        let task = rt.spawn(work(actuator, mailbox.clone()));
        self.workers.push(Worker {
            mailbox,
            task: Some(task),
        });
        Ok(())
    }

    /// Hands new decisions to every actuator (returns at once).
    pub fn apply(&self, decisions: &[Decision]) {
        for w in &self.workers {
            w.mailbox.post(|p, dropped| {
                for d in decisions {
                    let full = p.decisions.len() >= MAX_PENDING_EDGES;
                    // Over the cap a new edge is dropped; a known edge's older decision is stale.
                    let dropped_one = if full && !p.decisions.contains_key(&d.edge) {
                        true
                    } else {
                        p.decisions.insert(d.edge.clone(), d.clone()).is_some()
                    };
                    *dropped += u64::from(dropped_one);
                }
                if decisions.is_empty() {
                    p.tick = true;
                }
            });
        }
    }

    /// Expiry tick: `apply(&[])`. Call about once a second.
    pub fn tick(&self) {
        self.apply(&[]);
    }

    /// Replaces the per-service claims on every actuator that uses them (latest set wins).
    pub fn publish_claims(&self, claims: &[ServiceClaim]) {
        for w in &self.workers {
            w.mailbox.post(|p, _| p.claims = Some(claims.to_vec()));
        }
    }

    /// The agent is stopping: each actuator finishes what is pending, then removes what would
    /// outlive it. Waits at most `timeout` for all of them; one that does not finish by then is
    /// abandoned and counted as a failed shutdown.
    pub async fn shutdown(&mut self, timeout: Duration) {
        for w in &self.workers {
            lock(&w.mailbox.pending).closed = true;
            w.mailbox.wake.notify_one();
        }
        let deadline = tokio::time::Instant::now() + timeout;
        for w in &mut self.workers {
            let Some(mut task) = w.task.take() else {
                continue;
            };
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                task.abort();
                w.mailbox.record(
                    "shutdown",
                    Err(ActuateError::Timeout {
                        what: "the actuator at shutdown",
                    }),
                );
            }
        }
    }

    pub fn stats(&self) -> Vec<ActuatorStats> {
        self.workers
            .iter()
            .map(|w| lock(&w.mailbox.stats).clone())
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }
}

impl Drop for Dispatcher {
    /// Without a shutdown the tasks are stopped where they are (their actuators dropped).
    fn drop(&mut self) {
        for t in self.workers.iter_mut().filter_map(|w| w.task.take()) {
            t.abort();
        }
    }
}
