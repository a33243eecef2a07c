//! `retry-agent forensics`: offline replay of a dump through the live l7 + correlate + decide code
//! ([`super::replay`]: the same [`crate::pipeline::Pipeline`] the live agent runs) into an incident report.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt::Write as _,
    path::{Path, PathBuf},
};

use clap::Args;
use serde::Serialize;

use super::{DumpHeader, DumpReader, EdgeSnapshot, Loss, Pipeline, PipelineConfig, Record, Replayed, replay};
use crate::{
    capture::{Direction, Event, Role},
    correlate::{CorrelateConfig, Edge, EdgeStats, ServiceId, Verdict},
    decide::{Action, DecideConfig, Decision},
    l7::{Claim, Exchange, L7Config},
    settings::InvalidConfig,
};

#[derive(Debug, Args)]
pub struct ForensicsArgs {
    /// The dump file to analyse.
    pub dump: PathBuf,
    /// Compare with a second dump (before/after a change): prints both reports' key figures.
    #[arg(long, value_name = "OTHER_DUMP")]
    pub diff: Option<PathBuf>,
    /// Print the report as JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML page with an SVG timeline here.
    #[arg(long, value_name = "OUT_HTML")]
    pub html: Option<PathBuf>,
    /// Report from the derived records the live agent recorded instead of replaying the events.
    #[arg(long)]
    pub recorded: bool,
    /// Replay with the stage settings given to this command (the flags below, or their
    /// defaults) instead of the ones the live agent ran with, which the dump records. For
    /// "what if" replays, e.g. another retry budget.
    #[arg(long)]
    pub replay_flags: bool,
    #[command(flatten)]
    pub l7: L7Config,
    #[command(flatten)]
    pub correlate: CorrelateConfig,
    #[command(flatten)]
    pub decide: DecideConfig,
}

/// What the derived streams came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Replay,
    Recorded,
}

#[derive(Clone, Debug, Serialize)]
pub struct DumpSummary {
    pub path: String,
    pub node: Option<String>,
    pub kernel: Option<String>,
    pub agent_version: Option<String>,
    pub reason: Option<super::DumpReason>,
    pub from_ns: u64,
    pub to_ns: u64,
    pub records: usize,
    pub events: usize,
    pub loss: Loss,
    pub loss_text: String,
}

/// Replay vs what the live agent recorded.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayCheck {
    pub recorded_verdicts: usize,
    pub replayed_verdicts: usize,
    pub recorded_decisions: usize,
    pub replayed_decisions: usize,
    pub verdicts_equal: bool,
    pub decisions_equal: bool,
    pub edge_snapshots_equal: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TimelineKind {
    FirstFailure,
    FaultOnset,
    FirstUnclaimedError,
    StormDetected,
    Suppress,
    Allow,
    Recovery,
}

