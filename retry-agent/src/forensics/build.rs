//! The incident report, built in named steps from the recorded events (service names, answers
//! the shim gave) and the derived streams: the clock, the timeline, the owners, the edge figures
//! over time, and the retries the shim suppressed.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{
    DecisionRow, Derived, DumpSummary, EdgeRow, IncidentReport, OwnerRow, Source, TimelineEntry,
    TimelineKind,
};
use crate::{
    capture::{Direction, Event, Role},
    correlate::{Edge, EdgeStats, ServiceId, Verdict},
    decide::{Action, Decision},
    l7::{Claim, Exchange},
    pipeline::{EdgeSnapshot, Record},
    recorder::{DumpHeader, Loss},
};

/// Build the report from recorded events and the derived streams.
pub(super) fn build(
    records: &[Record],
    d: &Derived,
    header: Option<&DumpHeader>,
    source: Source,
) -> IncidentReport {
    let events: Vec<&Event> = records
        .iter()
        .filter_map(|r| {
            if let Record::Event(e) = r {
                Some(e)
            } else {
                None
            }
        })
        .collect();
    let clock = Clock::new(records, header);
    let timeline = timeline(d, &clock);
    let (verdicts, owners) = owners(&d.verdicts);
    let figures = edge_figures(&d.snapshots, &clock);
    let edges = figures.rows;

    // Non-idempotent retries also straight from the exchanges (when edge figures are missing).
    let nonidem_x = d
        .exchanges
        .iter()
        .filter(|x| x.retry_markers.says_retry() && !x.idempotent && x.role == Role::Client)
        .count() as u64;
    let non_idempotent_retries = edges
        .iter()
        .map(|e| e.non_idempotent_retries)
        .sum::<u64>()
        .max(nonidem_x);
    let timeout_mismatches = edges.iter().map(|e| e.timeout_mismatches).sum();
    let (retries_suppressed, counterfactual) =
        suppressed(&events, &d.exchanges, &figures.last, &owners);

    IncidentReport {
        dump: DumpSummary {
            path: String::new(),
            node: header.map(|h| h.node.clone()),
            kernel: header.map(|h| h.kernel.clone()),
            agent_version: header.map(|h| h.agent_version.clone()),
            reason: header.map(|h| h.reason.clone()),
            from_ns: header.map_or(clock.t0, |h| h.from_ns),
            to_ns: header.map_or(0, |h| h.to_ns),
            records: records.len(),
            events: events.len(),
            loss: Loss::default(),
            loss_text: String::new(),
        },
        source,
        replay_check: None,
        // A summary stands for its weight, a tally for the exchanges it counted.
        exchanges: d.exchanges.iter().map(|x| u64::from(x.weight)).sum(),
        failed_exchanges: d.exchanges.iter().filter(|x| x.failure_seen()).count() as u64,
        verdict_links: verdict_links(&d.verdicts),
        verdicts,
        timeline,
        owners,
        decisions: decision_rows(&d.decisions, &clock),
        edges,
        storm_radius_max: figures.radius.0,
        storm_path: figures.radius.1,
        retries_suppressed,
        counterfactual_requests: counterfactual,
        timeout_mismatches,
        non_idempotent_retries,
        notes: Vec::new(),
    }
}

/// Report time: seconds since the first timed record, and wall time when the header maps it.
struct Clock<'a> {
    t0: u64,
    header: Option<&'a DumpHeader>,
}

impl<'a> Clock<'a> {
    fn new(records: &[Record], header: Option<&'a DumpHeader>) -> Self {
        Clock {
            t0: records
                .iter()
                .map(Record::ts_ns)
                .filter(|&t| t > 0)
                .min()
                .unwrap_or(0),
            header,
        }
    }

    fn t_s(&self, ts: u64) -> f64 {
        ts.saturating_sub(self.t0) as f64 / 1e9
    }

    fn entry(&self, ts: u64, kind: TimelineKind, detail: String) -> TimelineEntry {
        TimelineEntry {
            ts_ns: ts,
            t_s: self.t_s(ts),
            wall_ms: self.header.map(|h| h.wall_ms(ts)),
            kind,
            detail,
        }
    }
}

