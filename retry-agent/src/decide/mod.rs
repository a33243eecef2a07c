//! Stage 4: policy. Verdicts and edge figures in, [`Decision`]s out. No IO.
use std::net::SocketAddr;

mod decider;
pub use decider::{DecideConfig, Decider};

use serde::{Deserialize, Serialize};

use crate::correlate::Edge;

/// Longest time to live a decision may carry (one hour). Everything that turns a TTL into a
/// deadline caps it here first, so a TTL from a setting or a socket can neither overflow time
/// arithmetic nor suppress for longer than an operator would notice.
pub const MAX_TTL_MS: u64 = 3_600_000;

/// Why retries on an edge must stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The callee's errors are symptoms of failures further down: retrying here only amplifies.
    CalleeUnclaimed,
    /// Retries exceed the budget (retries / requests). The callee owns (or may own) its errors,
    /// so at-least-once holds: actuators that can count let retries through up to the budget
    /// (retries <= budget x first attempts) and answer the rest; those that cannot suppress all.
    OverBudget,
    /// Arrival rate at the callee over its baseline beyond the threshold while this edge retries.
    /// Same enforcement as `OverBudget`.
    Amplification,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::CalleeUnclaimed => "callee_unclaimed",
            Reason::OverBudget => "over_budget",
            Reason::Amplification => "amplification",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Answer recognised retries on this edge locally; first attempts always pass.
    SuppressRetries,
    /// Lift a previous suppression.
    Allow,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::SuppressRetries => "suppress_retries",
            Action::Allow => "allow",
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One decision about one edge, with a time to live: an actuator that hears nothing more lets it
/// lapse, so a dead agent cannot leave retries suppressed forever (fail open).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub id: u64,
    pub edge: Edge,
    /// Addresses the callee was reached at (for actuators that key by destination).
    pub callee_addrs: Vec<SocketAddr>,
    pub action: Action,
    pub reason: Reason,
    pub issued_at_ns: u64,
    pub ttl_ms: u64,
}

impl Decision {
    /// The time to live, capped at [`MAX_TTL_MS`].
    pub fn ttl(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.ttl_ms.min(MAX_TTL_MS))
    }
}
