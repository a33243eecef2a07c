//! The decider: edge figures in, suppression decisions with TTL and hysteresis out.
use std::collections::{BTreeMap, HashMap, HashSet};

use clap::Args;

#[cfg(test)]
mod tests;

use super::{Action, Basis, Decision, Evidence, Ownership, Reason};
use crate::{
    correlate::{Edge, EdgeStats, Engine, ServiceId},
    l7::Claim,
    settings::{InvalidConfig, Settings},
};

/// Policy thresholds (`--decide-*`).
#[derive(Args, Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct DecideConfig {
    /// Retry budget: retries / requests on an edge above this is over budget.
    #[arg(
        long = "decide-retry-budget",
        alias = "retry-budget",
        env = "RETRY_AGENT_DECIDE_RETRY_BUDGET",
        default_value_t = 0.10
    )]
    pub retry_budget: f64,
    /// Arrival rate over baseline at a callee above this (while the edge retries) is a storm.
    #[arg(
        long = "decide-amplification-threshold",
        alias = "amplification-threshold",
        env = "RETRY_AGENT_DECIDE_AMPLIFICATION_THRESHOLD",
        default_value_t = 1.5
    )]
    pub amplification_threshold: f64,
    /// Time to live of a decision; renewed at half-life while its condition holds.
    #[arg(
        long = "decide-ttl-ms",
        alias = "decision-ttl-ms",
        env = "RETRY_AGENT_DECIDE_TTL_MS",
        default_value_t = 30_000
    )]
    pub decision_ttl_ms: u64,
    /// A decision is lifted only after its condition has been false this long.
    #[arg(
        long = "decide-hysteresis-ms",
        alias = "hysteresis-ms",
        env = "RETRY_AGENT_DECIDE_HYSTERESIS_MS",
        default_value_t = 15_000
    )]
    pub hysteresis_ms: u64,
    /// While a decision is active its thresholds are scaled by this (< 1), so figures hovering
    /// at a threshold do not flap.
    #[arg(
        long = "decide-exit-fraction",
        alias = "exit-fraction",
        env = "RETRY_AGENT_DECIDE_EXIT_FRACTION",
        default_value_t = 0.5
    )]
    pub exit_fraction: f64,
    /// Requests in the window an edge needs before budget or amplification count.
    #[arg(
        long = "decide-min-requests",
        alias = "min-requests",
        env = "RETRY_AGENT_DECIDE_MIN_REQUESTS",
        default_value_t = 20
    )]
    pub min_requests: u64,
    /// Callee errors in the window before their claims count.
    #[arg(
        long = "decide-min-failures",
        alias = "min-failures",
        env = "RETRY_AGENT_DECIDE_MIN_FAILURES",
        default_value_t = 5
    )]
    pub min_failures: u64,
    /// Between the once-a-second evaluations, evaluate ownership as soon as evidence of
    /// disowned errors arrives (at most every 20 ms of capture time), counting the current
    /// bucket: suppression within tens of ms of the evidence instead of one to two seconds.
    #[arg(
        long = "decide-burst",
        env = "RETRY_AGENT_DECIDE_BURST",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub burst: bool,
    /// Where no verdict says whose a callee's errors are (its requests and calls cannot be
    /// linked: an event loop without trace context, every call of which fails in a hard fault),
    /// but it fails at least half of its requests while a dependency of it fails at least half
    /// of its calls with errors owned below it (claimed or disowned there), over the window or
    /// its last two seconds (a fault's onset; failed exchanges trigger bursts): stop the retries
    /// into it as above an owner (basis `dependency_symptoms`) instead of capping them to the
    /// budget. Off: such edges keep their budget (owner load (1 + budget)^depth).
    #[arg(
        long = "decide-dependency-symptoms",
        env = "RETRY_AGENT_DECIDE_DEPENDENCY_SYMPTOMS",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub dependency_symptoms: bool,
}

/// The share of failed requests (callee) and failed calls (its dependency) a hard fault shows,
/// below which `--decide-dependency-symptoms` infers nothing.
const SYMPTOM_FAILURE_RATIO: f64 = 0.5;

impl Default for DecideConfig {
    fn default() -> Self {
        crate::settings::defaults()
    }
}

