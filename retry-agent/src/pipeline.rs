//! Stages 2–4 composed: events in; exchanges, verdicts, edge figures and decisions out, through
//! the one l7 → correlate → decide code path the live agent and the offline replay share.
//!
//! Determinism is what lets a replay reproduce the live run: the driver evaluates on *event
//! time* (every [`EVAL_EVERY_NS`] of capture time, aligned to multiples of it), and any extra
//! tick the live loop makes (an idle timer) goes through [`Pipeline::tick`], which the tap sees
//! as [`Record::Tick`] so the replay ticks at the same instants.
//!
//! The pipeline owns its tap: [`Record`] is what it hands out at each stage and [`Tap`] is who
//! receives them (the flight recorder implements it). Later stages plug in here; the pipeline
//! never names them.
use serde::{Deserialize, Serialize};

use crate::{
    capture::Event,
    correlate::{CorrelateConfig, EdgeStats, Engine, PathStats, Verdict},
    decide::{DecideConfig, Decider, Decision},
    l7::{Claim, Exchange, L7Config, Reassembler},
};

/// Edge figures and call-path figures at one evaluation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EdgeSnapshot {
    pub ts_ns: u64,
    pub edges: Vec<EdgeStats>,
    pub paths: PathStats,
}

/// What one `push`/`tick` produced (append-only; the caller drains it).
#[derive(Debug, Default)]
pub struct StageOutput {
    /// Empty after a push or tick when the pipeline hands them to its tap instead
    /// ([`Pipeline::hand_exchanges_to_tap`]).
    pub exchanges: Vec<Exchange>,
    pub verdicts: Vec<Verdict>,
    pub decisions: Vec<Decision>,
    pub snapshots: Vec<EdgeSnapshot>,
}

impl StageOutput {
    pub fn clear(&mut self) {
        self.exchanges.clear();
        self.verdicts.clear();
        self.decisions.clear();
        self.snapshots.clear();
    }
}

/// The settings of every stage: what a replay needs to reproduce a live run (the flight
/// recorder writes them into each dump's header).
/// Flattened into every command that runs the pipeline (`run`, `forensics`), so each stage's
/// flags are declared once.
#[derive(clap::Args, Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PipelineConfig {
    #[command(flatten)]
    pub l7: L7Config,
    #[command(flatten)]
    pub correlate: CorrelateConfig,
    #[command(flatten)]
    pub decide: DecideConfig,
}

impl crate::settings::Settings for PipelineConfig {
    fn check(&self, p: &mut crate::settings::InvalidConfig) {
        p.add(&self.l7).add(&self.correlate).add(&self.decide);
    }
}

/// Evaluation period (capture time): decisions follow edge figures once a second.
pub const EVAL_EVERY_NS: u64 = 1_000_000_000;

/// Between evaluations, a push that produced evidence of disowned errors (an unclaimed verdict,
/// a failed call whose callee's header disowned it, or with `--decide-dependency-symptoms` any
/// failed exchange) triggers a burst evaluation, at most
/// this often (capture time): ownership decisions within tens of ms of their evidence instead
/// of after the bucket completes and the next tick.
pub const BURST_EVERY_NS: u64 = 20_000_000;

/// What the pipeline hands its tap at each stage (and what a dump file holds).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Record {
    Event(Event),
    /// Boxed: an exchange is twice the size of an event, and every record is moved into and out
    /// of the recorder's ring; inline, each move copied 408 bytes (16% of the agent's CPU under
    /// a keep-alive load, `cargo xtask bench overhead` with perf), boxed 216.
    Exchange(Box<Exchange>),
    Verdict(Verdict),
    Decision(Decision),
    /// Edge and call-path figures at one evaluation (what the decisions were made from).
    Edges(EdgeSnapshot),
    /// An evaluation the live loop made without an event (idle timer): a replay ticks here too.
    Tick {
        now_ns: u64,
    },
}

impl Record {
    /// CLOCK_MONOTONIC ns the record belongs to (0 for process metadata, which is timeless).
    pub fn ts_ns(&self) -> u64 {
        match self {
            Record::Event(e) => e.ts_ns(),
            Record::Exchange(x) => x.end_ns(),
            Record::Verdict(v) => v.ts_ns,
            Record::Decision(d) => d.issued_at_ns,
            Record::Edges(e) => e.ts_ns,
            Record::Tick { now_ns } => *now_ns,
        }
    }
}

