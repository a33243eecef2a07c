//! Stage 4: policy. Verdicts and edge figures in, [`Decision`]s out. No IO.
use std::net::SocketAddr;

mod decider;
pub use decider::{DecideConfig, Decider};

use serde::{Deserialize, Serialize};

use crate::correlate::{ClaimCounts, ClaimSources, DependencyKind, Edge};

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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub id: u64,
    pub edge: Edge,
    /// Addresses the callee was reached at (for actuators that key by destination).
    pub callee_addrs: Vec<SocketAddr>,
    pub action: Action,
    pub reason: Reason,
    pub issued_at_ns: u64,
    pub ttl_ms: u64,
    /// What the decision rests on, as of its issue or last renewal (a lift repeats the evidence
    /// of the suppression it lifts). `None` in dumps of older agents and in hand-made decisions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<Evidence>,
}

/// The kind of evidence a decision rests on, as one bounded label (`basis` in metrics): it
/// tells ownership (the callee disowns its errors: retries stop) from budget capping (retries
/// pass up to the budget).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// Our verdicts on the callee (on this node) say its errors are symptoms.
    Verdicts,
    /// The callee's error responses said so (`x-error-claim`).
    ClaimHeader,
    /// Over budget on the edge into a service known to own its errors: retries pass up to the
    /// budget, so the chain keeps its retry into the owner (at-least-once).
    OwnerBudget,
    /// Over budget while who owns the errors is not known (missing verdicts, no errors):
    /// budget capping alone.
    Budget,
    /// The callee's arrival rate is over its baseline while the edge retries: budget capping.
    Amplification,
    /// No verdict says whose the callee's errors are (an event loop without trace context under
    /// a hard fault: every call of its process fails), but it fails most of its requests while
    /// a dependency of it fails most of its calls with errors owned below it: its errors are
    /// taken for that dependency's symptoms (`--decide-dependency-symptoms`).
    DependencySymptoms,
}

impl Basis {
    pub const ALL: [Basis; 6] = [
        Basis::Verdicts,
        Basis::ClaimHeader,
        Basis::OwnerBudget,
        Basis::Budget,
        Basis::Amplification,
        Basis::DependencySymptoms,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Basis::Verdicts => "verdicts",
            Basis::ClaimHeader => "claim_header",
            Basis::OwnerBudget => "owner_budget",
            Basis::Budget => "budget",
            Basis::Amplification => "amplification",
            Basis::DependencySymptoms => "dependency_symptoms",
        }
    }
}

impl std::fmt::Display for Basis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whose errors the callee's failures on the edge were, by the claims they carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ownership {
    /// Most were claimed (at least the minimum of failures): the callee owns them.
    Owner,
    /// Most were unclaimed: symptoms of failures further down.
    NotOwner,
    /// Too few claims, or most missing.
    Unknown,
}

impl Ownership {
    pub fn as_str(self) -> &'static str {
        match self {
            Ownership::Owner => "owner",
            Ownership::NotOwner => "not_owner",
            Ownership::Unknown => "unknown",
        }
    }
}

/// The figures a decision was made from: the callee's claims and where they came from
/// (verdicts, by link, or the claim header), failure memory, budget and amplification.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    pub basis: Basis,
    /// The callee's standing on this edge.
    pub callee: Ownership,
    /// Claims the callee's errors carried in the window (`sources` says from where).
    pub claims: ClaimCounts,
    pub sources: ClaimSources,
    /// What failure-pattern memory learned of the dependency.
    pub dependency: DependencyKind,
    /// The edge's figures in the window, and the thresholds they were held to.
    pub requests: u64,
    pub retries: u64,
    pub retry_ratio: f64,
    pub retry_budget: f64,
    pub amplification: f64,
    pub amplification_threshold: f64,
    pub fault_active: bool,
    /// Retries on the edge still pass up to the budget (every reason but `callee_unclaimed`).
    pub retries_within_budget: bool,
}

impl Evidence {
    /// One line for logs and reports: `verdicts: unclaimed 12 of 14 (go_uprobes 10, thread 4)`.
    pub fn summary(&self) -> String {
        let c = &self.claims;
        let v = &self.sources.verdicts;
        let h = &self.sources.header;
        let claims = format!(
            "callee {} (claimed {}, unclaimed {}, missing {}; verdicts {}/{}/{} linked by {}; header {}/{}/{})",
            self.callee.as_str(),
            c.claimed,
            c.unclaimed,
            c.missing,
            v.claimed,
            v.unclaimed,
            v.missing,
            self.sources.links.summary(),
            h.claimed,
            h.unclaimed,
            h.missing,
        );
        let budget = format!(
            "retries {}/{} ({:.0}% vs budget {:.0}%), amplification {:.2}× vs {:.2}×{}",
            self.retries,
            self.requests,
            self.retry_ratio * 100.0,
            self.retry_budget * 100.0,
            self.amplification,
            self.amplification_threshold,
            if self.fault_active { " in a fault" } else { "" },
        );
        let memory = match self.dependency {
            DependencyKind::FailClose => "fail-close",
            DependencyKind::FailOpen => "fail-open",
            DependencyKind::Unknown => "not learned",
        };
        let stop = if self.retries_within_budget {
            "retries pass up to the budget"
        } else {
            "retries stop"
        };
        format!(
            "{}: {stop}; {claims}; dependency {memory}; {budget}",
            self.basis
        )
    }
}

impl Decision {
    /// The time to live, capped at [`MAX_TTL_MS`].
    pub fn ttl(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.ttl_ms.min(MAX_TTL_MS))
    }
}
