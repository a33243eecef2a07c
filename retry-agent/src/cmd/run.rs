//! `retry-agent run`: the live pipeline.
//!
//! capture → [`Pipeline`] (l7 → correlate → decide, the same driver forensics replays with) →
//! actuators, with the recorder tapping every stage and the API/metrics reading published
//! snapshots. One task owns the pipeline state; the kernel reader and the actuators run on their
//! own tasks behind bounded channels, so a slow actuator never stalls capture and a full channel
//! drops (and counts) instead of blocking.
use std::{sync::Arc, time::Duration};

use anyhow::{Context, Result, bail};
use clap::Args;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};
use tracing::{info, warn};

use crate::{
    actuate::{ActuateConfig, Dispatcher},
    api::{self, ApiConfig, DumpGate, DumpService, Retention, SharedState},
    capture::{Capture, CaptureConfig, Event, monotonic_ns, procfs},
    correlate,
    decide::Decision,
    identity::{Identity, IdentityConfig, Resolved},
    metrics::Metrics,
    pipeline::{Pipeline, PipelineConfig, StageOutput},
    recorder::{self, Recorder, RecorderConfig, SharedRecorder},
    settings::{InvalidConfig, MemoryBudget},
};

use super::budget::Ceiling;

#[derive(Debug, Default, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub budget: MemoryBudget,
    #[command(flatten)]
    pub capture: CaptureConfig,
    #[command(flatten)]
    pub identity: IdentityConfig,
    #[command(flatten)]
    pub pipeline: PipelineConfig,
    #[command(flatten)]
    pub actuate: ActuateConfig,
    #[command(flatten)]
    pub recorder: RecorderConfig,
    #[command(flatten)]
    pub api: ApiConfig,
}

/// How often published figures, claims and actuator expiry are refreshed.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);
/// Between refreshes, claims a verdict just disowned are sent at once, at most this often: a
/// storm judges many requests a second, and the shims need the first, not every one.
const CLAIMS_SOONEST: Duration = Duration::from_millis(50);
/// Decision batches waiting for the actuator task; beyond this they are dropped and counted
/// (the next evaluation re-issues live decisions, so nothing is lost for long).
const ACTUATOR_QUEUE: usize = 64;
/// While Go executables are read off the loop, how soon the next rescan looks for them.
const GO_ATTACH_POLL: Duration = Duration::from_millis(50);

enum ToActuators {
    Decisions(Vec<Decision>),
    Claims(Vec<correlate::ServiceClaim>),
    Tick,
}