/// What drove one push or tick.
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    /// A kernel event, by reference (a tap that keeps it copies what it needs).
    Event(&'a Event),
    /// Time passed without events: recorded as [`Record::Tick`].
    Tick { now_ns: u64 },
}

/// Receives everything the pipeline is fed and derives. Called on the pipeline's task, once per
/// push or tick: it must not block (the recorder only appends to a bounded ring).
pub trait Tap: Send {
    /// The settings of the pipeline, once, when the tap is attached.
    fn attach(&mut self, config: &PipelineConfig);
    /// One push's or tick's input, then what it derived, in stage order.
    fn tap(&mut self, input: Input<'_>, derived: Derived<'_>);
    /// A batch of pushes begins ([`Pipeline::batch`]): a tap behind a lock may take it once for
    /// all of them.
    fn hold(&mut self) {}
    /// The batch ended: let go of what [`Tap::hold`] took.
    fn release(&mut self) {}
}

/// See [`Pipeline::with_exchange_hook`].
pub type ExchangeHook = Box<dyn FnMut(&mut Exchange) + Send>;

pub struct Pipeline {
    pub reassembler: Reassembler,
    pub engine: Engine,
    pub decider: Decider,
    next_eval_ns: u64,
    /// Earliest capture time of the next burst evaluation.
    next_burst_ns: u64,
    tap: Option<Box<dyn Tap>>,
    /// Adjusts each exchange before correlation (a replay restores the digests the live run
    /// computed from bytes the recorder masked).
    exchange_hook: Option<ExchangeHook>,
    /// Scratch buffers (reused: no allocation per event on the hot path).
    vs: Vec<Verdict>,
    /// Where this push's derived records start in the output (for the tap).
    mark: (usize, usize, usize, usize),
    /// Whether `StageOutput::exchanges` keeps the exchanges a tap was handed (see
    /// [`Pipeline::hand_exchanges_to_tap`]).
    keep_exchanges: bool,
    /// Evidence of a disowned error came since the live loop last took this (see
    /// [`Pipeline::take_disowned_evidence`]).
    disowning: bool,
}

impl Pipeline {
    pub fn new(l7: L7Config, correlate: CorrelateConfig, decide: DecideConfig) -> Self {
        Pipeline {
            reassembler: Reassembler::new(l7),
            engine: Engine::new(correlate),
            decider: Decider::new(decide),
            next_eval_ns: 0,
            next_burst_ns: 0,
            tap: None,
            exchange_hook: None,
            vs: Vec::new(),
            mark: (0, 0, 0, 0),
            keep_exchanges: true,
            disowning: false,
        }
    }

    pub fn from_config(c: &PipelineConfig) -> Self {
        Self::new(c.l7.clone(), c.correlate.clone(), c.decide.clone())
    }

    /// The settings this pipeline was built with.
    pub fn config(&self) -> PipelineConfig {
        PipelineConfig {
            l7: self.reassembler.config().clone(),
            correlate: self.engine.config().clone(),
            decide: self.decider.config().clone(),
        }
    }

    /// Hand every event and everything derived from it to `tap` (the live agent's recorder).
    pub fn with_tap(mut self, mut tap: impl Tap + 'static) -> Self {
        tap.attach(&self.config());
        self.tap = Some(Box::new(tap));
        self
    }

    /// For a caller that never reads [`StageOutput::exchanges`] (the live loop): each push's
    /// exchanges leave the output once the tap read them (by reference), instead of staying
    /// there for the caller. A copy of every exchange for the tap was ~5% of the agent's CPU
    /// under a keep-alive load, moving it into the tap ~1.4% of its profile.
    pub fn hand_exchanges_to_tap(mut self) -> Self {
        self.keep_exchanges = false;
        self
    }

    /// Run `hook` on every exchange before correlation (the replay's recorded digests).
    pub fn with_exchange_hook(mut self, hook: ExchangeHook) -> Self {
        self.exchange_hook = Some(hook);
        self
    }

