//! The design's numbers, reproduced through the real engine and decider.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use crate::l7::OutcomeClass;

const CHAIN: [&str; 7] = ["a", "b", "c", "d", "e", "f", "g"];
const RATE: u64 = 50;

fn per_root(served: &[u64], seconds: u64) -> Vec<f64> {
    served
        .iter()
        .map(|&n| n as f64 / (RATE * seconds) as f64)
        .collect()
}

fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol,
            "depth {i}: got {g:.3}, want {w} (all: {got:.3?})"
        );
    }
}

/// Baseline, then the fault at depth 3 without decisions applied, then with them.
fn storm(
    cfg: CorrelateConfig,
    dcfg: DecideConfig,
    setup: impl FnOnce(&mut Sim),
) -> (Sim, Vec<f64>, Vec<f64>) {
    let mut sim = Sim::chain(&CHAIN, 2, cfg, dcfg);
    setup(&mut sim);
    sim.run(10, RATE);
    sim.set_fault(3, 1.0);
    let without = per_root(&sim.run(10, RATE), 10);
    sim.apply_decisions = true;
    let with = per_root(&sim.run(10, RATE), 10);
    (sim, without, with)
}

#[test]
fn retries_multiply_per_hop() {
    let (_, without, _) = storm(CorrelateConfig::default(), DecideConfig::default(), |_| {});
    assert_close(&without, &[1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0], 1e-9);
}

#[test]
fn plain_budgets_compound() {
    let mut sim = Sim::chain(
        &CHAIN,
        2,
        CorrelateConfig::default(),
        DecideConfig::default(),
    );
    sim.client_budget = Some(0.10);
    sim.set_fault(3, 1.0);
    let served = per_root(&sim.run(20, RATE), 20);
    assert_close(&served, &[1.0, 1.1, 1.21, 1.331, 1.331, 1.331, 1.331], 0.01);
}

#[test]
fn ownership_keeps_retries_only_into_the_owner_within_budget() {
    let (sim, without, with) = storm(CorrelateConfig::default(), DecideConfig::default(), |_| {});
    assert_close(&without, &[1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0], 1e-9);
    assert_close(&with, &[1.0, 1.0, 1.0, 1.1, 1.1, 1.1, 1.1], 0.01);
    // The owner claims, everything above it is a symptom.
    let (d_claimed, d_unclaimed, _) = sim.claims_of("d");
    assert!(d_claimed > 0 && d_unclaimed == 0);
    for s in ["a", "b", "c"] {
        let (claimed, unclaimed, missing) = sim.claims_of(s);
        assert_eq!((claimed, missing), (0, 0), "{s}");
        assert!(unclaimed > 0, "{s}");
    }
    let active = sim.decider.active();
    let find = |c: &str, d: &str| {
        active
            .iter()
            .find(|x| x.edge.caller.as_str() == c && x.edge.callee.as_str() == d)
    };
    assert_eq!(
        find("a", "b").map(|d| d.reason),
        Some(Reason::CalleeUnclaimed)
    );
    assert_eq!(
        find("b", "c").map(|d| d.reason),
        Some(Reason::CalleeUnclaimed)
    );
    // The edge into the owner keeps its retries (at-least-once), metered by the budget.
    assert_eq!(find("c", "d").map(|d| d.reason), Some(Reason::OverBudget));
    assert_eq!(active.len(), 3, "{active:?}");
    // Only c -> d retries now; the storm radius shrank to that one edge.
    let retrying: Vec<String> = sim
        .engine
        .edges()
        .iter()
        .filter(|e| e.retries > 0)
        .map(|e| e.edge.to_string())
        .collect();
    assert_eq!(retrying, vec!["c->d".to_string()]);
    let paths = sim.engine.paths();
    assert_eq!(paths.storm_radius, 1, "{paths:?}");
    // The engine's own figures agree with the simulator's counts.
    let amp: Vec<f64> = paths.depths.iter().map(|d| d.amplification).collect();
    assert_close(&amp, &[1.0, 1.0, 1.0, 1.1, 1.1, 1.1, 1.1], 0.02);
}

#[test]
fn engine_measures_the_storm() {
    let mut sim = Sim::chain(
        &CHAIN,
        2,
        CorrelateConfig::default(),
        DecideConfig::default(),
    );
    sim.run(10, RATE);
    sim.set_fault(3, 1.0);
    sim.run(10, RATE);
    let paths = sim.engine.paths();
    let amp: Vec<f64> = paths.depths.iter().map(|d| d.amplification).collect();
    assert_close(&amp, &[1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0], 0.05);
    assert_eq!(paths.storm_radius, 3, "a->b->c->d retry: {paths:?}");
    assert_eq!(
        paths
            .storm_path
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>(),
        vec!["a", "b", "c", "d"]
    );
    let cd = sim
        .engine
        .edges()
        .into_iter()
        .find(|e| e.edge.to_string() == "c->d")
        .unwrap();
    assert!((cd.attempts_per_request - 2.0).abs() < 1e-9);
    assert!(
        (cd.amplification - 8.0).abs() < 0.05,
        "{}",
        cd.amplification
    );
    assert!(cd.no_jitter, "fixed backoff everywhere");
    let transient = cd
        .retry_success
        .iter()
        .find(|r| r.outcome_class == OutcomeClass::Transient)
        .unwrap();
    assert_eq!(
        transient.succeeded, 0,
        "retrying a sick service never helps"
    );
}