impl Settings for DecideConfig {
    fn check(&self, p: &mut InvalidConfig) {
        let budget = self.retry_budget;
        p.check(
            (0.0..=1.0).contains(&budget),
            "decide-retry-budget",
            budget,
            "in [0, 1]",
        );
        let amp = self.amplification_threshold;
        p.check(amp > 1.0, "decide-amplification-threshold", amp, "> 1");
        let exit = self.exit_fraction;
        p.check(
            exit > 0.0 && exit <= 1.0,
            "decide-exit-fraction",
            exit,
            "in (0, 1]",
        );
        p.check(
            (1..=super::MAX_TTL_MS).contains(&self.decision_ttl_ms),
            "decide-ttl-ms",
            self.decision_ttl_ms,
            "from 1 to 3600000 (one hour)",
        );
    }
}

#[derive(Debug, Clone)]
struct Active {
    decision: Decision,
    /// Last time the condition held.
    last_true_ns: u64,
}

/// Turns edge figures into decisions. Holds the active set; `evaluate` returns only changes.
pub struct Decider {
    cfg: DecideConfig,
    next_id: u64,
    active: BTreeMap<Edge, Active>,
}

impl Decider {
    pub fn new(cfg: DecideConfig) -> Self {
        Decider {
            cfg,
            next_id: 1,
            active: BTreeMap::new(),
        }
    }

    pub fn config(&self) -> &DecideConfig {
        &self.cfg
    }

    /// Decide from the engine's current edge figures.
    pub fn evaluate(&mut self, engine: &Engine, now_ns: u64) -> Vec<Decision> {
        self.evaluate_edges(&engine.edges(), now_ns)
    }

    /// Decide from edge figures (new, renewed, changed or lifted decisions only).
    pub fn evaluate_edges(&mut self, edges: &[EdgeStats], now_ns: u64) -> Vec<Decision> {
        let mut out = Vec::new();
        let symptoms = self.dependency_symptoms(edges);
        for e in edges {
            let active = self.active.get(&e.edge);
            let want = self.condition_given(e, active.is_some(), &symptoms);
            match (want, self.active.get_mut(&e.edge)) {
                (Some(reason), None) => out.push(self.start(e, reason, now_ns)),
                (Some(reason), Some(_)) => {
                    let evidence = self.evidence(e, reason);
                    let half_life = self.cfg.decision_ttl_ms.saturating_mul(1_000_000) / 2;
                    let Some(a) = self.active.get_mut(&e.edge) else {
                        continue;
                    };
                    a.last_true_ns = now_ns;
                    let stale = now_ns.saturating_sub(a.decision.issued_at_ns) >= half_life;
                    let basis = a.decision.evidence.as_ref().map(|x| x.basis);
                    if stale || a.decision.reason != reason || basis != Some(evidence.basis) {
                        out.push(refresh(a, e, reason, evidence, now_ns));
                    }
                }
                (None, Some(a)) => {
                    if now_ns.saturating_sub(a.last_true_ns)
                        >= self.cfg.hysteresis_ms.saturating_mul(1_000_000)
                        && let Some(a) = self.active.remove(&e.edge)
                    {
                        out.push(self.lift(a.decision, now_ns));
                    }
                }
                (None, None) => {}
            }
        }
        // Edges that vanished from the figures (aged out): lift after the hysteresis too.
        let hyst = self.cfg.hysteresis_ms.saturating_mul(1_000_000);
        let gone: Vec<Edge> = self
            .active
            .iter()
            .filter(|(edge, a)| {
                now_ns.saturating_sub(a.last_true_ns) >= hyst
                    && !edges.iter().any(|e| &e.edge == *edge)
            })
            .map(|(edge, _)| edge.clone())
            .collect();
        for edge in gone {
            if let Some(a) = self.active.remove(&edge) {
                out.push(self.lift(a.decision, now_ns));
            }
        }
        out
    }

    /// A burst evaluation between ticks: only ownership decisions (`callee_unclaimed`), new or
    /// turning a budget cap already in force into a stop (same id). Nothing is renewed, lifted
    /// or capped here (the tick does that), so an edge into an owner, whose claims are mostly
    /// `claimed`, is never touched, and budget decisions keep their minimum of requests over
    /// complete buckets.
    pub fn evaluate_burst(&mut self, edges: &[EdgeStats], now_ns: u64) -> Vec<Decision> {
        let mut out = Vec::new();
        let symptoms = self.dependency_symptoms(edges);
        for e in edges {
            let reason = self.active.get(&e.edge).map(|a| a.decision.reason);
            if reason == Some(Reason::CalleeUnclaimed)
                || self.condition_given(e, false, &symptoms) != Some(Reason::CalleeUnclaimed)
            {
                continue;
            }
            let evidence = self.evidence(e, Reason::CalleeUnclaimed);
            if let Some(a) = self.active.get_mut(&e.edge) {
                a.last_true_ns = now_ns;
                out.push(refresh(a, e, Reason::CalleeUnclaimed, evidence, now_ns));
                continue;
            }
            out.push(self.start(e, Reason::CalleeUnclaimed, now_ns));
        }
        out
    }