/// The story in order: first failure, fault onset and recovery, the first error a service did
/// not own, and the decisions taken.
fn timeline(d: &Derived, clock: &Clock<'_>) -> Vec<TimelineEntry> {
    let mut t = Vec::new();
    let first_fail = d
        .exchanges
        .iter()
        .filter(|x| x.failure_seen())
        .min_by_key(|x| x.end_ns());
    if let Some(x) = first_fail {
        t.push(clock.entry(x.end_ns(), TimelineKind::FirstFailure, failure_detail(x)));
    }
    t.extend(fault_and_recovery(d, first_fail.is_some(), clock));
    if let Some(v) = d
        .verdicts
        .iter()
        .filter(|v| v.claim == Claim::Unclaimed)
        .min_by_key(|v| v.ts_ns)
    {
        t.push(clock.entry(
            v.ts_ns,
            TimelineKind::FirstUnclaimedError,
            unclaimed_detail(v),
        ));
    }
    t.extend(decisions(&d.decisions, clock));
    t.sort_by(|a, b| a.ts_ns.cmp(&b.ts_ns).then(a.kind.cmp(&b.kind)));
    t
}

/// "503 /path at 10.0.0.1:80": what failed, where (the failing service's address: the local end
/// of a server-side exchange).
fn failure_detail(x: &Exchange) -> String {
    let at = if x.role == Role::Server {
        x.local
    } else {
        x.remote
    };
    format!(
        "{} {} at {}",
        x.status
            .map_or_else(|| x.outcome.to_string(), |s| s.to_string()),
        x.path.as_deref().unwrap_or("-"),
        at.map_or_else(|| "?".into(), |a| a.to_string())
    )
}

fn unclaimed_detail(v: &Verdict) -> String {
    let cause = v.caused_by.first().map_or_else(String::new, |c| {
        format!(" (caused by {} {})", c.callee, c.outcome)
    });
    format!("{} returned an error it does not own{cause}", v.service)
}

/// Fault onset from the edge figures and the recovery after it; without figures, recovery is
/// the first success after the last failure.
fn fault_and_recovery(d: &Derived, any_failure: bool, clock: &Clock<'_>) -> Vec<TimelineEntry> {
    let mut t = Vec::new();
    let in_fault =
        |s: &EdgeSnapshot| s.paths.fault_active || s.edges.iter().any(|e| e.fault_active);
    if let Some(s) = d.snapshots.iter().find(|s| in_fault(s)) {
        let e = s
            .edges
            .iter()
            .filter(|e| e.fault_active)
            .max_by(|a, b| a.failure_ratio.total_cmp(&b.failure_ratio));
        let detail = e.map_or_else(
            || "fault active".into(),
            |e| format!("{} failure ratio {:.0}%", e.edge, e.failure_ratio * 100.0),
        );
        t.push(clock.entry(s.ts_ns, TimelineKind::FaultOnset, detail));
        if let Some(r) = d
            .snapshots
            .iter()
            .find(|r| r.ts_ns > s.ts_ns && !in_fault(r))
        {
            t.push(clock.entry(
                r.ts_ns,
                TimelineKind::Recovery,
                "no edge in fault any more".into(),
            ));
        }
    } else if let (true, Some(last)) = (
        any_failure,
        d.exchanges
            .iter()
            .filter(|x| x.failure_seen())
            .max_by_key(|x| x.end_ns()),
    ) && let Some(ok) = d
        .exchanges
        .iter()
        // A tally's time is when the kernel sent its count, not when they went well.
        .filter(|x| !x.failed() && !x.tally && x.end_ns() > last.end_ns())
        .min_by_key(|x| x.end_ns())
    {
        t.push(clock.entry(
            ok.end_ns(),
            TimelineKind::Recovery,
            "first success after the last failure".into(),
        ));
    }
    t
}

/// Each decision once (renewals are left out), the first suppression also as the storm's start.
fn decisions(ds: &[Decision], clock: &Clock<'_>) -> Vec<TimelineEntry> {
    let mut t = Vec::new();
    let mut seen_ids = BTreeSet::new();
    let mut storm = false;
    for dec in ds {
        if !seen_ids.insert((dec.id, dec.action == Action::Allow)) {
            continue; // renewal of a decision already on the timeline
        }
        match dec.action {
            Action::SuppressRetries => {
                if !storm {
                    storm = true;
                    t.push(clock.entry(
                        dec.issued_at_ns,
                        TimelineKind::StormDetected,
                        format!("on {} ({})", dec.edge, dec.reason),
                    ));
                }
                let basis = dec
                    .evidence
                    .as_ref()
                    .map_or_else(String::new, |e| format!(", basis {}", e.basis));
                let detail = format!(
                    "suppress retries on {} ({}{basis}, ttl {} ms)",
                    dec.edge, dec.reason, dec.ttl_ms
                );
                t.push(clock.entry(dec.issued_at_ns, TimelineKind::Suppress, detail));
            }
            Action::Allow => t.push(clock.entry(
                dec.issued_at_ns,
                TimelineKind::Allow,
                format!("allow retries on {} again", dec.edge),
            )),
        }
    }
    t
}

