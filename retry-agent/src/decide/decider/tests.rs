#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use crate::correlate::{ClaimCounts, DependencyKind, ServiceId};
use crate::decide::{Basis, Evidence, Ownership};

const S: u64 = 1_000_000_000;

fn stats(requests: u64, retries: u64, claims: ClaimCounts) -> EdgeStats {
    EdgeStats {
        edge: Edge {
            caller: ServiceId::new("a"),
            callee: ServiceId::new("b"),
        },
        callee_addrs: vec!["127.0.0.1:8080".parse().unwrap()],
        window_seconds: 10.0,
        request_rate: requests as f64 / 10.0,
        requests,
        first_attempts: requests - retries,
        retries,
        failures: claims.total(),
        attempts_per_request: 1.0,
        retry_ratio: if requests == 0 {
            0.0
        } else {
            retries as f64 / requests as f64
        },
        failure_ratio: 0.0,
        recent_requests: 0,
        recent_failures: 0,
        retry_success: vec![],
        callee_claims: claims,
        claim_sources: Default::default(),
        amplification: 1.0,
        baseline_rate: None,
        fault_active: false,
        hedged_retries: 0,
        non_idempotent_retries: 0,
        no_jitter: false,
        timeout_mismatches: 0,
        timeout_mismatches_total: 0,
        requests_total: requests,
        retries_total: retries,
        dependency: DependencyKind::Unknown,
    }
}

fn unclaimed(n: u64) -> ClaimCounts {
    ClaimCounts {
        unclaimed: n,
        ..ClaimCounts::default()
    }
}

#[test]
fn reasons_in_order_of_strength() {
    let d = Decider::new(DecideConfig::default());
    assert_eq!(
        d.condition(&stats(100, 50, unclaimed(10)), false),
        Some(Reason::CalleeUnclaimed)
    );
    assert_eq!(
        d.condition(
            &stats(
                100,
                50,
                ClaimCounts {
                    claimed: 10,
                    ..Default::default()
                }
            ),
            false
        ),
        Some(Reason::OverBudget)
    );
    assert_eq!(
        d.condition(&stats(100, 10, ClaimCounts::default()), false),
        None,
        "10% is within a 10% budget"
    );
    let mut amp = stats(100, 5, ClaimCounts::default());
    amp.amplification = 2.0;
    assert_eq!(
        d.condition(&amp, false),
        None,
        "no fault: no amplification decision"
    );
    amp.fault_active = true;
    assert_eq!(d.condition(&amp, false), Some(Reason::Amplification));
    amp.retries = 0;
    assert_eq!(
        d.condition(&amp, false),
        None,
        "an edge that does not retry has nothing to suppress"
    );
    assert_eq!(
        d.condition(&stats(10, 5, ClaimCounts::default()), false),
        None,
        "too few requests"
    );
    assert_eq!(
        d.condition(
            &stats(
                100,
                0,
                ClaimCounts {
                    missing: 50,
                    ..Default::default()
                }
            ),
            false
        ),
        None,
        "missing claims never suppress"
    );
}

