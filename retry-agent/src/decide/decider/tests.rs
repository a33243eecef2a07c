#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use crate::correlate::{ClaimCounts, DependencyKind, ServiceId};

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
        retry_success: vec![],
        callee_claims: claims,
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
