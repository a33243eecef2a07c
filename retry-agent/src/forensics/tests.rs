//! Forensics on dumps: the replay uses the live run's settings, and the report tells the story
//! of a hand-made incident.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::path::PathBuf;

use bytes::Bytes;

use super::*;
use crate::{
    capture::{Direction, Event, Role},
    correlate::{ClaimCounts, CorrelateConfig, Edge, ServiceId},
    decide::{Action, Basis, DecideConfig, Decision, Evidence, Ownership, Reason},
    l7::L7Config,
    pipeline::{Pipeline, StageOutput},
    recorder::{DumpHeader, DumpReason, DumpWriter, Recorder, RecorderConfig, SharedRecorder},
    testkit::{StormScenario, temp_dir},
};

const S: u64 = 1_000_000_000;

fn cfg(dir: PathBuf) -> RecorderConfig {
    RecorderConfig {
        dump_dir: dir,
        // The whole synthetic storm fits (the default budget's ring evicts its start).
        max_mib: 64,
        ..RecorderConfig::default()
    }
}

fn decision(ts: u64) -> Decision {
    Decision {
        issued_at_ns: ts,
        ..crate::testkit::decision(
            "a",
            "b",
            Action::SuppressRetries,
            Reason::CalleeUnclaimed,
            1000,
        )
    }
}