#[test]
fn issue_renew_hold_and_lift_with_hysteresis() {
    let cfg = DecideConfig {
        decision_ttl_ms: 10_000,
        hysteresis_ms: 5_000,
        ..DecideConfig::default()
    };
    let mut d = Decider::new(cfg);
    let bad = [stats(100, 50, unclaimed(10))];
    let first = d.evaluate_edges(&bad, 100 * S);
    assert_eq!(first.len(), 1);
    assert_eq!(
        (first[0].action, first[0].reason, first[0].ttl_ms),
        (Action::SuppressRetries, Reason::CalleeUnclaimed, 10_000)
    );
    assert!(
        d.evaluate_edges(&bad, 101 * S).is_empty(),
        "no change, no news"
    );
    let renewed = d.evaluate_edges(&bad, 105 * S);
    assert_eq!(renewed.len(), 1, "renewed at half the TTL");
    assert_eq!(renewed[0].id, first[0].id);
    assert_eq!(renewed[0].issued_at_ns, 105 * S);
    // Retries at 7%: under the 10% budget but over the exit threshold (5%): still held.
    let mid = [stats(
        100,
        7,
        ClaimCounts {
            claimed: 10,
            ..Default::default()
        },
    )];
    let changed = d.evaluate_edges(&mid, 106 * S);
    assert_eq!(changed.len(), 1);
    assert_eq!(
        changed[0].reason,
        Reason::OverBudget,
        "reason follows the figures"
    );
    let good = [stats(100, 0, ClaimCounts::default())];
    assert!(
        d.evaluate_edges(&good, 107 * S).is_empty(),
        "held through the hysteresis"
    );
    assert_eq!(d.active().len(), 1);
    let lifted = d.evaluate_edges(&good, 112 * S);
    assert_eq!(lifted.len(), 1);
    assert_eq!(lifted[0].action, Action::Allow);
    assert!(d.active().is_empty());
    assert!(d.evaluate_edges(&good, 113 * S).is_empty());
}

#[test]
fn vanished_edges_are_lifted_too() {
    let cfg = DecideConfig {
        hysteresis_ms: 1_000,
        ..DecideConfig::default()
    };
    let mut d = Decider::new(cfg);
    assert_eq!(
        d.evaluate_edges(&[stats(100, 50, unclaimed(10))], S).len(),
        1
    );
    assert!(d.evaluate_edges(&[], S + S / 2).is_empty());
    let lifted = d.evaluate_edges(&[], 3 * S);
    assert_eq!(
        lifted.iter().map(|d| d.action).collect::<Vec<_>>(),
        vec![Action::Allow]
    );
}

#[test]
fn config_validation_reports_every_error() {
    let bad = DecideConfig {
        retry_budget: 2.0,
        amplification_threshold: 0.5,
        exit_fraction: 0.0,
        decision_ttl_ms: 0,
        ..DecideConfig::default()
    };
    assert_eq!(bad.validate().unwrap_err().0.len(), 4);
    assert!(DecideConfig::default().validate().is_ok());
    let too_long = DecideConfig {
        decision_ttl_ms: crate::decide::MAX_TTL_MS + 1,
        ..DecideConfig::default()
    };
    assert_eq!(too_long.validate().unwrap_err().0.len(), 1);
}

// That the defaults are the flag defaults is checked for every config in `settings::tests`.

fn with_sources(mut s: EdgeStats, verdicts: ClaimCounts, header: ClaimCounts) -> EdgeStats {
    s.callee_claims = ClaimCounts {
        claimed: verdicts.claimed + header.claimed,
        unclaimed: verdicts.unclaimed + header.unclaimed,
        missing: verdicts.missing + header.missing,
    };
    s.claim_sources = crate::correlate::ClaimSources {
        verdicts,
        links: crate::correlate::LinkCounts {
            go_uprobes: verdicts.total(),
            ..Default::default()
        },
        header,
    };
    s
}

fn evidence(d: &Decision) -> &Evidence {
    d.evidence
        .as_ref()
        .expect("every decision the decider makes names its evidence")
}