    /// Set or clear the exchange hook on a built pipeline.
    pub fn set_exchange_hook(&mut self, hook: Option<ExchangeHook>) {
        self.exchange_hook = hook;
    }

    /// Run `f`'s pushes and ticks as one batch for the tap (see [`Tap::hold`]): the live loop
    /// feeds each drain of the ring this way, and a lock per event was ~4% of the agent's CPU
    /// under a keep-alive load.
    pub fn batch<R>(&mut self, f: impl FnOnce(&mut Pipeline) -> R) -> R {
        if let Some(tap) = &mut self.tap {
            tap.hold();
        }
        let r = f(self);
        if let Some(tap) = &mut self.tap {
            tap.release();
        }
        r
    }

    /// Feed one event (in kernel order).
    pub fn push(&mut self, ev: &Event, out: &mut StageOutput) {
        self.mark_out(out);
        match ev {
            Event::Process(p) => self.engine.on_process(p),
            Event::ProcessExit { pid, .. } => {
                self.reassembler.push(ev, &mut out.exchanges);
                self.engine.on_process_exit(*pid);
            }
            _ => self.reassembler.push(ev, &mut out.exchanges),
        }
        self.correlate(out, self.mark.0);
        let disowning = disowned(out, self.mark);
        self.disowning |= disowning;
        let ts = ev.ts_ns();
        let due = ts >= self.next_eval_ns && ts != 0;
        let cfg = self.decider.config();
        if due {
            self.evaluate(ts, out);
        } else if cfg.burst
            && ts >= self.next_burst_ns
            && ts != 0
            // A failed exchange is evidence too where dependency symptoms are on: services
            // that get no verdicts (untraced event loops in a hard fault) are judged from
            // failure ratios. Looked for only when a burst is due, not on every push.
            && (disowning || cfg.dependency_symptoms && failed(out, self.mark.0))
        {
            self.burst(ts, out);
        }
        self.hand_to_tap(Input::Event(ev), out);
    }

    /// What this push or tick derived, to the tap (if any); with `keep_exchanges` off the
    /// exchanges then leave the output.
    fn hand_to_tap(&mut self, input: Input<'_>, out: &mut StageOutput) {
        if let Some(tap) = &mut self.tap {
            tap.tap(input, Derived::new(out, self.mark));
            if !self.keep_exchanges {
                out.exchanges.truncate(self.mark.0);
            }
        }
    }

    /// Whether a verdict (or a callee's claim header) disowned an error since the last call. The live loop then publishes
    /// the services' claims at once instead of on its once-a-second refresh: a shim stamps a
    /// disowned error's claim header on the next failure, which is what lets the callers of a
    /// node it cannot see (or of its own services, whose inbound connections come from the
    /// shim's address) stop retrying within tens of ms.
    pub fn take_disowned_evidence(&mut self) -> bool {
        std::mem::take(&mut self.disowning)
    }

    /// Time passes without events (the live loop's idle timer): recorded, so a replay ticks too.
    pub fn tick(&mut self, now_ns: u64, out: &mut StageOutput) {
        self.mark_out(out);
        self.evaluate(now_ns, out);
        self.hand_to_tap(Input::Tick { now_ns }, out);
    }

    /// End of input (replay end, shutdown): judge everything still pending.
    pub fn finish(&mut self, out: &mut StageOutput) {
        self.engine.flush(&mut self.vs);
        out.verdicts.append(&mut self.vs);
    }

    fn mark_out(&mut self, out: &StageOutput) {
        self.mark = (
            out.exchanges.len(),
            out.verdicts.len(),
            out.decisions.len(),
            out.snapshots.len(),
        );
    }

    /// Correlates the exchanges l7 added to `out` from index `from` on. l7 writes them there
    /// directly: an exchange (440 bytes) moved through a staging vector on its way was ~3% of
    /// the agent's profile under a keep-alive load.
    fn correlate(&mut self, out: &mut StageOutput, from: usize) {
        for x in out.exchanges.get_mut(from..).unwrap_or_default() {
            if let Some(hook) = self.exchange_hook.as_mut() {
                hook(x);
            }
            self.engine.push(x, &mut self.vs);
        }
        out.verdicts.append(&mut self.vs);
    }