/// Context loss in the middle node: its calls cannot be linked, its claim is missing, the
/// node above still retries it once and stops the storm there: B..D get half the requests
/// they get without ownership (without `--decide-dependency-symptoms`: see the next test).
#[test]
fn context_break_in_the_middle_halves_requests_below() {
    // Ownership only: no budget or amplification decisions.
    let dcfg = DecideConfig {
        retry_budget: 1.0,
        amplification_threshold: 1e9,
        dependency_symptoms: false,
        ..DecideConfig::default()
    };
    let (sim, without, with) = storm(CorrelateConfig::default(), dcfg, |s| {
        if let Some(n) = s.node(2) {
            n.context_break = true;
        }
    });
    assert_close(&without, &[1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0], 1e-9);
    assert_close(&with, &[1.0, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0], 1e-9);
    for (w, o) in with.iter().zip(&without).skip(1) {
        assert!((w / o - 0.5).abs() < 1e-9);
    }
    let (claimed, unclaimed, missing) = sim.claims_of("c");
    assert_eq!((claimed, unclaimed), (0, 0));
    assert!(missing > 0);
    let active = sim.decider.active();
    assert!(
        active
            .iter()
            .all(|d| !(d.edge.caller.as_str() == "b" && d.edge.callee.as_str() == "c")),
        "{active:?}"
    );
}

/// The same context loss, with `--decide-dependency-symptoms` (the default): C's claims are
/// missing, but it fails every request while its calls into D fail with errors D claims, so its
/// errors are taken for D's symptoms and B stops retrying it too: only the edge into the owner
/// retries, and D's load is what error ownership gives a fully linked chain.
#[test]
fn context_break_with_an_owned_failing_dependency_stops_above_it() {
    let dcfg = DecideConfig {
        retry_budget: 1.0,
        amplification_threshold: 1e9,
        ..DecideConfig::default()
    };
    let (sim, without, with) = storm(CorrelateConfig::default(), dcfg, |s| {
        if let Some(n) = s.node(2) {
            n.context_break = true;
        }
    });
    assert_close(&without, &[1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0], 1e-9);
    assert_close(&with, &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0], 1e-9);
    let (claimed, unclaimed, _) = sim.claims_of("c");
    assert_eq!((claimed, unclaimed), (0, 0), "no verdict places C's errors");
    let active = sim.decider.active();
    let b_c = active
        .iter()
        .find(|d| d.edge.caller.as_str() == "b" && d.edge.callee.as_str() == "c")
        .unwrap_or_else(|| panic!("B stops retrying C: {active:?}"));
    assert_eq!(
        b_c.evidence.as_ref().map(|e| e.basis),
        Some(crate::decide::Basis::DependencySymptoms)
    );
}

/// A callee the agent does not observe (no analysis): its claims are missing, and missing
/// never suppresses the retry into it.
#[test]
fn missing_claims_never_suppress_the_first_retry() {
    let dcfg = DecideConfig {
        retry_budget: 1.0,
        amplification_threshold: 1e9,
        ..DecideConfig::default()
    };
    let (sim, _, with) = storm(CorrelateConfig::default(), dcfg, |s| {
        for i in 3..7 {
            if let Some(n) = s.node(i) {
                n.captured = false;
            }
        }
    });
    // c retries d once (2 attempts), nobody above retries.
    assert_close(&with[..4], &[1.0, 1.0, 1.0, 2.0], 1e-9);
    assert!(
        sim.decisions.iter().all(|d| d.edge.caller.as_str() != "c"),
        "{:?}",
        sim.decisions
    );
    // With the default policy the edge may be metered by the budget, never suppressed for
    // ownership.
    let (sim, _, _) = storm(CorrelateConfig::default(), DecideConfig::default(), |s| {
        for i in 3..7 {
            if let Some(n) = s.node(i) {
                n.captured = false;
            }
        }
    });
    assert!(
        sim.decisions
            .iter()
            .filter(|d| d.edge.caller.as_str() == "c")
            .all(|d| d.reason != Reason::CalleeUnclaimed),
        "{:?}",
        sim.decisions
    );
}

/// Coincidental errors: b fails on its own 10% of the time and its fail-open cache fails 10%
/// of the time independently; b's errors stay claimed, so a keeps its retries.
#[test]
fn coincidental_fail_open_errors_do_not_unclaim() {
    let mut nodes = vec![
        Node::new("a", vec![1], 2),
        Node::new("b", vec![2], 1),
        Node::new("cache", vec![], 1),
    ];
    nodes[1].own_fault = 0.1;
    nodes[1].fail_open = vec![2];
    nodes[2].own_fault = 0.1;
    let mut sim = Sim::new(nodes, CorrelateConfig::default(), DecideConfig::default());
    sim.apply_decisions = true;
    sim.run(60, RATE);
    let (claimed, unclaimed, missing) = sim.claims_of("b");
    assert_eq!(missing, 0);
    assert!(claimed > 250, "{claimed}");
    assert!(
        (unclaimed as f64) < 0.02 * claimed as f64,
        "{unclaimed} of {claimed}"
    );
    assert!(
        sim.decisions
            .iter()
            .all(|d| d.reason != Reason::CalleeUnclaimed),
        "{:?}",
        sim.decisions
    );
    let e = sim
        .engine
        .edges()
        .into_iter()
        .find(|e| e.edge.to_string() == "b->cache")
        .unwrap();
    assert_eq!(e.dependency, crate::correlate::DependencyKind::FailOpen);
}