#[test]
fn decisions_name_what_they_rest_on() {
    let mut d = Decider::new(DecideConfig::default());
    let none = ClaimCounts::default();
    // Ownership from our verdicts (linked by the Go uprobes) vs from the callee's header.
    let by_verdicts = with_sources(stats(100, 50, none), unclaimed(8), unclaimed(2));
    let got = d.evaluate_edges(&[by_verdicts], S);
    let ev = evidence(&got[0]);
    assert_eq!(
        (got[0].reason, ev.basis),
        (Reason::CalleeUnclaimed, Basis::Verdicts)
    );
    assert_eq!(
        (ev.callee, ev.retries_within_budget),
        (Ownership::NotOwner, false)
    );
    assert_eq!(
        (ev.sources.links.go_uprobes, ev.sources.header.unclaimed),
        (8, 2)
    );
    assert_eq!((ev.retries, ev.requests, ev.retry_budget), (50, 100, 0.10));
    let mut d = Decider::new(DecideConfig::default());
    let by_header = with_sources(stats(100, 50, none), unclaimed(1), unclaimed(9));
    assert_eq!(
        evidence(&d.evaluate_edges(&[by_header], S)[0]).basis,
        Basis::ClaimHeader
    );
    // Budget capping with no ownership known (every verdict missing) says so.
    let mut d = Decider::new(DecideConfig::default());
    let missing = ClaimCounts {
        missing: 30,
        ..none
    };
    let capped = with_sources(stats(100, 50, none), missing, none);
    let got = d.evaluate_edges(&[capped], S);
    let ev = evidence(&got[0]);
    assert_eq!(
        (got[0].reason, ev.basis, ev.callee),
        (Reason::OverBudget, Basis::Budget, Ownership::Unknown)
    );
    assert!(ev.retries_within_budget);
    assert!(
        ev.summary()
            .starts_with("budget: retries pass up to the budget"),
        "{}",
        ev.summary()
    );
    // Amplification.
    let mut d = Decider::new(DecideConfig::default());
    let mut amp = stats(100, 5, none);
    amp.amplification = 3.0;
    amp.fault_active = true;
    let got = d.evaluate_edges(&[amp], S);
    assert_eq!(evidence(&got[0]).basis, Basis::Amplification);
}

/// The edge into a service known to own its errors keeps its retry (metered by the budget, never
/// stopped), however many of them there are; a tie between claimed and unclaimed is no disowning.
#[test]
fn the_edge_into_a_known_owner_keeps_its_retries_within_budget() {
    let claimed = |n| ClaimCounts {
        claimed: n,
        ..ClaimCounts::default()
    };
    let d = Decider::new(DecideConfig::default());
    for (verdicts, header) in [
        (claimed(40), ClaimCounts::default()),
        (claimed(5), unclaimed(5)),
        (ClaimCounts::default(), claimed(12)),
    ] {
        let e = with_sources(stats(100, 90, ClaimCounts::default()), verdicts, header);
        assert_eq!(
            d.condition(&e, false),
            Some(Reason::OverBudget),
            "{verdicts:?} {header:?}"
        );
        assert_eq!(d.condition(&e, true), Some(Reason::OverBudget), "held, too");
        assert_eq!(d.ownership(&e), Ownership::Owner);
        let ev = d.evidence(&e, Reason::OverBudget);
        assert_eq!(
            (ev.basis, ev.retries_within_budget),
            (Basis::OwnerBudget, true)
        );
    }
    // Under budget: nothing to decide at all.
    let e = with_sources(
        stats(100, 5, ClaimCounts::default()),
        claimed(40),
        ClaimCounts::default(),
    );
    assert_eq!(d.condition(&e, false), None);
}

/// Once the callee turns out to own its errors, a decision that stopped retries turns into one
/// that caps them, at once (same id, new reason and basis); a change of basis alone is news too.
#[test]
fn a_change_of_basis_is_sent_at_once_and_a_lift_repeats_the_evidence() {
    let cfg = DecideConfig {
        hysteresis_ms: 1_000,
        ..DecideConfig::default()
    };
    let mut d = Decider::new(cfg);
    let none = ClaimCounts::default();
    let first = d.evaluate_edges(
        &[with_sources(stats(100, 50, none), unclaimed(10), none)],
        S,
    );
    let owner = ClaimCounts {
        claimed: 30,
        ..none
    };
    let turned = d.evaluate_edges(&[with_sources(stats(100, 50, none), owner, none)], 2 * S);
    assert_eq!(turned.len(), 1);
    assert_eq!(turned[0].id, first[0].id);
    assert_eq!(
        (turned[0].reason, evidence(&turned[0]).basis),
        (Reason::OverBudget, Basis::OwnerBudget)
    );
    // Same reason, ownership lost (all missing now): budget alone.
    let missing = ClaimCounts {
        missing: 30,
        ..none
    };
    let lost = d.evaluate_edges(&[with_sources(stats(100, 50, none), missing, none)], 3 * S);
    assert_eq!(lost.len(), 1);
    assert_eq!(
        (lost[0].reason, evidence(&lost[0]).basis),
        (Reason::OverBudget, Basis::Budget)
    );
    assert!(
        d.evaluate_edges(&[with_sources(stats(100, 50, none), missing, none)], 4 * S)
            .is_empty()
    );
    let lifted = d.evaluate_edges(&[stats(100, 0, none)], 6 * S);
    assert_eq!(lifted[0].action, Action::Allow);
    assert_eq!(
        evidence(&lifted[0]).basis,
        Basis::Budget,
        "the lift says what it lifts"
    );
}