pub async fn run(args: RunArgs) -> Result<()> {
    validate(&args)?;
    let ceiling = Ceiling::of(&args);
    info!(budget_mib = args.budget.mib, "memory ceiling {ceiling}");
    if ceiling.total() > args.budget.bytes() {
        warn!(
            budget_mib = args.budget.mib,
            "bounds given on their own flags exceed the memory budget: {ceiling}"
        );
    }

    // Load programs first: a node that cannot run the capture (privileges, tracefs, verifier)
    // should fail fast with that reason, not with a secondary one or while serving empty metrics.
    let mut capture = Capture::load(&args.capture).context("loading the capture programs")?;
    let capture_stats = capture.stats_handle();
    // Off the pipeline task: lookups read caches, resolutions come back on `resolved`.
    let (identity, mut resolved) = Identity::start(args.identity.clone());

    // Before any event is reassembled: every digest is keyed by the node's key.
    recorder::key::install(&args.recorder.digest_key_file);
    let metrics = Arc::new(Metrics::new());
    let state = SharedState::new(metrics.clone(), args.api.max_verdicts)
        .with_healthz_stall(Duration::from_secs(args.api.healthz_stall_secs));
    let recorder = if args.recorder.enabled {
        Some(SharedRecorder::new(
            Recorder::new(args.recorder.clone()).context("starting the flight recorder")?,
        ))
    } else {
        None
    };

    let listener = tokio::net::TcpListener::bind(args.api.addr)
        .await
        .with_context(|| format!("binding the API to {}", args.api.addr))?;
    let private = api::bind_socket(&args.api.socket).context("binding the private API socket")?;
    let dumps = recorder.clone().map(|recorder| DumpService {
        recorder,
        gate: Arc::new(DumpGate::new(Duration::from_secs(
            args.api.dump_min_interval_secs,
        ))),
        retention: Retention {
            dir: args.recorder.dump_dir.clone(),
            keep: args.api.dump_keep,
            max_bytes: args.api.dump_max_bytes,
        },
    });
    let public = api::serve_public(listener, state.clone());
    let private = api::serve_private(private, state.clone(), dumps);
    tokio::spawn(async move {
        if let Err(e) = public.await {
            warn!(error = %e, "public API server stopped");
        }
    });
    tokio::spawn(async move {
        if let Err(e) = private.await {
            warn!(error = %e, "private API server stopped");
        }
    });
    if let Some(rec) = &recorder
        && let Err(e) = recorder::spawn_sigusr1_dumps(rec.clone())
    {
        warn!(error = %e, "SIGUSR1 dumps unavailable");
    }

    let dispatcher = Dispatcher::from_config(&args.actuate).context("starting the actuators")?;
    let (to_actuators, actuator_rx) = mpsc::channel(ACTUATOR_QUEUE);
    let actuators = tokio::spawn(drive_actuators(
        dispatcher,
        actuator_rx,
        state.metrics().clone(),
    ));

    let mut pipeline = Pipeline::from_config(&args.pipeline);
    if let Some(rec) = &recorder {
        pipeline = pipeline.with_tap(rec.clone()).hand_exchanges_to_tap();
    }
    let mut out = StageOutput::default();
    // Decided and measured once, at load.
    metrics.observe_uprobes(capture.go_enabled(), capture.uprobe_cost());
    metrics.observe_gaps(capture.gaps());
    let mut publish = tokio::time::interval(PUBLISH_EVERY);
    publish.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut last_event_ns = 0u64;
    let mut claims_sent = std::time::Instant::now();
    let mut claims_due = false;
    info!(
        tls_libraries = capture.tls_libraries(),
        "retry-agent running"
    );
    // A period of zero never fires (only the scan at start).
    let rescan_every = Duration::from_secs(args.capture.tls_rescan_secs.max(1));
    let mut tls_rescan =
        tokio::time::interval_at(tokio::time::Instant::now() + rescan_every, rescan_every);
    tls_rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let go_every = Duration::from_millis(args.capture.go_rescan_ms.max(1));
    let mut go_rescan = tokio::time::interval_at(tokio::time::Instant::now() + go_every, go_every);
    go_rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    loop {
        tokio::select! {
            batch = capture.events().recv_batch() => {
                let Some(mut batch) = batch else {
                    bail!("the capture stream ended unexpectedly");
                };
                // A whole batch per wake-up: timers and signals wait at most one batch.
                pipeline.batch(|pipeline| {
                    for ev in &mut batch {
                        last_event_ns = ev.ts_ns().max(last_event_ns);
                        with_identity(ev, &identity);
                        pipeline.push(ev, &mut out);
                        drain(&mut out, pipeline, &state, &to_actuators);
                    }
                });
                capture.events().recycle(batch);
                claims_due |= pipeline.take_disowned_evidence();
                if claims_due && claims_sent.elapsed() >= CLAIMS_SOONEST {
                    send(&to_actuators, ToActuators::Claims(pipeline.engine.service_claims()));
                    claims_sent = std::time::Instant::now();
                    claims_due = false;
                }
            }
            Some(r) = resolved.recv() => {
                // Describe the container's processes again, named, through the pipeline: the
                // recorder records the name, so a replay names services as this run does.
                for ev in renamed(&r, &args.capture.proc_root) {
                    pipeline.push(&ev, &mut out);
                    drain(&mut out, &pipeline, &state, &to_actuators);
                }
            }
            _ = publish.tick() => {
                let now = monotonic_ns();
                // Evaluation follows event time while events flow; the idle tick only keeps
                // timers (expiry, lapsed decisions) moving on a quiet node.
                if now.saturating_sub(last_event_ns) > PUBLISH_EVERY.as_nanos() as u64 {
                    pipeline.tick(now, &mut out);
                    drain(&mut out, &pipeline, &state, &to_actuators);
                }
                state.publish(&pipeline.engine, &pipeline.decider);
                let c = capture_stats.snapshot();
                metrics.observe_capture(c.events, c.kernel_drops + c.channel_drops);
                metrics.observe_arg_insert_failures(&c.arg_insert_failures);
                if let Some(rec) = &recorder {
                    let _ = rec.with(|r| {
                        r.note_capture_loss(c.kernel_drops + c.channel_drops);
                        metrics.observe_recorder(&r.stats());
                    });
                }
                state.health().observe(c.events.wrapping_add(c.polls), capture.programs_attached());
                metrics.observe_tls(capture.tls_libraries());
                metrics.observe_go(capture.go_programs(), capture.go_grpc_programs());
                metrics.observe_identity(&identity.failures());
                let l = pipeline.reassembler.stats();
                metrics.observe_l7(&l);
                send(&to_actuators, ToActuators::Claims(pipeline.engine.service_claims()));
                claims_sent = std::time::Instant::now();
                // These claims include whatever was disowned until now.
                pipeline.take_disowned_evidence();
                claims_due = false;
                send(&to_actuators, ToActuators::Tick);
            }
            _ = tls_rescan.tick(), if args.capture.tls && args.capture.tls_rescan_secs > 0 => {
                // Reads /proc/*/maps inline: a few ms every half minute, events wait in the ring.
                let added = capture.rescan_tls();
                if added > 0 {
                    info!(added, total = capture.tls_libraries(), "instrumented new libssl files");
                }
            }
            _ = go_rescan.tick(), if capture.go_enabled() => {
                // Lists /proc and stats new pids' executables here; new files are read on a
                // blocking thread (~40 ms for a 12 MB gRPC-go binary) and attached next tick.
                let added = capture.rescan_go_in_background();
                if added > 0 {
                    info!(added, "instrumented new Go programs");
                }
                if capture.go_inspecting() {
                    // Attach what is being read as soon as it is, not a whole period later.
                    go_rescan.reset_after(GO_ATTACH_POLL);
                }
            }
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
        }
    }

    info!("shutting down: detaching programs");
    drop(capture);
    pipeline.finish(&mut out);
    drain(&mut out, &pipeline, &state, &to_actuators);
    // Closing the queue lets the actuators finish it, then remove what would outlive the agent.
    drop(to_actuators);
    if tokio::time::timeout(ACTUATOR_SHUTDOWN + Duration::from_secs(1), actuators)
        .await
        .is_err()
    {
        warn!("actuators did not finish shutting down in time");
    }
    let _ = std::fs::remove_file(&args.api.socket);
    Ok(())
}

