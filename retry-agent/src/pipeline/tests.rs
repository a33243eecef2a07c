#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use crate::{decide::Reason, testkit::StormScenario};

/// First ownership decision on the synthetic storm (db fails from 11 s on), with and without
/// the burst path, and every decision the run made.
fn run(burst: bool) -> (u64, Vec<Decision>) {
    let decide = DecideConfig {
        burst,
        ..DecideConfig::default()
    };
    let mut p = Pipeline::new(L7Config::default(), CorrelateConfig::default(), decide);
    let mut out = StageOutput::default();
    for ev in &StormScenario::default().events() {
        p.push(ev, &mut out);
    }
    let first = out
        .decisions
        .iter()
        .filter(|d| d.reason == Reason::CalleeUnclaimed)
        .map(|d| d.issued_at_ns)
        .min()
        .expect("the storm is suppressed above the owner");
    (first, out.decisions)
}

#[test]
fn a_burst_decides_ownership_before_the_bucket_completes() {
    const ONSET: u64 = 11_000_000_000;
    let (tick, tick_all) = run(false);
    let (burst, burst_all) = run(true);
    assert!(burst < tick, "burst {burst} vs tick {tick}");
    assert!(
        burst.saturating_sub(ONSET) < 500_000_000,
        "onset → decision {} ms",
        burst.saturating_sub(ONSET) / 1_000_000
    );
    // The same edges end up decided with the same reasons; the edge into the owner (api → db)
    // is only ever capped, never stopped.
    let edges = |ds: &[Decision]| {
        let mut v: Vec<(String, Reason)> =
            ds.iter().map(|d| (d.edge.to_string(), d.reason)).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.as_str().cmp(b.1.as_str())));
        v.dedup();
        v
    };
    assert_eq!(edges(&burst_all), edges(&tick_all));
    let into_owner: Vec<_> = burst_all
        .iter()
        .filter(|d| d.edge.callee.as_str().starts_with("db"))
        .collect();
    assert!(!into_owner.is_empty(), "{burst_all:?}");
    for d in into_owner {
        let basis = d.evidence.as_ref().map(|e| e.basis);
        assert_eq!(
            (d.reason, basis),
            (Reason::OverBudget, Some(crate::decide::Basis::OwnerBudget))
        );
    }
}

/// An untraced event loop (api, two requests in flight on one thread) gets no verdicts, so its
/// failures are the only evidence: each one triggers a burst, and the retries into it stop as
/// soon as the shares show it failing with its owned dependency, not at the next tick.
#[test]
fn failures_alone_trigger_a_burst_where_no_verdict_can_say() {
    const ONSET: u64 = 1_000_000_000 + 1_000_000 + 1000 * 10_000_000;
    let storm = StormScenario {
        event_loop: true,
        secrets: false,
        ..StormScenario::default()
    };
    let mut p = Pipeline::new(
        L7Config::default(),
        CorrelateConfig::default(),
        DecideConfig::default(),
    );
    let mut out = StageOutput::default();
    for ev in &storm.events() {
        p.push(ev, &mut out);
    }
    let into_api = out
        .decisions
        .iter()
        .find(|d| d.edge.callee.as_str().starts_with("api") && d.reason == Reason::CalleeUnclaimed)
        .expect("the retries into api stop")
        .clone();
    assert_eq!(
        into_api.evidence.as_ref().map(|e| e.basis),
        Some(crate::decide::Basis::DependencySymptoms)
    );
    // No verdict spoke for api: failures alone did. (Its last ones in the fault were once
    // `claimed` by `process_quiet`: the first identical call after the fault "recovered" their
    // failed calls before they were judged.)
    p.finish(&mut out);
    let api: Vec<_> = out
        .verdicts
        .iter()
        .filter(|v| v.service.as_str().starts_with("api") && v.claim != Claim::Missing)
        .collect();
    assert!(api.is_empty(), "{:?}", api.first());
    assert!(
        out.verdicts
            .iter()
            .any(|v| v.service.as_str().starts_with("api"))
    );
    // Over the last two seconds (the first of them healthy) the failures pass half of api's
    // requests ~0.5 s after the onset; without a burst the decision waits for the tick 1 s in.
    let after = into_api.issued_at_ns.saturating_sub(ONSET);
    assert!(
        after < 600_000_000,
        "onset → decision {} ms, at {} ns",
        after / 1_000_000,
        into_api.issued_at_ns
    );
}

/// A tap that keeps what it is handed.
#[derive(Clone, Default)]
struct Keep(std::sync::Arc<std::sync::Mutex<Vec<Record>>>);

impl Tap for Keep {
    fn attach(&mut self, _: &PipelineConfig) {}
    fn tap(&mut self, _: Input<'_>, derived: Derived<'_>) {
        self.0.lock().unwrap().extend(derived);
    }
}

/// The live loop's pipeline moves exchanges into its tap: the tap gets what a copying pipeline
/// gives it, and the output no longer holds them.
#[test]
fn exchanges_handed_to_the_tap_are_the_copied_ones() {
    let events = StormScenario::default().events();
    let run = |hand: bool| {
        let keep = Keep::default();
        let mut p = Pipeline::new(
            L7Config::default(),
            CorrelateConfig::default(),
            DecideConfig::default(),
        )
        .with_tap(keep.clone());
        if hand {
            p = p.hand_exchanges_to_tap();
        }
        let mut out = StageOutput::default();
        for ev in &events {
            p.push(ev, &mut out);
        }
        p.tick(
            events.last().map_or(0, Event::ts_ns) + 3_000_000_000,
            &mut out,
        );
        let tapped = std::mem::take(&mut *keep.0.lock().unwrap());
        (tapped, out)
    };
    let (copied, out_copied) = run(false);
    let (handed, out_handed) = run(true);
    assert!(
        copied.iter().any(|r| matches!(r, Record::Exchange(_))),
        "the scenario makes exchanges"
    );
    assert_eq!(handed, copied);
    assert!(out_handed.exchanges.is_empty());
    assert!(!out_copied.exchanges.is_empty());
    assert_eq!(out_handed.decisions, out_copied.decisions);
}

/// The push that judges the first disowned error says so (the live loop then publishes claims
/// at once), and the claims it would publish already count that verdict: the window includes
/// the current, partial bucket, so the shim can stamp the claim on the next failure.
#[test]
fn a_disowning_verdict_is_news_and_counts_in_the_claims_at_once() {
    let mut p = Pipeline::new(
        L7Config::default(),
        CorrelateConfig::default(),
        DecideConfig::default(),
    );
    let mut out = StageOutput::default();
    let mut first = None;
    for ev in &StormScenario::default().events() {
        out.clear();
        p.push(ev, &mut out);
        let news = p.take_disowned_evidence();
        let disowned: Vec<_> = out
            .verdicts
            .iter()
            .filter(|v| v.claim == Claim::Unclaimed)
            .collect();
        assert_eq!(news, !disowned.is_empty(), "news iff a verdict disowned");
        if let Some(v) = disowned.first() {
            first = Some((v.service.clone(), p.engine.service_claims()));
            break;
        }
    }
    let (service, claims) = first.expect("the storm has unclaimed verdicts");
    let c = claims
        .iter()
        .find(|c| c.service == service)
        .expect("the service has a claim entry");
    assert!(c.counts.unclaimed >= 1, "{c:?}");
    assert!(!p.take_disowned_evidence(), "taken once");
}
