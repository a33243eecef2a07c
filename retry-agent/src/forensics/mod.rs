//! Forensics: a dump replayed offline through the live l7 + correlate + decide code
//! ([`crate::recorder::replay`]: the same [`Pipeline`] the live agent runs) into an incident
//! report (`build`), printed as tables, JSON or a self-contained HTML page (`render`).
//! `retry-agent forensics` (in `cmd`) is its command line.
use std::{collections::BTreeMap, fmt, path::Path};

use serde::Serialize;

use crate::{
    correlate::{ServiceId, Verdict},
    decide::Decision,
    l7::Exchange,
    pipeline::{EdgeSnapshot, Pipeline, PipelineConfig, Record},
    recorder::{DumpReader, DumpReason, FormatError, Loss, Replayed, replay},
};

mod build;
mod render;

#[cfg(test)]
mod tests;

pub use render::{render_diff, render_html, render_text};

/// How to analyse a dump.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The stage settings of this invocation: replayed with when `override_settings` is set
    /// ("what if" replays, e.g. another retry budget) or when the dump does not record the live
    /// agent's own.
    pub settings: PipelineConfig,
    pub override_settings: bool,
    /// Report from the derived records the live agent recorded instead of the replay.
    pub recorded: bool,
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
    pub reason: Option<DumpReason>,
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
    /// Of the replayed verdicts, those judged only because the records ended (still waiting
    /// in the live run when the dump was cut): not compared.
    pub judged_at_end: usize,
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

/// One suppression decision (by id) and what it last rested on.
#[derive(Clone, Debug, Serialize)]
pub struct DecisionRow {
    pub id: u64,
    pub edge: String,
    /// When it was first issued (seconds since the start of the dump).
    pub issued_s: f64,
    /// Its reason and basis at its last issue or renewal.
    pub reason: crate::decide::Reason,
    /// `None` for a decision recorded by an agent that did not name its evidence.
    pub basis: Option<crate::decide::Basis>,
    /// Retries still passed up to the budget (budget capping) rather than stopped (ownership).
    pub retries_within_budget: bool,
    pub evidence: Option<crate::decide::Evidence>,
    pub lifted_s: Option<f64>,
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
    /// Verdicts by how their calls were tied to their request.
    pub verdict_links: BTreeMap<String, u64>,
    pub timeline: Vec<TimelineEntry>,
    pub owners: Vec<OwnerRow>,
    /// Each suppression and what it rests on: ownership or budget capping.
    pub decisions: Vec<DecisionRow>,
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

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Replay => "replay of the recorded events",
            Source::Recorded => "derived records of the live run",
        })
    }
}

impl fmt::Display for TimelineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TimelineKind::FirstFailure => "first failure",
            TimelineKind::FaultOnset => "fault onset",
            TimelineKind::FirstUnclaimedError => "first unclaimed error",
            TimelineKind::StormDetected => "storm detected",
            TimelineKind::Suppress => "suppress",
            TimelineKind::Allow => "allow",
            TimelineKind::Recovery => "recovery",
        })
    }
}

/// Derived streams the report is built from.
struct Derived {
    exchanges: Vec<Exchange>,
    verdicts: Vec<Verdict>,
    decisions: Vec<Decision>,
    snapshots: Vec<EdgeSnapshot>,
}

fn recorded(records: &[Record]) -> Derived {
    let mut d = Derived {
        exchanges: vec![],
        verdicts: vec![],
        decisions: vec![],
        snapshots: vec![],
    };
    for r in records {
        match r {
            Record::Exchange(x) => d.exchanges.push((**x).clone()),
            Record::Verdict(v) => d.verdicts.push(v.clone()),
            Record::Decision(x) => d.decisions.push(x.clone()),
            Record::Edges(s) => d.snapshots.push(s.clone()),
            _ => {}
        }
    }
    d
}

/// Every problem with the stage settings a replay runs with, at once.
pub fn validate(c: &PipelineConfig) -> Result<(), crate::settings::InvalidConfig> {
    crate::settings::Settings::validate(c)
}

/// Analyse one dump.
pub fn analyse(path: &Path, opts: &Options) -> Result<IncidentReport, FormatError> {
    let dump = DumpReader::open(path)?;
    let mut notes = Vec::new();
    let rec = recorded(&dump.records);
    let flags = opts.settings.clone();
    let live = dump
        .header
        .as_ref()
        .map(|h| &h.pipeline)
        .filter(|v| !v.is_null());
    let config = match (opts.override_settings, live) {
        (true, _) => flags,
        (false, Some(v)) => match serde_json::from_value::<PipelineConfig>(v.clone()) {
            Ok(c) if let Err(e) = validate(&c) => {
                notes.push(format!("the dump's pipeline settings are invalid ({e}): replaying with this command's flags"));
                opts.settings.clone()
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
        judged_at_end: rep.judged_at_end,
        verdicts_equal: rep
            .verdicts
            .get(..rep.verdicts.len().saturating_sub(rep.judged_at_end))
            .is_some_and(|v| v == rec.verdicts.as_slice()),
        decisions_equal: rec.decisions == rep.decisions,
        edge_snapshots_equal: rec.snapshots == rep.snapshots,
    };
    let (source, derived) = if opts.recorded {
        (Source::Recorded, rec)
    } else if rep.exchanges.is_empty() && !rec.exchanges.is_empty() {
        notes.push("the replay produced no exchanges (this build's l7 stage may be incomplete): reporting from the recorded derived records".into());
        (Source::Recorded, rec)
    } else {
        (
            Source::Replay,
            Derived {
                exchanges: rep.exchanges,
                verdicts: rep.verdicts,
                decisions: rep.decisions,
                snapshots: rep.snapshots,
            },
        )
    };
    let between = dump.header.as_ref().map_or(0, |h| h.missing_between);
    if between > 0 {
        notes.push(format!(
            "the ring let go of {between} records between the storm's trigger and the end of the dump's \
             window (the after-window outlasted what it holds): the replay has a gap there, and \
             connections open across it start mid-stream after it"
        ));
    }
    let missing = dump.header.as_ref().map_or(0, |h| h.missing_before);
    if missing > 0 {
        notes.push(format!(
            "the ring had let go of {missing} older records before this dump: the replay starts mid-stream, so \
             connections open at its start and the first window of edge figures can differ from the live run"
        ));
    }
    if !dump.loss.is_clean() {
        notes.push(format!(
            "the dump is damaged: {}; figures cover what survived",
            dump.loss
        ));
    }
    let mut report = build::build(&dump.records, &derived, dump.header.as_ref(), source);
    report.dump.path = path.display().to_string();
    report.dump.loss_text = dump.loss.to_string();
    report.dump.loss = dump.loss;
    report.replay_check = Some(check);
    report.notes.extend(notes);
    Ok(report)
}