/// Each suppression once, with the evidence of its last issue or renewal and when it was lifted.
fn decision_rows(ds: &[Decision], clock: &Clock<'_>) -> Vec<DecisionRow> {
    let mut rows: Vec<DecisionRow> = Vec::new();
    for dec in ds {
        match dec.action {
            Action::SuppressRetries => {
                let row = DecisionRow {
                    id: dec.id,
                    edge: dec.edge.to_string(),
                    issued_s: clock.t_s(dec.issued_at_ns),
                    reason: dec.reason,
                    basis: dec.evidence.as_ref().map(|e| e.basis),
                    retries_within_budget: dec.reason != crate::decide::Reason::CalleeUnclaimed,
                    evidence: dec.evidence.clone(),
                    lifted_s: None,
                };
                match rows.iter_mut().find(|r| r.id == dec.id) {
                    Some(r) => {
                        *r = DecisionRow {
                            issued_s: r.issued_s,
                            ..row
                        }
                    }
                    None => rows.push(row),
                }
            }
            // A lift has its own id; it lifts the edge's open suppression.
            Action::Allow => {
                let edge = dec.edge.to_string();
                if let Some(r) = rows
                    .iter_mut()
                    .rev()
                    .find(|r| r.edge == edge && r.lifted_s.is_none())
                {
                    r.lifted_s = Some(clock.t_s(dec.issued_at_ns));
                }
            }
        }
    }
    rows
}

fn verdict_links(vs: &[Verdict]) -> BTreeMap<String, u64> {
    let mut by: BTreeMap<String, u64> = BTreeMap::new();
    for v in vs {
        *by.entry(v.link.as_str().to_string()).or_default() += 1;
    }
    by
}

/// Verdict counts by claim, and the services that owned errors, most errors first.
fn owners(vs: &[Verdict]) -> (BTreeMap<String, u64>, Vec<OwnerRow>) {
    let mut owners: BTreeMap<ServiceId, OwnerRow> = BTreeMap::new();
    let mut verdicts: BTreeMap<String, u64> = BTreeMap::new();
    for v in vs {
        *verdicts.entry(v.claim.as_str().to_string()).or_default() += 1;
        let row = owners.entry(v.service.clone()).or_insert(OwnerRow {
            service: v.service.clone(),
            claimed_errors: 0,
            unclaimed_errors: 0,
            first_claimed_ns: u64::MAX,
        });
        match v.claim {
            Claim::Claimed => {
                row.claimed_errors += 1;
                row.first_claimed_ns = row.first_claimed_ns.min(v.ts_ns);
            }
            Claim::Unclaimed => row.unclaimed_errors += 1,
            Claim::Missing => {}
        }
    }
    let mut owners: Vec<OwnerRow> = owners
        .into_values()
        .filter(|o| o.claimed_errors > 0)
        .collect();
    owners.sort_by(|a, b| {
        b.claimed_errors
            .cmp(&a.claimed_errors)
            .then(a.first_claimed_ns.cmp(&b.first_claimed_ns))
    });
    (verdicts, owners)
}

/// Edge figures over time.
struct EdgeFigures {
    /// One row per edge, highest peak amplification first.
    rows: Vec<EdgeRow>,
    /// Each edge's last figures (its totals).
    last: BTreeMap<Edge, EdgeStats>,
    /// The widest storm seen and its path.
    radius: (u32, Vec<ServiceId>),
}