/// How long the actuators get at exit to remove their overrides (Envoy's runtime keys do not lapse).
const ACTUATOR_SHUTDOWN: Duration = crate::actuate::SHUTDOWN_TIMEOUT;

/// Every configuration problem at once, before anything is loaded or bound.
fn validate(args: &RunArgs) -> Result<(), InvalidConfig> {
    let mut p = InvalidConfig::default();
    p.add(&args.budget)
        .add(&args.capture)
        .add(&args.identity)
        .add(&args.pipeline);
    p.add(&args.actuate).add(&args.recorder).add(&args.api);
    p.into_result()
}

/// Asks identity about each process capture describes, and names it when its container is
/// already known (a re-description without the name would otherwise drop it).
fn with_identity(ev: &mut Event, identity: &Identity) {
    // In place: an event is 216 bytes, and moving every one in and out showed in the profile.
    match ev {
        Event::Process(p) => {
            if let Some(parent) = p.parent {
                identity.inherit(p.pid, parent);
            }
            identity.observe(p.pid);
            if p.workload.is_none() {
                p.workload = identity.pid(p.pid);
            }
        }
        Event::ProcessExit { pid, .. } => identity.forget(*pid),
        _ => {}
    }
}

/// The processes of a newly named container, described again with the name. A process already
/// gone is skipped: describing it without its comm would read as a different program.
fn renamed(r: &Resolved, proc_root: &std::path::Path) -> Vec<Event> {
    r.pids
        .iter()
        .map(|&pid| procfs::process_info(proc_root, pid))
        .filter(|p| !p.comm.is_empty())
        .map(|mut p| {
            p.workload = Some(r.name.clone());
            Event::Process(p)
        })
        .collect()
}

/// Hands one push's or tick's results to the API and the actuators. Verdict counters come from
/// the engine's totals at publish time, so they are not counted here.
fn drain(
    out: &mut StageOutput,
    pipeline: &Pipeline,
    state: &SharedState,
    to_actuators: &mpsc::Sender<ToActuators>,
) {
    if !out.verdicts.is_empty() {
        state.record_verdicts(&out.verdicts);
    }
    if !out.decisions.is_empty() {
        state
            .metrics()
            .observe_decisions(&out.decisions, pipeline.decider.active().len());
        for d in &out.decisions {
            info!(edge = %d.edge, action = %d.action, reason = %d.reason, ttl_ms = d.ttl_ms, evidence = d.evidence.as_ref().map(crate::decide::Evidence::summary).unwrap_or_default(), "decision");
        }
        send(
            to_actuators,
            ToActuators::Decisions(std::mem::take(&mut out.decisions)),
        );
    }
    out.clear();
}

fn send(to_actuators: &mpsc::Sender<ToActuators>, msg: ToActuators) {
    if to_actuators.try_send(msg).is_err() {
        // Actuators are behind; the next evaluation re-issues what is still live.
        tracing::debug!("actuator queue full: batch dropped");
    }
}

/// Hands each batch to the dispatcher, which never blocks (every actuator has its own task).
/// Its counters reach the metrics once a tick (each second).
async fn drive_actuators(
    mut dispatcher: Dispatcher,
    mut rx: mpsc::Receiver<ToActuators>,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
) {
    while let Some(msg) = rx.recv().await {
        match msg {
            ToActuators::Decisions(ds) => dispatcher.apply(&ds),
            ToActuators::Claims(cs) => dispatcher.publish_claims(&cs),
            ToActuators::Tick => {
                dispatcher.tick();
                metrics.observe_actuators(&dispatcher.stats());
            }
        }
    }
    dispatcher.shutdown(ACTUATOR_SHUTDOWN).await;
}