#[derive(Clone, Debug, Serialize)]
pub struct TimelineEntry {
    pub ts_ns: u64,
    /// Seconds since the start of the dump.
    pub t_s: f64,
    pub wall_ms: Option<i128>,
    pub kind: TimelineKind,
    pub detail: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct OwnerRow {
    pub service: ServiceId,
    /// Failed inbound exchanges the service owned (claimed).
    pub claimed_errors: u64,
    /// Failed inbound exchanges it only passed on (unclaimed).
    pub unclaimed_errors: u64,
    pub first_claimed_ns: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct EdgeRow {
    pub edge: String,
    pub requests: u64,
    pub retries: u64,
    pub peak_amplification: f64,
    pub peak_at_s: f64,
    pub peak_attempts_per_request: f64,
    pub timeout_mismatches: u64,
    pub non_idempotent_retries: u64,
    pub hedged_retries: u64,
    /// Amplification at each evaluation (aligned with `EdgeSeries`' times).
    pub series: Vec<(f64, f64)>,
}

#[derive(Clone, Debug, Serialize)]
pub struct IncidentReport {
    pub dump: DumpSummary,
    pub source: Source,
    pub replay_check: Option<ReplayCheck>,
    pub exchanges: u64,
    pub failed_exchanges: u64,
    pub verdicts: BTreeMap<String, u64>,
    pub timeline: Vec<TimelineEntry>,
    pub owners: Vec<OwnerRow>,
    pub edges: Vec<EdgeRow>,
    pub storm_radius_max: u32,
    pub storm_path: Vec<ServiceId>,
    /// Retries the shim answered locally (responses carrying `x-retry-suppressed`).
    pub retries_suppressed: u64,
    /// Requests those retries would have caused at the owner service(s) without suppression.
    pub counterfactual_requests: f64,
    pub timeout_mismatches: u64,
    pub non_idempotent_retries: u64,
    pub notes: Vec<String>,
}

/// Derived streams the report is built from.
struct Derived {
    exchanges: Vec<Exchange>,
    verdicts: Vec<Verdict>,
    decisions: Vec<Decision>,
    snapshots: Vec<EdgeSnapshot>,
}

fn recorded(records: &[Record]) -> Derived {
    let mut d = Derived { exchanges: vec![], verdicts: vec![], decisions: vec![], snapshots: vec![] };
    for r in records {
        match r {
            Record::Exchange(x) => d.exchanges.push(x.clone()),
            Record::Verdict(v) => d.verdicts.push(v.clone()),
            Record::Decision(x) => d.decisions.push(x.clone()),
            Record::Edges(s) => d.snapshots.push(s.clone()),
            _ => {}
        }
    }
    d
}

/// Every problem with the stage settings a replay runs with, at once.
fn validate(l7: &L7Config, correlate: &CorrelateConfig, decide: &DecideConfig) -> Result<(), InvalidConfig> {
    let mut p = InvalidConfig::default();
    p.add(l7).add(correlate).add(decide);
    p.into_result()
}

/// Analyse one dump.
pub fn analyse(path: &Path, args: &ForensicsArgs) -> anyhow::Result<IncidentReport> {
    let dump = DumpReader::open(path)?;
    let mut notes = Vec::new();
    let rec = recorded(&dump.records);
    let flags = PipelineConfig { l7: args.l7.clone(), correlate: args.correlate.clone(), decide: args.decide.clone() };
    let live = dump.header.as_ref().map(|h| &h.pipeline).filter(|v| !v.is_null());
    let config = match (args.replay_flags, live) {
        (true, _) => flags,
        (false, Some(v)) => match serde_json::from_value::<PipelineConfig>(v.clone()) {
            Ok(c) if let Err(e) = validate(&c.l7, &c.correlate, &c.decide) => {
                notes.push(format!("the dump's pipeline settings are invalid ({e}): replaying with this command's flags"));
                flags
            }
            Ok(c) => c,
            Err(e) => {
                notes.push(format!("the dump's pipeline settings do not parse ({e}): replaying with this command's flags"));
                flags
            }
        },
        (false, None) => {
            notes.push("the dump does not record the live pipeline's settings: replaying with this command's flags".into());
            flags
        }
    };
    let mut pipeline = Pipeline::from_config(&config);
    let rep: Replayed = replay(&mut pipeline, &dump.records);
    let check = ReplayCheck {
        recorded_verdicts: rec.verdicts.len(),
        replayed_verdicts: rep.verdicts.len(),
        recorded_decisions: rec.decisions.len(),
        replayed_decisions: rep.decisions.len(),
        verdicts_equal: rec.verdicts == rep.verdicts,
        decisions_equal: rec.decisions == rep.decisions,
        edge_snapshots_equal: rec.snapshots == rep.snapshots,
    };
    let (source, derived) = if args.recorded {
        (Source::Recorded, rec)
    } else if rep.exchanges.is_empty() && !rec.exchanges.is_empty() {
        notes.push("the replay produced no exchanges (this build's l7 stage may be incomplete): reporting from the recorded derived records".into());
        (Source::Recorded, rec)
    } else {
        (Source::Replay, Derived { exchanges: rep.exchanges, verdicts: rep.verdicts, decisions: rep.decisions, snapshots: rep.snapshots })
    };
    let missing = dump.header.as_ref().map_or(0, |h| h.missing_before);
    if missing > 0 {
        notes.push(format!(
            "the ring had let go of {missing} older records before this dump: the replay starts mid-stream, so \
             connections open at its start and the first window of edge figures can differ from the live run"
        ));
    }
    if !dump.loss.is_clean() {
        notes.push(format!("the dump is damaged: {}; figures cover what survived", dump.loss));
    }
    let mut report = build(&dump.records, &derived, dump.header.as_ref(), source);
    report.dump.path = path.display().to_string();
    report.dump.loss_text = dump.loss.to_string();
    report.dump.loss = dump.loss;
    report.replay_check = Some(check);
    report.notes.extend(notes);
    Ok(report)
}

fn sparkline(vals: &[f64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = vals.iter().copied().fold(1.0_f64, f64::max);
    // Squash long series to 60 columns by taking the maximum of each bucket.
    let cols = vals.len().min(60).max(1);
    (0..cols)
        .map(|c| {
            let lo = c * vals.len() / cols;
            let hi = ((c + 1) * vals.len() / cols).max(lo + 1);
            let v = vals.get(lo..hi.min(vals.len())).unwrap_or_default().iter().copied().fold(0.0, f64::max);
            let i = ((v / max) * 7.0).round().clamp(0.0, 7.0) as usize;
            BARS.get(i).copied().unwrap_or(' ')
        })
        .collect()
}

/// Build the report from recorded events (for service names and suppressed answers) and the
/// derived streams.
fn build(records: &[Record], d: &Derived, header: Option<&DumpHeader>, source: Source) -> IncidentReport {
    let events: Vec<&Event> = records.iter().filter_map(|r| if let Record::Event(e) = r { Some(e) } else { None }).collect();
    let t0 = records.iter().map(Record::ts_ns).filter(|&t| t > 0).min().unwrap_or(0);
    let t_s = |ts: u64| ts.saturating_sub(t0) as f64 / 1e9;
    let wall = |ts: u64| header.map(|h| h.wall_ms(ts));
    let mut timeline = Vec::new();
    let mut push = |ts: u64, kind: TimelineKind, detail: String| {
        timeline.push(TimelineEntry { ts_ns: ts, t_s: t_s(ts), wall_ms: wall(ts), kind, detail })
    };

    let first_fail = d.exchanges.iter().filter(|x| x.failed()).min_by_key(|x| x.end_ns());
    if let Some(x) = first_fail {
        push(
            x.end_ns(),
            TimelineKind::FirstFailure,
            {
                // The failing service's address: the local end of a server-side exchange.
                let at = if x.role == Role::Server { x.local } else { x.remote };
                format!("{} {} at {}", x.status.map_or_else(|| format!("{:?}", x.outcome), |s| s.to_string()),
                    x.path.as_deref().unwrap_or("-"), at.map_or_else(|| "?".into(), |a| a.to_string()))
            },
        );
    }
    let fault_at = d.snapshots.iter().find(|s| s.paths.fault_active || s.edges.iter().any(|e| e.fault_active));
    if let Some(s) = fault_at {
        let e = s.edges.iter().filter(|e| e.fault_active).max_by(|a, b| a.failure_ratio.total_cmp(&b.failure_ratio));
        push(s.ts_ns, TimelineKind::FaultOnset, e.map_or_else(|| "fault active".into(), |e| format!("{} failure ratio {:.0}%", e.edge, e.failure_ratio * 100.0)));
        if let Some(r) = d.snapshots.iter().find(|r| r.ts_ns > s.ts_ns && !r.paths.fault_active && !r.edges.iter().any(|e| e.fault_active)) {
            push(r.ts_ns, TimelineKind::Recovery, "no edge in fault any more".into());
        }
    } else if let (Some(_), Some(last)) = (first_fail, d.exchanges.iter().filter(|x| x.failed()).max_by_key(|x| x.end_ns())) {
        if let Some(ok) = d.exchanges.iter().filter(|x| !x.failed() && x.end_ns() > last.end_ns()).min_by_key(|x| x.end_ns()) {
            push(ok.end_ns(), TimelineKind::Recovery, "first success after the last failure".into());
        }
    }
    if let Some(v) = d.verdicts.iter().filter(|v| v.claim == Claim::Unclaimed).min_by_key(|v| v.ts_ns) {
        let cause = v.caused_by.first().map_or_else(String::new, |c| format!(" (caused by {} {:?})", c.callee, c.outcome));
        push(v.ts_ns, TimelineKind::FirstUnclaimedError, format!("{} returned an error it does not own{cause}", v.service));
    }
    let mut seen_ids = BTreeSet::new();
    let mut storm = false;
    for dec in &d.decisions {
        if !seen_ids.insert((dec.id, dec.action == Action::Allow)) {
            continue; // renewal of a decision already on the timeline
        }
        match dec.action {
            Action::SuppressRetries => {
                if !storm {
                    storm = true;
                    push(dec.issued_at_ns, TimelineKind::StormDetected, format!("on {} ({})", dec.edge, dec.reason.as_str()));
                }
                push(dec.issued_at_ns, TimelineKind::Suppress, format!("suppress retries on {} ({}, ttl {} ms)", dec.edge, dec.reason.as_str(), dec.ttl_ms));
            }
            Action::Allow => push(dec.issued_at_ns, TimelineKind::Allow, format!("allow retries on {} again", dec.edge)),
        }
    }
    timeline.sort_by(|a, b| a.ts_ns.cmp(&b.ts_ns).then(a.kind.cmp(&b.kind)));

    // Owners: who claimed the errors.
    let mut owners: BTreeMap<ServiceId, OwnerRow> = BTreeMap::new();
    let mut verdicts: BTreeMap<String, u64> = BTreeMap::new();
    for v in &d.verdicts {
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
    let mut owners: Vec<OwnerRow> = owners.into_values().filter(|o| o.claimed_errors > 0).collect();
    owners.sort_by(|a, b| b.claimed_errors.cmp(&a.claimed_errors).then(a.first_claimed_ns.cmp(&b.first_claimed_ns)));

    // Edge figures over time.
    let mut rows: BTreeMap<Edge, EdgeRow> = BTreeMap::new();
    let mut last: BTreeMap<Edge, EdgeStats> = BTreeMap::new();
    let mut radius = (0u32, Vec::new());
    for s in &d.snapshots {
        if s.paths.storm_radius > radius.0 {
            radius = (s.paths.storm_radius, s.paths.storm_path.clone());
        }
        for e in &s.edges {
            let row = rows.entry(e.edge.clone()).or_insert(EdgeRow {
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
            row.series.push((t_s(s.ts_ns), e.amplification));
            if e.amplification > row.peak_amplification {
                row.peak_amplification = e.amplification;
                row.peak_at_s = t_s(s.ts_ns);
            }
            row.peak_attempts_per_request = row.peak_attempts_per_request.max(e.attempts_per_request);
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
    let mut edges: Vec<EdgeRow> = rows.into_values().collect();
    edges.sort_by(|a, b| b.peak_amplification.total_cmp(&a.peak_amplification));

    // Non-idempotent retries also straight from the exchanges (when edge figures are missing).
    let nonidem_x = d.exchanges.iter().filter(|x| x.retry_markers.says_retry() && !x.idempotent && x.role == Role::Client).count() as u64;
    let non_idempotent_retries = edges.iter().map(|e| e.non_idempotent_retries).sum::<u64>().max(nonidem_x);
    let timeout_mismatches = edges.iter().map(|e| e.timeout_mismatches).sum();

    let (retries_suppressed, counterfactual) = suppressed(&events, &d.exchanges, &last, &owners);

    IncidentReport {
        dump: DumpSummary {
            path: String::new(),
            node: header.map(|h| h.node.clone()),
            kernel: header.map(|h| h.kernel.clone()),
            agent_version: header.map(|h| h.agent_version.clone()),
            reason: header.map(|h| h.reason.clone()),
            from_ns: header.map_or(t0, |h| h.from_ns),
            to_ns: header.map_or(0, |h| h.to_ns),
            records: records.len(),
            events: events.len(),
            loss: Loss::default(),
            loss_text: String::new(),
        },
        source,
        replay_check: None,
        exchanges: d.exchanges.len() as u64,
        failed_exchanges: d.exchanges.iter().filter(|x| x.failed()).count() as u64,
        verdicts,
        timeline,
        owners,
        edges,
        storm_radius_max: radius.0,
        storm_path: radius.1,
        retries_suppressed,
        counterfactual_requests: counterfactual,
        timeout_mismatches,
        non_idempotent_retries,
        notes: Vec::new(),
    }
}

/// Count locally answered retries (client-side responses with `x-retry-suppressed`) and the
/// requests they would have caused at the owner: each suppressed retry on `caller → callee`
/// would have arrived at the callee and been multiplied by the attempts per request observed on
/// the path from the callee down to an owner.
fn suppressed(events: &[&Event], xs: &[Exchange], edges: &BTreeMap<Edge, EdgeStats>, owners: &[OwnerRow]) -> (u64, f64) {
    let mut comm: HashMap<u32, String> = HashMap::new();
    for e in events {
        if let Event::Process(p) = e {
            comm.insert(p.pid, p.comm.clone());
        }
    }
    let owner_set: BTreeSet<&ServiceId> = owners.iter().map(|o| &o.service).collect();
    let mut count = 0;
    let mut cf = 0.0;
    for e in events {
        let Event::Data(d) = e else { continue };
        if d.direction != Direction::Ingress || d.role != Role::Client || !d.payload.starts_with(b"HTTP/1.") {
            continue;
        }
        let head_end = d.payload.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(d.payload.len());
        let head = d.payload.get(..head_end).unwrap_or_default().to_ascii_lowercase();
        let needle = format!("\r\n{}:", crate::l7::RETRY_SUPPRESSED_HEADER);
        if !head.windows(needle.len()).any(|w| w == needle.as_bytes()) {
            continue;
        }
        count += 1;
        // Which edge: the exchange on this connection answered at this time.
        let remote = xs
            .iter()
            .find(|x| x.conn == d.conn && x.response_start_ns.is_some_and(|s| s <= d.ts_exit_ns) && x.end_ns() >= d.ts_exit_ns)
            .and_then(|x| x.remote)
            .or(d.tuple.map(|t| t.remote));
        let caller = comm.get(&d.pid).cloned().unwrap_or_default();
        let edge = edges.values().find(|s| s.edge.caller.as_str() == caller && remote.is_some_and(|r| s.callee_addrs.contains(&r)));
        cf += match edge {
            Some(s) => multiplier(&s.edge.callee, edges, &owner_set, 0),
            None => 1.0,
        };
    }
    (count, cf)
}

/// Requests reaching an owner per request arriving at `svc` (max over paths; 1 at an owner).
fn multiplier(svc: &ServiceId, edges: &BTreeMap<Edge, EdgeStats>, owners: &BTreeSet<&ServiceId>, depth: u32) -> f64 {
    if owners.is_empty() || owners.contains(svc) || depth > 16 {
        return 1.0;
    }
    edges
        .values()
        .filter(|e| &e.edge.caller == svc)
        .map(|e| e.attempts_per_request.max(1.0) * multiplier(&e.edge.callee, edges, owners, depth + 1))
        .fold(1.0, f64::max)
}

pub fn render_text(r: &IncidentReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "Incident report for {}", r.dump.path);
    let _ = writeln!(
        s,
        "  node {}  kernel {}  agent {}  reason {}",
        r.dump.node.as_deref().unwrap_or("?"),
        r.dump.kernel.as_deref().unwrap_or("?"),
        r.dump.agent_version.as_deref().unwrap_or("?"),
        r.dump.reason.as_ref().map_or_else(|| "?".into(), |x| format!("{x:?}"))
    );
    let _ = writeln!(s, "  {} records ({} events), dump {}", r.dump.records, r.dump.events, r.dump.loss_text);
    let _ = writeln!(s, "  source: {:?}", r.source);
    if let Some(c) = &r.replay_check {
        let _ = writeln!(
            s,
            "  replay vs live: verdicts {} ({} / {}), decisions {} ({} / {}), edge figures {}",
            if c.verdicts_equal { "equal" } else { "DIFFER" },
            c.replayed_verdicts,
            c.recorded_verdicts,
            if c.decisions_equal { "equal" } else { "DIFFER" },
            c.replayed_decisions,
            c.recorded_decisions,
            if c.edge_snapshots_equal { "equal" } else { "DIFFER" },
        );
    }
    for n in &r.notes {
        let _ = writeln!(s, "  note: {n}");
    }
    let _ = writeln!(s, "\nTIMELINE");
    if r.timeline.is_empty() {
        let _ = writeln!(s, "  (nothing happened)");
    }
    for t in &r.timeline {
        let _ = writeln!(s, "  {:>9.3}s  {:<22} {}", t.t_s, format!("{:?}", t.kind), t.detail);
    }
    let _ = writeln!(s, "\nOWNERS (services whose errors were their own)");
    let _ = writeln!(s, "  {:<24} {:>10} {:>10}", "service", "claimed", "unclaimed");
    for o in &r.owners {
        let _ = writeln!(s, "  {:<24} {:>10} {:>10}", o.service.as_str(), o.claimed_errors, o.unclaimed_errors);
    }
    let _ = writeln!(s, "\nEDGES (amplification = arrival rate / baseline, per evaluation)");
    let _ = writeln!(
        s,
        "  {:<28} {:>8} {:>8} {:>7} {:>8} {:>6} {:>6}  amplification over time",
        "edge", "requests", "retries", "peak×", "at", "t/o", "nonid"
    );
    for e in &r.edges {
        let series: Vec<f64> = e.series.iter().map(|p| p.1).collect();
        let _ = writeln!(
            s,
            "  {:<28} {:>8} {:>8} {:>7.2} {:>7.1}s {:>6} {:>6}  {}",
            e.edge,
            e.requests,
            e.retries,
            e.peak_amplification,
            e.peak_at_s,
            e.timeout_mismatches,
            e.non_idempotent_retries,
            sparkline(&series)
        );
    }
    let _ = writeln!(s, "\nSUMMARY");
    let _ = writeln!(s, "  exchanges {}  failed {}  verdicts {:?}", r.exchanges, r.failed_exchanges, r.verdicts);
    let path: Vec<&str> = r.storm_path.iter().map(ServiceId::as_str).collect();
    let _ = writeln!(s, "  storm radius (max) {}  path {}", r.storm_radius_max, path.join(" → "));
    let _ = writeln!(
        s,
        "  retries suppressed {}  requests they would have caused at the owner(s) {:.0}",
        r.retries_suppressed, r.counterfactual_requests
    );
    let _ = writeln!(s, "  timeout mismatches {}  non-idempotent retries {}", r.timeout_mismatches, r.non_idempotent_retries);
    s
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A self-contained page: an SVG with per-edge amplification lines and timeline markers.
pub fn render_html(r: &IncidentReport) -> String {
    let (w, h, pad) = (1000.0, 360.0, 40.0);
    let t_max = r
        .edges
        .iter()
        .flat_map(|e| e.series.iter().map(|p| p.0))
        .chain(r.timeline.iter().map(|t| t.t_s))
        .fold(1.0_f64, f64::max);
    let a_max = r.edges.iter().map(|e| e.peak_amplification).fold(2.0_f64, f64::max);
    let x = |t: f64| pad + (t / t_max) * (w - 2.0 * pad);
    let y = |a: f64| h - pad - (a / a_max) * (h - 2.0 * pad);
    let colours = ["#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
    let mut svg = format!(r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#);
    let _ = write!(svg, r##"<rect width="{w}" height="{h}" fill="#fff"/><line x1="{pad}" y1="{0}" x2="{1}" y2="{0}" stroke="#444"/><line x1="{pad}" y1="{pad}" x2="{pad}" y2="{0}" stroke="#444"/>"##, h - pad, w - pad);
    let _ = write!(svg, r##"<line x1="{pad}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="#bbb" stroke-dasharray="4"/><text x="4" y="{0:.1}">1×</text><text x="4" y="{pad}">{a_max:.1}×</text><text x="{1}" y="{2}" text-anchor="end">{t_max:.1} s</text>"##, y(1.0), w - pad, h - pad + 14.0);
    for t in &r.timeline {
        let _ = write!(
            svg,
            r##"<line x1="{0:.1}" y1="{pad}" x2="{0:.1}" y2="{1}" stroke="#999"/><text x="{0:.1}" y="{2}" transform="rotate(-30 {0:.1} {2})">{3}</text>"##,
            x(t.t_s),
            h - pad,
            pad - 4.0,
            esc(&format!("{:?}", t.kind))
        );
    }
    for (i, e) in r.edges.iter().enumerate() {
        let c = colours.get(i % colours.len()).copied().unwrap_or("#000");
        let pts: Vec<String> = e.series.iter().map(|p| format!("{:.1},{:.1}", x(p.0), y(p.1))).collect();
        let _ = write!(svg, r#"<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{}"><title>{}</title></polyline>"#, pts.join(" "), esc(&e.edge));
        let _ = write!(svg, r#"<text x="{}" y="{}" fill="{c}">{}</text>"#, w - pad - 200.0, pad + 14.0 * i as f64, esc(&e.edge));
    }
    svg.push_str("</svg>");
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>retry-agent incident report</title></head>\
         <body style=\"font-family:sans-serif\"><h1>Incident report</h1>{svg}<pre>{}</pre></body></html>",
        esc(&render_text(r))
    )
}

fn render_diff(a: &IncidentReport, b: &IncidentReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{:<34} {:>14} {:>14}", "", "A", "B");
    let row = |s: &mut String, k: &str, x: String, y: String| {
        let _ = writeln!(s, "{k:<34} {x:>14} {y:>14}");
    };
    row(&mut s, "exchanges", a.exchanges.to_string(), b.exchanges.to_string());
    row(&mut s, "failed exchanges", a.failed_exchanges.to_string(), b.failed_exchanges.to_string());
    row(&mut s, "storm radius (max)", a.storm_radius_max.to_string(), b.storm_radius_max.to_string());
    row(&mut s, "retries suppressed", a.retries_suppressed.to_string(), b.retries_suppressed.to_string());
    row(&mut s, "timeout mismatches", a.timeout_mismatches.to_string(), b.timeout_mismatches.to_string());
    row(&mut s, "non-idempotent retries", a.non_idempotent_retries.to_string(), b.non_idempotent_retries.to_string());
    let edges: BTreeSet<&str> = a.edges.iter().chain(&b.edges).map(|e| e.edge.as_str()).collect();
    for e in edges {
        let peak = |r: &IncidentReport| r.edges.iter().find(|x| x.edge == e).map_or("-".into(), |x| format!("{:.2}×", x.peak_amplification));
        row(&mut s, &format!("peak amplification {e}"), peak(a), peak(b));
    }
    let owners = |r: &IncidentReport| r.owners.iter().map(|o| o.service.as_str().to_string()).collect::<Vec<_>>().join(",");
    row(&mut s, "owners", owners(a), owners(b));
    s
}

pub fn run(args: ForensicsArgs) -> anyhow::Result<()> {
    // Checked whether or not they are used: a what-if with a bad value must not look like a
    // replay with the live settings.
    validate(&args.l7, &args.correlate, &args.decide)?;
    let report = analyse(&args.dump, &args)?;
    if let Some(other) = &args.diff {
        let b = analyse(other, &args)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "a": report, "b": b }))?);
        } else {
            print!("{}", render_diff(&report, &b));
        }
        return Ok(());
    }
    if let Some(out) = &args.html {
        std::fs::write(out, render_html(&report)).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", out.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render_text(&report));
    }
    Ok(())
}