    /// Decisions currently in force.
    pub fn active(&self) -> Vec<Decision> {
        self.active.values().map(|a| a.decision.clone()).collect()
    }

    /// Issues a decision on `e` and holds it.
    fn start(&mut self, e: &EdgeStats, reason: Reason, now_ns: u64) -> Decision {
        let d = self.issue(e, reason, now_ns);
        self.active.insert(
            e.edge.clone(),
            Active {
                decision: d.clone(),
                last_true_ns: now_ns,
            },
        );
        d
    }

    /// The lift of a held decision: `Allow`, under a new id.
    fn lift(&mut self, mut held: Decision, now_ns: u64) -> Decision {
        held.action = Action::Allow;
        held.issued_at_ns = now_ns;
        held.id = self.next_id;
        self.next_id += 1;
        held
    }

    fn issue(&mut self, e: &EdgeStats, reason: Reason, now_ns: u64) -> Decision {
        let id = self.next_id;
        self.next_id += 1;
        Decision {
            id,
            edge: e.edge.clone(),
            callee_addrs: e.callee_addrs.clone(),
            action: Action::SuppressRetries,
            reason,
            issued_at_ns: now_ns,
            ttl_ms: self.cfg.decision_ttl_ms,
            evidence: Some(self.evidence(e, reason)),
        }
    }

    /// The edge's calls fail at least this share of the time (and at least the minimum).
    fn failing(&self, e: &EdgeStats, ratio: f64) -> bool {
        e.failures >= self.cfg.min_failures.max(1) && e.failure_ratio >= ratio
    }

    /// [`Self::failing`] over the window or over its last seconds: at a fault's onset the
    /// window still holds the healthy seconds before it, which held a dependency-symptom
    /// decision back ~1 s in the lab's untraced event-loop chain.
    fn failing_lately(&self, e: &EdgeStats, ratio: f64) -> bool {
        let recent = e.recent_failures >= self.cfg.min_failures.max(1)
            && e.recent_failures as f64 >= e.recent_requests as f64 * ratio;
        recent || self.failing(e, ratio)
    }

    /// Callees whose errors no verdict places but that fail with a dependency (see
    /// `--decide-dependency-symptoms`): a callee failing at least half of its requests on an
    /// edge without enough claims, one of whose own edges fails at least half of its calls
    /// into a service whose standing is known (its claims decide: it owns its errors, or they
    /// are symptoms of something deeper) or is itself inferred so. Grown to a fixed point, so
    /// a chain of such services above one owner is found whole.
    fn dependency_symptoms(&self, edges: &[EdgeStats]) -> HashSet<ServiceId> {
        let mut found = HashSet::new();
        if !self.cfg.dependency_symptoms {
            return found;
        }
        // Linear per round (this runs on every burst evaluation): the candidates, and each
        // failing edge filed under its caller. A service whose claims decide on any edge into
        // it is no candidate: its verdicts speak for it.
        let known: HashSet<&ServiceId> = edges
            .iter()
            .filter(|d| self.ownership(d) != Ownership::Unknown)
            .map(|d| &d.edge.callee)
            .collect();
        let mut candidates: Vec<&ServiceId> = edges
            .iter()
            .filter(|e| {
                self.ownership(e) == Ownership::Unknown
                    && self.failing_lately(e, SYMPTOM_FAILURE_RATIO)
                    && !known.contains(&e.edge.callee)
            })
            .map(|e| &e.edge.callee)
            .collect();
        if candidates.is_empty() {
            return found;
        }
        let mut failing_deps: HashMap<&ServiceId, Vec<&ServiceId>> = HashMap::new();
        for d in edges
            .iter()
            .filter(|d| self.failing_lately(d, SYMPTOM_FAILURE_RATIO))
        {
            if d.edge.caller != d.edge.callee {
                failing_deps
                    .entry(&d.edge.caller)
                    .or_default()
                    .push(&d.edge.callee);
            }
        }
        loop {
            let before = found.len();
            candidates.retain(|&c| {
                let explained = failing_deps.get(c).is_some_and(|deps| {
                    deps.iter().any(|y| known.contains(y) || found.contains(*y))
                });
                if explained {
                    found.insert(c.clone());
                }
                !explained
            });
            if found.len() == before || candidates.is_empty() {
                return found;
            }
        }
    }