    /// Ownership decisions from figures that include the current bucket (see
    /// [`BURST_EVERY_NS`]). Deterministic on the event stream like the tick, so a replay makes
    /// the same ones; it records no edge snapshot (each decision carries its evidence).
    fn burst(&mut self, now_ns: u64, out: &mut StageOutput) {
        let edges = self.engine.edges_through_now();
        out.decisions
            .extend(self.decider.evaluate_burst(&edges, now_ns));
        self.next_burst_ns = now_ns.saturating_add(BURST_EVERY_NS);
    }

    /// One evaluation at `now_ns`: l7 and correlate timers, edge figures, decisions.
    fn evaluate(&mut self, now_ns: u64, out: &mut StageOutput) {
        let from = out.exchanges.len();
        self.reassembler.tick(now_ns, &mut out.exchanges);
        self.correlate(out, from);
        self.engine.tick(now_ns, &mut self.vs);
        out.verdicts.append(&mut self.vs);
        let edges = self.engine.edges();
        let decisions = self.decider.evaluate_edges(&edges, now_ns);
        out.snapshots.push(EdgeSnapshot {
            ts_ns: now_ns,
            edges,
            paths: self.engine.paths(),
        });
        out.decisions.extend(decisions);
        self.next_eval_ns = (now_ns / EVAL_EVERY_NS + 1).saturating_mul(EVAL_EVERY_NS);
    }
}

#[cfg(test)]
mod tests;

/// Whether this push produced evidence that a callee disowns its errors.
fn disowned(out: &StageOutput, mark: (usize, usize, usize, usize)) -> bool {
    let vs = out.verdicts.get(mark.1..).unwrap_or_default();
    let xs = out.exchanges.get(mark.0..).unwrap_or_default();
    vs.iter().any(|v| v.claim == Claim::Unclaimed)
        || xs
            .iter()
            .any(|x| x.failed() && x.claim_header == Some(Claim::Unclaimed))
}

/// Whether an exchange this push derived failed.
fn failed(out: &StageOutput, from: usize) -> bool {
    out.exchanges
        .get(from..)
        .unwrap_or_default()
        .iter()
        .any(Exchange::failed)
}

/// The records one push or tick gained, in stage order: exchanges, verdicts, edge figures,
/// decisions. As an iterator it yields [`Record`]s; a tap that keeps exchanges as they are
/// takes them first with [`Derived::next_exchange`], by reference (a box per exchange, made
/// here and freed in the recorder, was ~2% of the agent's CPU under a keep-alive load).
pub struct Derived<'a> {
    exchanges: std::slice::Iter<'a, Exchange>,
    verdicts: std::slice::Iter<'a, Verdict>,
    snapshots: std::slice::Iter<'a, EdgeSnapshot>,
    decisions: std::slice::Iter<'a, Decision>,
}

impl<'a> Derived<'a> {
    fn new(out: &'a StageOutput, mark: (usize, usize, usize, usize)) -> Self {
        Derived {
            exchanges: out.exchanges.get(mark.0..).unwrap_or_default().iter(),
            verdicts: out.verdicts.get(mark.1..).unwrap_or_default().iter(),
            snapshots: out.snapshots.get(mark.3..).unwrap_or_default().iter(),
            decisions: out.decisions.get(mark.2..).unwrap_or_default().iter(),
        }
    }

    /// The next exchange, before any other record.
    pub fn next_exchange(&mut self) -> Option<&'a Exchange> {
        self.exchanges.next()
    }
}

impl Iterator for Derived<'_> {
    type Item = Record;

    fn next(&mut self) -> Option<Record> {
        if let Some(x) = self.next_exchange() {
            return Some(Record::Exchange(Box::new(x.clone())));
        }
        if let Some(v) = self.verdicts.next() {
            return Some(Record::Verdict(v.clone()));
        }
        if let Some(e) = self.snapshots.next() {
            return Some(Record::Edges(e.clone()));
        }
        self.decisions.next().cloned().map(Record::Decision)
    }
}