/// A burst evaluation only starts ownership decisions: never a budget cap, never on the edge
/// into an owner, never a renewal or a lift (the tick keeps those).
#[test]
fn a_burst_only_starts_ownership_decisions() {
    let mut d = Decider::new(DecideConfig::default());
    let owner = ClaimCounts {
        claimed: 30,
        ..ClaimCounts::default()
    };
    let edges = [
        stats(100, 90, owner),
        stats(100, 90, ClaimCounts::default()),
    ];
    assert!(
        d.evaluate_burst(&edges, S).is_empty(),
        "budget waits for the tick"
    );
    let mut disowned = stats(100, 50, unclaimed(5));
    disowned.edge.caller = ServiceId::new("z");
    let got = d.evaluate_burst(&[disowned.clone()], S);
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].reason, evidence(&got[0]).basis),
        (Reason::CalleeUnclaimed, Basis::Verdicts)
    );
    assert!(
        d.evaluate_burst(&[disowned], 2 * S).is_empty(),
        "no renewal in a burst"
    );
    // A budget cap in force turns into a stop as soon as the callee disowns its errors.
    let mut capped = stats(100, 50, ClaimCounts::default());
    capped.edge.caller = ServiceId::new("y");
    let cap = d.evaluate_edges(&[capped.clone()], 3 * S);
    assert_eq!(cap.len(), 1);
    assert_eq!(cap[0].reason, Reason::OverBudget);
    capped.callee_claims = unclaimed(6);
    let stop = d.evaluate_burst(&[capped], 3 * S + S / 10);
    assert_eq!(stop.len(), 1);
    assert_eq!(
        (stop[0].id, stop[0].reason),
        (cap[0].id, Reason::CalleeUnclaimed)
    );
    assert!(
        d.evaluate_burst(&[stats(100, 50, unclaimed(4))], S)
            .is_empty(),
        "the minimum of failures holds"
    );
}

/// `caller → callee` figures: `requests` attempts of which `retries` retries and `failures`
/// failed, with the callee's claims on them.
fn edge(caller: &str, callee: &str, failures: u64, claims: ClaimCounts) -> EdgeStats {
    let mut e = stats(100, 50, claims);
    e.edge = Edge {
        caller: ServiceId::new(caller),
        callee: ServiceId::new(callee),
    };
    e.failures = failures;
    e.failure_ratio = failures as f64 / 100.0;
    e
}

fn missing(n: u64) -> ClaimCounts {
    ClaimCounts {
        missing: n,
        ..ClaimCounts::default()
    }
}

fn claimed(n: u64) -> ClaimCounts {
    ClaimCounts {
        claimed: n,
        ..ClaimCounts::default()
    }
}

/// The reason and basis of each edge's decision, by caller.
fn decided(d: &mut Decider, edges: &[EdgeStats]) -> Vec<(String, Reason, Basis)> {
    let mut v: Vec<_> = d
        .evaluate_edges(edges, S)
        .iter()
        .map(|x| (x.edge.caller.to_string(), x.reason, evidence(x).basis))
        .collect();
    v.sort_by(|x, y| x.0.cmp(&y.0));
    v
}