    /// The callee's standing on the edge: owner or not only on enough claims, by majority.
    fn ownership(&self, e: &EdgeStats) -> Ownership {
        let claims = e.callee_claims;
        if claims.total() < self.cfg.min_failures.max(1) {
            return Ownership::Unknown;
        }
        match claims.majority() {
            Some(Claim::Claimed) => Ownership::Owner,
            Some(Claim::Unclaimed) => Ownership::NotOwner,
            _ => Ownership::Unknown,
        }
    }

    /// What a decision for `reason` on this edge rests on.
    fn evidence(&self, e: &EdgeStats, reason: Reason) -> Evidence {
        let callee = self.ownership(e);
        let src = e.claim_sources;
        let basis = match reason {
            // Where most of the unclaimed evidence came from.
            Reason::CalleeUnclaimed if src.header.unclaimed > src.verdicts.unclaimed => {
                Basis::ClaimHeader
            }
            // Not enough claims: the callee was found to fail with a dependency.
            Reason::CalleeUnclaimed if callee == Ownership::Unknown => Basis::DependencySymptoms,
            Reason::CalleeUnclaimed => Basis::Verdicts,
            Reason::OverBudget if callee == Ownership::Owner => Basis::OwnerBudget,
            Reason::OverBudget => Basis::Budget,
            Reason::Amplification => Basis::Amplification,
        };
        Evidence {
            basis,
            callee,
            claims: e.callee_claims,
            sources: src,
            dependency: e.dependency,
            requests: e.requests,
            retries: e.retries,
            retry_ratio: e.retry_ratio,
            retry_budget: self.cfg.retry_budget,
            amplification: e.amplification,
            amplification_threshold: self.cfg.amplification_threshold,
            fault_active: e.fault_active,
            retries_within_budget: reason != Reason::CalleeUnclaimed,
        }
    }

    /// The condition of one edge on its own (no callee found to fail with a dependency).
    #[cfg(test)]
    fn condition(&self, e: &EdgeStats, active: bool) -> Option<Reason> {
        self.condition_given(e, active, &HashSet::new())
    }

    /// Whether the edge should have its retries suppressed, and why (the strongest reason).
    /// With `active`, exit thresholds apply (hysteresis). `symptoms`: the callees found to fail
    /// with a dependency ([`Decider::dependency_symptoms`] over the same figures).
    fn condition_given(
        &self,
        e: &EdgeStats,
        active: bool,
        symptoms: &HashSet<ServiceId>,
    ) -> Option<Reason> {
        let scale = if active { self.cfg.exit_fraction } else { 1.0 };
        // Ownership: the callee's errors are symptoms. Missing claims never count here: the
        // first node that sees a missing claim keeps its retry (at-least-once).
        let claims = e.callee_claims;
        if claims.total() >= self.cfg.min_failures.max(1)
            && claims.majority() == Some(Claim::Unclaimed)
            && (claims.unclaimed as f64) >= (claims.total() as f64) * 0.5 * scale.max(0.5)
        {
            return Some(Reason::CalleeUnclaimed);
        }
        if self.ownership(e) == Ownership::Unknown
            && symptoms.contains(&e.edge.callee)
            && self.failing_lately(e, SYMPTOM_FAILURE_RATIO * scale)
        {
            return Some(Reason::CalleeUnclaimed);
        }
        if e.requests < self.cfg.min_requests {
            return None;
        }
        if e.retries > 0 && e.retry_ratio > self.cfg.retry_budget * scale {
            return Some(Reason::OverBudget);
        }
        let amp_threshold = 1.0 + (self.cfg.amplification_threshold - 1.0) * scale;
        if e.retries > 0 && e.fault_active && e.amplification > amp_threshold {
            return Some(Reason::Amplification);
        }
        None
    }
}

/// Renews a held decision in place (same id: actuators treat it as the same decision, refreshed).
fn refresh(
    a: &mut Active,
    e: &EdgeStats,
    reason: Reason,
    evidence: Evidence,
    now_ns: u64,
) -> Decision {
    a.decision.reason = reason;
    a.decision.issued_at_ns = now_ns;
    a.decision.callee_addrs = e.callee_addrs.clone();
    a.decision.evidence = Some(evidence);
    a.decision.clone()
}