/// A live agent run with non-default settings: the dump carries them and forensics replays with
/// them (the same verdicts and decisions), unless told to use its own flags.
#[test]
fn forensics_replays_with_the_live_pipelines_settings() {
    let dir = temp_dir("replay-config");
    let rec = SharedRecorder::new(
        Recorder::new(RecorderConfig {
            auto_dump: false,
            ..cfg(dir.clone())
        })
        .unwrap(),
    );
    // Decisions only at a 10x arrival rate and a 90% retry ratio: the default settings decide
    // differently on the same storm.
    let decide = DecideConfig {
        amplification_threshold: 10.0,
        retry_budget: 0.9,
        ..DecideConfig::default()
    };
    let mut live = Pipeline::new(L7Config::default(), CorrelateConfig::default(), decide)
        .with_tap(rec.clone());
    let mut out = StageOutput::default();
    for ev in &StormScenario::default().events() {
        live.push(ev, &mut out);
    }
    let path = rec.with(|r| r.dump(DumpReason::OnDemand)).unwrap().unwrap();
    let opts = |override_settings: bool| Options {
        override_settings,
        ..Options::default()
    };
    let faithful = analyse(&path, &opts(false)).unwrap();
    let check = faithful.replay_check.clone().expect("a replay check");
    assert!(check.decisions_equal && check.verdicts_equal, "{check:?}");
    let what_if = analyse(&path, &opts(true)).unwrap();
    let check = what_if.replay_check.clone().expect("a replay check");
    assert!(
        !check.decisions_equal,
        "default settings decide differently: {check:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A dump cut mid-storm (the live run goes on) holds failed requests still waiting for their
/// verdict; the replay judges them at the end, and the check compares only what the live run
/// had judged by then: equal, with the rest counted.
#[test]
fn a_dump_cut_mid_storm_replays_equal_with_the_pending_counted() {
    let dir = temp_dir("replay-cut");
    let rec = SharedRecorder::new(
        Recorder::new(RecorderConfig {
            auto_dump: false,
            ..cfg(dir.clone())
        })
        .unwrap(),
    );
    let mut live = Pipeline::new(
        L7Config::default(),
        CorrelateConfig::default(),
        DecideConfig::default(),
    )
    .with_tap(rec.clone());
    let mut out = StageOutput::default();
    let events = StormScenario::default().events();
    // db fails from 11 s on: stop a few seconds into the storm, mid-flight.
    for ev in events.iter().take_while(|e| e.ts_ns() < 14_000_000_000) {
        live.push(ev, &mut out);
    }
    let path = rec.with(|r| r.dump(DumpReason::OnDemand)).unwrap().unwrap();
    let report = analyse(&path, &Options::default()).unwrap();
    let check = report.replay_check.clone().expect("a replay check");
    assert!(check.judged_at_end > 0, "nothing was pending: {check:?}");
    assert!(
        check.verdicts_equal && check.decisions_equal && check.edge_snapshots_equal,
        "{check:?}"
    );
    assert_eq!(
        check.replayed_verdicts,
        check.recorded_verdicts + check.judged_at_end
    );
    let _ = std::fs::remove_dir_all(dir);
}

mod report {
    use super::*;
    use crate::{
        correlate::{ClaimCounts, DependencyKind, EdgeStats, PathStats, Verdict},
        l7::{Claim, OutcomeClass},
    };

    fn edge(caller: &str, callee: &str, port: u16, amp: f64, fault: bool) -> EdgeStats {
        EdgeStats {
            edge: Edge {
                caller: ServiceId::new(caller),
                callee: ServiceId::new(callee),
            },
            callee_addrs: vec![std::net::SocketAddr::from(([127, 0, 0, 1], port))],
            window_seconds: 10.0,
            request_rate: 100.0 * amp,
            requests: 1000,
            first_attempts: 500,
            retries: 500,
            failures: if fault { 900 } else { 0 },
            attempts_per_request: if fault { 2.0 } else { 1.0 },
            retry_ratio: 0.5,
            failure_ratio: if fault { 0.9 } else { 0.0 },
            recent_requests: 0,
            recent_failures: 0,
            retry_success: vec![],
            callee_claims: ClaimCounts::default(),
            claim_sources: Default::default(),
            amplification: amp,
            baseline_rate: Some(100.0),
            fault_active: fault,
            hedged_retries: 0,
            non_idempotent_retries: 3,
            no_jitter: false,
            timeout_mismatches: 0,
            timeout_mismatches_total: 2,
            requests_total: 5000,
            retries_total: 800,
            dependency: DependencyKind::FailClose,
        }
    }

    fn verdict(svc: &str, claim: Claim, ts: u64) -> Record {
        Record::Verdict(Verdict {
            exchange: crate::l7::ExchangeId(ts),
            service: ServiceId::new(svc),
            caller: None,
            claim,
            outcome: OutcomeClass::Transient,
            status: Some(503),
            caused_by: vec![],
            ts_ns: ts,
            link: Default::default(),
        })
    }

    /// A dump whose derived records are hand-made (independent of the l7/correlate logic).
    fn incident_dump(dir: &std::path::Path) -> PathBuf {
        let mut records: Vec<Record> = StormScenario {
            requests: 10,
            ..Default::default()
        }
        .events()
        .into_iter()
        .map(Record::Event)
        .collect();
        // The shim answered one retry of api → db locally.
        if let Event::Data(mut d) = records
            .iter()
            .find_map(|r| match r {
                Record::Event(Event::Data(d))
                    if d.pid == 200
                        && d.direction == Direction::Ingress
                        && d.role == Role::Client =>
                {
                    Some(Event::Data(d.clone()))
                }
                _ => None,
            })
            .unwrap()
        {
            d.payload = Bytes::from_static(b"HTTP/1.1 503 Service Unavailable\r\nx-retry-suppressed: 1\r\nContent-Length: 0\r\n\r\n");
            d.ts_exit_ns = 40 * S;
            records.push(Record::Event(Event::Data(d)));
        }
        for t in 0..60u64 {
            let fault = (20..40).contains(&t);
            let amp = if fault { 4.0 } else { 1.0 };
            let paths = PathStats {
                storm_radius: if fault { 2 } else { 0 },
                storm_path: if fault {
                    vec![
                        ServiceId::new("frontend"),
                        ServiceId::new("api"),
                        ServiceId::new("db"),
                    ]
                } else {
                    vec![]
                },
                fault_active: fault,
                ..PathStats::default()
            };
            records.push(Record::Edges(EdgeSnapshot {
                ts_ns: t * S,
                edges: vec![
                    edge("api", "db", 9090, amp, fault),
                    edge(
                        "frontend",
                        "api",
                        8080,
                        if fault { 2.0 } else { 1.0 },
                        false,
                    ),
                ],
                paths,
            }));
        }
        records.push(verdict("db", Claim::Claimed, 21 * S));
        records.push(verdict("api", Claim::Unclaimed, 22 * S));
        records.push(verdict("db", Claim::Claimed, 23 * S));
        let mut d = decision(25 * S);
        d.edge = Edge {
            caller: ServiceId::new("frontend"),
            callee: ServiceId::new("api"),
        };
        d.evidence = Some(evidence(Basis::Verdicts, Ownership::NotOwner, false));
        records.push(Record::Decision(d.clone()));
        // The edge into the owner: capped by the budget, not stopped.
        records.push(Record::Decision(Decision {
            id: 3,
            edge: Edge {
                caller: ServiceId::new("api"),
                callee: ServiceId::new("db"),
            },
            reason: Reason::OverBudget,
            issued_at_ns: 26 * S,
            evidence: Some(evidence(Basis::OwnerBudget, Ownership::Owner, true)),
            ..d.clone()
        }));
        records.push(Record::Decision(Decision {
            issued_at_ns: 30 * S,
            ..d.clone()
        })); // renewal
        records.push(Record::Decision(Decision {
            id: 2,
            action: Action::Allow,
            issued_at_ns: 55 * S,
            ..d
        }));
        super::write_dump(&dir.join("incident.radump"), 60 * S, &records)
    }

    #[test]
    fn report_tells_the_story_of_the_incident() {
        let dir = temp_dir("forensics");
        let path = incident_dump(&dir);
        let r = super::recorded_report(&path);
        let kinds: Vec<(TimelineKind, u64)> =
            r.timeline.iter().map(|t| (t.kind, t.ts_ns / S)).collect();
        assert_eq!(
            kinds,
            vec![
                (TimelineKind::FaultOnset, 20),
                (TimelineKind::FirstUnclaimedError, 22),
                (TimelineKind::StormDetected, 25),
                (TimelineKind::Suppress, 25),
                (TimelineKind::Suppress, 26),
                (TimelineKind::Recovery, 40),
                (TimelineKind::Allow, 55),
            ]
        );
        assert_eq!(r.owners.len(), 1);
        assert_eq!(r.owners[0].service.as_str(), "db");
        assert_eq!(r.owners[0].claimed_errors, 2);
        assert_eq!(r.edges[0].edge, "api->db");
        assert_eq!(r.edges[0].peak_amplification, 4.0);
        // Times are relative to the first timed record (the scenario starts at 1 s).
        assert_eq!(r.edges[0].peak_at_s, 19.0);
        assert_eq!(r.edges[0].series.len(), 60);
        assert_eq!(r.storm_radius_max, 2);
        assert_eq!(r.retries_suppressed, 1);
        // The suppressed retry was on api → db, db is the owner: it would have been one request.
        assert_eq!(r.counterfactual_requests, 1.0);
        assert_eq!(r.timeout_mismatches, 4);
        assert_eq!(r.non_idempotent_retries, 6);
        let text = render_text(&r);
        assert!(
            text.contains("storm detected") && text.contains("api->db"),
            "{text}"
        );
        // Ownership and budget capping read apart, each with what it rests on.
        let rows: Vec<_> = r
            .decisions
            .iter()
            .map(|d| {
                (
                    d.id,
                    d.edge.as_str(),
                    d.basis,
                    d.retries_within_budget,
                    d.lifted_s,
                )
            })
            .collect();
        assert_eq!(
            rows,
            vec![
                (1, "frontend->api", Some(Basis::Verdicts), false, Some(54.0)),
                (3, "api->db", Some(Basis::OwnerBudget), true, None),
            ]
        );
        assert_eq!(
            r.decisions[0].issued_s, 24.0,
            "first issue, not the renewal"
        );
        let row = |id: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(id))
                .unwrap_or_default()
        };
        assert!(
            row("#1").contains("verdicts") && row("#1").contains("retries stop"),
            "{text}"
        );
        assert!(
            row("#3").contains("owner_budget")
                && row("#3").contains("retries pass up to the budget"),
            "{text}"
        );
        assert!(text.contains("callee owner (claimed 9"), "{text}");
        assert!(text.contains("verdicts linked by: unlinked 3"), "{text}");
        let html = render_html(&r);
        assert!(
            html.starts_with("<!doctype html>")
                && html.contains("<polyline")
                && !html.contains("<script")
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn evidence(basis: Basis, callee: Ownership, within_budget: bool) -> Evidence {
    let claimed = if callee == Ownership::Owner { 9 } else { 0 };
    Evidence {
        basis,
        callee,
        claims: ClaimCounts {
            claimed,
            unclaimed: 9 - claimed,
            missing: 0,
        },
        sources: Default::default(),
        dependency: crate::correlate::DependencyKind::FailClose,
        requests: 100,
        retries: 40,
        retry_ratio: 0.4,
        retry_budget: 0.1,
        amplification: 2.0,
        amplification_threshold: 1.5,
        fault_active: true,
        retries_within_budget: within_budget,
    }
}

/// An exchange whose outcome capture did not see (unknown, no status: a header block of a
/// connection older than the capture) is no failure of the report: neither its first failure
/// nor one of its failed exchanges.
#[test]
fn an_unseen_outcome_is_not_the_first_failure() {
    let dir = temp_dir("forensics-unseen");
    let a: std::net::SocketAddr = "127.0.0.1:1000".parse().unwrap();
    let x = |id: u64, t: u64| crate::testkit::ExchangeBuilder::server(id, 1, 1, a, a, t, t + 1);
    let mut unseen = x(1, 5 * S).build();
    (unseen.unknown, unseen.status) = (true, None);
    unseen.outcome = crate::l7::OutcomeClass::Unknown;
    let seen = x(2, 8 * S).status(503).build();
    let records = [unseen, seen].map(|x| Record::Exchange(Box::new(x)));
    let r = recorded_report(&write_dump(&dir.join("unseen.radump"), 10 * S, &records));
    let first = r
        .timeline
        .iter()
        .find(|t| t.kind == TimelineKind::FirstFailure)
        .map(|t| t.detail.as_str());
    assert_eq!(
        first,
        Some("503 /work at 127.0.0.1:1000"),
        "{:?}",
        r.timeline
    );
    assert_eq!(r.failed_exchanges, 1);
}

/// `records` written as a dump at `path` (its directory made), covering 0..`to_ns`.
fn write_dump(path: &std::path::Path, to_ns: u64, records: &[Record]) -> PathBuf {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    let header = DumpHeader::new(DumpReason::OnDemand, RecorderConfig::default(), 0, to_ns);
    let file = std::fs::File::create(path).unwrap();
    let mut w = DumpWriter::new(std::io::BufWriter::new(file), &header).unwrap();
    for r in records {
        w.push(r).unwrap();
    }
    std::io::Write::flush(&mut w.finish().unwrap()).unwrap();
    path.to_path_buf()
}

/// The report of the dump at `path`, from its recorded exchanges and verdicts (no replay).
fn recorded_report(path: &std::path::Path) -> IncidentReport {
    analyse(
        path,
        &Options {
            recorded: true,
            ..Options::default()
        },
    )
    .unwrap()
}
