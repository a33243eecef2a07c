#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use crate::correlate::{ClaimCounts, DependencyKind, Edge, RetrySuccess, ServiceId};

fn edge_stats(caller: &str, callee: &str, requests: u64, retries: u64) -> EdgeStats {
    EdgeStats {
        edge: Edge {
            caller: ServiceId::new(caller),
            callee: ServiceId::new(callee),
        },
        callee_addrs: vec![],
        window_seconds: 10.0,
        request_rate: requests as f64 / 10.0,
        requests,
        first_attempts: requests - retries,
        retries,
        failures: 0,
        attempts_per_request: 1.0,
        retry_ratio: retries as f64 / requests as f64,
        failure_ratio: 0.0,
        recent_requests: 0,
        recent_failures: 0,
        retry_success: vec![RetrySuccess {
            outcome_class: OutcomeClass::Transient,
            retries,
            succeeded: retries / 2,
            ratio: 0.5,
        }],
        callee_claims: ClaimCounts::default(),
        claim_sources: Default::default(),
        amplification: 2.0,
        baseline_rate: Some(requests as f64 / 20.0),
        fault_active: true,
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

#[test]
fn names_units_and_overflow_label() {
    let m = Metrics::with_max_edge_labels(2);
    let edges = vec![
        edge_stats("a", "b", 100, 50),
        edge_stats("b", "c", 90, 10),
        edge_stats("c", "d", 10, 2),
        edge_stats("d", "e", 10, 4),
    ];
    m.observe_edges(&edges);
    let mut s = EngineStats::default();
    s.verdicts.add(crate::l7::Claim::Unclaimed);
    s.timeout_mismatches = 3;
    s.sole_links = 4;
    s.trace_links = 5;
    m.observe_engine(&s);
    m.observe_capture(1000, 7);
    m.observe_tls(2);
    m.observe_go((3, 1), (1, 1));
    let text = m.encode();
    assert!(
        text.contains(
            r#"retry_agent_retry_ratio{caller="a",caller_namespace="",callee="b",callee_namespace=""} 0.5"#
        ),
        "{text}"
    );
    // The two smallest edges share "other": 6 retries of 20 requests.
    assert!(
        text.contains(
            r#"retry_agent_retry_ratio{caller="other",caller_namespace="",callee="other",callee_namespace=""} 0.3"#
        ),
        "{text}"
    );
    assert!(!text.contains(r#"callee="d""#), "{text}");
    assert!(
        text.contains(r#"retry_agent_verdicts_total{claim="unclaimed"} 1"#),
        "{text}"
    );
    assert!(
        text.contains("retry_agent_timeout_mismatch_total 3"),
        "{text}"
    );
    assert!(text.contains("retry_agent_capture_drops_total 7"), "{text}");
    assert!(
        text.contains(r#"retry_agent_correlate_links_total{method="sole_inbound"} 4"#),
        "{text}"
    );
    assert!(
        text.contains(r#"retry_agent_correlate_links_total{method="trace_header"} 5"#),
        "{text}"
    );
    assert!(text.contains("retry_agent_tls_libraries 2"), "{text}");
    assert!(text.contains("retry_agent_go_programs 3"), "{text}");
    assert!(text.contains("retry_agent_go_programs_failed 1"), "{text}");
    assert!(text.contains("retry_agent_go_grpc_programs 1"), "{text}");
    assert!(
        text.contains("retry_agent_go_grpc_programs_unlinked 1"),
        "{text}"
    );
    assert!(
        text.contains(r#"retry_agent_retry_success_ratio{outcome_class="transient"} 0.5"#),
        "{text}"
    );
    // Gauges never carry _total.
    assert!(!text.contains("retry_ratio_total"), "{text}");
}

/// The recorder's ring: evictions counted, and what it holds in bytes and in time.
#[test]
fn the_recorder_says_what_it_holds() {
    let m = Metrics::new();
    m.observe_recorder(&crate::recorder::RecorderStats {
        records_in_ring: 10,
        bytes_in_ring: 4096,
        bytes_held_by_dumps: 65536,
        evicted_age_total: 2,
        evicted_size_total: 3,
        oldest_ns: 1_000_000_000,
        newest_ns: 3_500_000_000,
        ..Default::default()
    });
    let text = m.encode();
    for want in [
        "retry_agent_recorder_evictions_total 5",
        "retry_agent_recorder_bytes 4096",
        "retry_agent_recorder_held_bytes 65536",
        "retry_agent_recorder_history_seconds 2.5",
        "# UNIT retry_agent_recorder_history_seconds seconds",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    // An empty ring reaches back nowhere, whatever its last record's time.
    m.observe_recorder(&crate::recorder::RecorderStats {
        newest_ns: 3_500_000_000,
        ..Default::default()
    });
    assert!(
        m.encode()
            .contains("retry_agent_recorder_history_seconds 0.0")
    );
}

#[test]
fn programs_the_capture_runs_without_are_named() {
    let m = Metrics::new();
    assert!(!m.encode().contains("retry_agent_capture_programs_missing{"));
    let gap = |program: &str, reason| crate::capture::Gap {
        program: program.into(),
        tracepoint: String::new(),
        reason,
        detail: String::new(),
    };
    m.observe_gaps(&[
        gap("ra_exit_readv", crate::capture::GapReason::Jit),
        gap("ra_enter_dup2", crate::capture::GapReason::NoTracepoint),
    ]);
    let text = m.encode();
    for want in [
        r#"retry_agent_capture_programs_missing{program="ra_exit_readv",reason="jit"} 1"#,
        r#"retry_agent_capture_programs_missing{program="ra_enter_dup2",reason="no_tracepoint"} 1"#,
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
}

#[test]
fn counters_never_go_backwards() {
    let m = Metrics::new();
    m.observe_capture(10, 5);
    m.observe_capture(3, 1);
    let text = m.encode();
    assert!(
        text.contains("retry_agent_capture_events_total 10"),
        "{text}"
    );
    assert!(text.contains("retry_agent_capture_drops_total 5"), "{text}");
}

/// Decisions count by what they rest on, so budget capping and ownership read apart.
#[test]
fn decisions_are_labelled_by_their_basis() {
    let m = Metrics::new();
    let mut d = crate::decide::Decider::new(crate::decide::DecideConfig::default());
    let mut capped = edge_stats("a", "b", 100, 50);
    capped.callee_claims.missing = 30;
    let issued = d.evaluate_edges(&[capped], 1_000_000_000);
    m.observe_decisions(&issued, 1);
    let text = m.encode();
    assert!(
        text.contains(
            r#"retry_agent_decisions_total{action="suppress_retries",reason="over_budget",basis="budget"} 1"#
        ),
        "{text}"
    );
}

/// Workload names split into the service and its namespace, so a dashboard can sum by
/// namespace; a `comm:port` service has an empty namespace.
#[test]
fn edge_labels_carry_the_namespaces_of_workloads() {
    let m = Metrics::new();
    m.observe_edges(&[edge_stats("shop/checkout", "python3:8080", 10, 5)]);
    let text = m.encode();
    assert!(
        text.contains(
            r#"retry_agent_retry_ratio{caller="shop/checkout",caller_namespace="shop",callee="python3:8080",callee_namespace=""} 0.5"#
        ),
        "{text}"
    );
    assert_eq!(ServiceId::new("team-a/web-a").namespace(), Some("team-a"));
    assert_eq!(
        ServiceId::new("node:8080@netns:4026532001").namespace(),
        None
    );
    assert_eq!(ServiceId::new("/x").namespace(), None);
}

/// The dispatcher's per-actuator totals, one series per outcome, so a failing or saturated
/// actuator shows on a dashboard rather than only in its log.
#[test]
fn actuator_outcomes_are_counted_per_actuator() {
    let m = Metrics::new();
    let stats = |ok, failed, dropped| crate::actuate::ActuatorStats {
        name: "haproxy",
        ok,
        failed,
        dropped,
        last_error: None,
    };
    m.observe_actuators(&[stats(3, 1, 0)]);
    m.observe_actuators(&[stats(5, 1, 2)]);
    let text = m.encode();
    for line in [
        r#"retry_agent_actuator_operations_total{actuator="haproxy",outcome="ok"} 5"#,
        r#"retry_agent_actuator_operations_total{actuator="haproxy",outcome="failed"} 1"#,
        r#"retry_agent_actuator_operations_total{actuator="haproxy",outcome="dropped"} 2"#,
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}