/// a → b → c → d, d failing on its own (its verdicts claim), b and c event loops whose
/// verdicts are all missing under the hard fault: their errors are taken for d's symptoms, so
/// the retries above d stop and the edge into d keeps its budget (at-least-once). Only where
/// the failures are heavy on both sides and the standing below is known.
#[test]
fn callees_that_fail_with_an_owned_dependency_are_symptoms() {
    let chain = |b_fail: u64, c_fail: u64, d_fail: u64, d_claims: ClaimCounts| {
        [
            edge("a", "b", b_fail, missing(b_fail)),
            edge("b", "c", c_fail, missing(c_fail)),
            edge("c", "d", d_fail, d_claims),
        ]
    };
    let stop = (Reason::CalleeUnclaimed, Basis::DependencySymptoms);
    let budget = (Reason::OverBudget, Basis::Budget);
    let owner = (Reason::OverBudget, Basis::OwnerBudget);
    let with = |r: (Reason, Basis), who: &str| (who.to_string(), r.0, r.1);

    let mut d = Decider::new(DecideConfig::default());
    assert_eq!(
        decided(&mut d, &chain(90, 95, 100, claimed(100))),
        vec![with(stop, "a"), with(stop, "b"), with(owner, "c")]
    );
    // Disowned below (d's errors are symptoms of something deeper): owned below c all the same.
    let mut d = Decider::new(DecideConfig::default());
    assert_eq!(
        decided(&mut d, &chain(90, 95, 100, unclaimed(100)))[..2],
        [with(stop, "a"), with(stop, "b")]
    );
    // Off: budgets only.
    let mut d = Decider::new(DecideConfig {
        dependency_symptoms: false,
        ..DecideConfig::default()
    });
    assert_eq!(
        decided(&mut d, &chain(90, 95, 100, claimed(100))),
        vec![with(budget, "a"), with(budget, "b"), with(owner, "c")]
    );
    // d fails a fifth of its calls: c's errors may be its own.
    let mut d = Decider::new(DecideConfig::default());
    assert_eq!(
        decided(&mut d, &chain(90, 95, 20, claimed(20))),
        vec![with(budget, "a"), with(budget, "b"), with(owner, "c")]
    );
    // c fails a third of its requests: no inference for c, nor for b above it.
    let mut d = Decider::new(DecideConfig::default());
    assert_eq!(
        decided(&mut d, &chain(90, 30, 100, claimed(100))),
        vec![with(budget, "a"), with(budget, "b"), with(owner, "c")]
    );
    // Nobody below knows whose the errors are: unknown standings do not explain each other.
    let mut d = Decider::new(DecideConfig::default());
    assert_eq!(
        decided(&mut d, &chain(90, 95, 100, missing(100))),
        vec![with(budget, "a"), with(budget, "b"), with(budget, "c")]
    );
    // C owns its errors by the verdicts on another caller's edge: no inference on this one.
    let mut d = Decider::new(DecideConfig::default());
    let mut edges = chain(90, 95, 100, claimed(100)).to_vec();
    edges.push(edge("x", "c", 90, claimed(90)));
    assert_eq!(
        decided(&mut d, &edges)[..3],
        [with(stop, "a"), with(budget, "b"), with(owner, "c")]
    );
    // A callee without calls of its own (a leaf whose verdicts are missing) is no symptom.
    let mut d = Decider::new(DecideConfig::default());
    assert_eq!(
        decided(&mut d, &[edge("a", "b", 90, missing(90))]),
        vec![with(budget, "a")]
    );
    // The fault's onset: over the window only a third of b's and c's requests failed (its
    // healthy seconds are still in it), but over the last seconds nearly all did.
    let onset = |recent: u64| {
        let mut edges = chain(30, 33, 35, claimed(35));
        for e in &mut edges {
            (e.recent_requests, e.recent_failures) = (40, recent);
        }
        edges
    };
    let mut d = Decider::new(DecideConfig::default());
    assert_eq!(
        decided(&mut d, &onset(38))[..2],
        [with(stop, "a"), with(stop, "b")]
    );
    // Not when the last seconds fail less than half.
    let mut d = Decider::new(DecideConfig::default());
    assert_eq!(
        decided(&mut d, &onset(15))[..2],
        [with(budget, "a"), with(budget, "b")]
    );
}