fn edge_figures(snapshots: &[EdgeSnapshot], clock: &Clock<'_>) -> EdgeFigures {
    let mut rows: BTreeMap<Edge, EdgeRow> = BTreeMap::new();
    let mut last: BTreeMap<Edge, EdgeStats> = BTreeMap::new();
    let mut radius = (0u32, Vec::new());
    for s in snapshots {
        if s.paths.storm_radius > radius.0 {
            radius = (s.paths.storm_radius, s.paths.storm_path.clone());
        }
        for e in &s.edges {
            let row = rows.entry(e.edge.clone()).or_insert_with(|| EdgeRow {
                edge: e.edge.to_string(),
                requests: 0,
                retries: 0,
                peak_amplification: 0.0,
                peak_at_s: 0.0,
                peak_attempts_per_request: 0.0,
                timeout_mismatches: 0,
                non_idempotent_retries: 0,
                hedged_retries: 0,
                series: Vec::new(),
            });
            row.series.push((clock.t_s(s.ts_ns), e.amplification));
            if e.amplification > row.peak_amplification {
                row.peak_amplification = e.amplification;
                row.peak_at_s = clock.t_s(s.ts_ns);
            }
            row.peak_attempts_per_request =
                row.peak_attempts_per_request.max(e.attempts_per_request);
            last.insert(e.edge.clone(), e.clone());
        }
    }
    for (edge, e) in &last {
        if let Some(row) = rows.get_mut(edge) {
            row.requests = e.requests_total;
            row.retries = e.retries_total;
            row.timeout_mismatches = e.timeout_mismatches_total;
            row.non_idempotent_retries = e.non_idempotent_retries;
            row.hedged_retries = e.hedged_retries;
        }
    }
    let mut rows: Vec<EdgeRow> = rows.into_values().collect();
    rows.sort_by(|a, b| b.peak_amplification.total_cmp(&a.peak_amplification));
    EdgeFigures { rows, last, radius }
}

/// Count locally answered retries (client-side responses with `x-retry-suppressed`) and the
/// requests they would have caused at the owner: each suppressed retry on `caller → callee`
/// would have arrived at the callee and been multiplied by the attempts per request observed on
/// the path from the callee down to an owner.
fn suppressed(
    events: &[&Event],
    xs: &[Exchange],
    edges: &BTreeMap<Edge, EdgeStats>,
    owners: &[OwnerRow],
) -> (u64, f64) {
    let mut comm: HashMap<u32, String> = HashMap::new();
    for e in events {
        if let Event::Process(p) = e {
            comm.insert(p.pid, p.comm.clone());
        }
    }
    let owner_set: BTreeSet<&ServiceId> = owners.iter().map(|o| &o.service).collect();
    let needle = format!("\r\n{}:", crate::l7::RETRY_SUPPRESSED_HEADER);
    let mut count = 0;
    let mut cf = 0.0;
    for e in events {
        let Event::Data(d) = e else { continue };
        if d.direction != Direction::Ingress
            || d.role != Role::Client
            || !d.payload.starts_with(b"HTTP/1.")
        {
            continue;
        }
        let head_end = d
            .payload
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or(d.payload.len());
        let head = d
            .payload
            .get(..head_end)
            .unwrap_or_default()
            .to_ascii_lowercase();
        if !head.windows(needle.len()).any(|w| w == needle.as_bytes()) {
            continue;
        }
        count += 1;
        // Which edge: the exchange on this connection answered at this time.
        let remote = xs
            .iter()
            .find(|x| {
                x.conn == d.conn
                    && x.response_start_ns.is_some_and(|s| s <= d.ts_exit_ns)
                    && x.end_ns() >= d.ts_exit_ns
            })
            .and_then(|x| x.remote)
            .or(d.tuple.map(|t| t.remote));
        let caller = comm.get(&d.pid).cloned().unwrap_or_default();
        let edge = edges.values().find(|s| {
            s.edge.caller.as_str() == caller && remote.is_some_and(|r| s.callee_addrs.contains(&r))
        });
        cf += match edge {
            Some(s) => multiplier(&s.edge.callee, edges, &owner_set, 0),
            None => 1.0,
        };
    }
    (count, cf)
}

/// Requests reaching an owner per request arriving at `svc` (max over paths; 1 at an owner).
fn multiplier(
    svc: &ServiceId,
    edges: &BTreeMap<Edge, EdgeStats>,
    owners: &BTreeSet<&ServiceId>,
    depth: u32,
) -> f64 {
    if owners.is_empty() || owners.contains(svc) || depth > 16 {
        return 1.0;
    }
    edges
        .values()
        .filter(|e| &e.edge.caller == svc)
        .map(|e| {
            e.attempts_per_request.max(1.0) * multiplier(&e.edge.callee, edges, owners, depth + 1)
        })
        .fold(1.0, f64::max)
}
