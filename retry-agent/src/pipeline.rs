//! Stages 2–4 composed: events in; exchanges, verdicts, edge figures and decisions out, through
//! the one l7 → correlate → decide code path the live agent and the offline replay share.
//!
//! Determinism is what lets a replay reproduce the live run: the driver evaluates on *event
//! time* (every `eval_every_ns` of capture time, aligned to multiples of it), and any extra tick
//! the live loop makes (an idle timer) goes through [`Pipeline::tick`], which the recorder tap
//! records as [`Record::Tick`] so the replay ticks at the same instants.
use serde::{Deserialize, Serialize};

use crate::{
    capture::Event,
    correlate::{CorrelateConfig, EdgeStats, Engine, PathStats, Verdict},
    decide::{DecideConfig, Decider, Decision},
    l7::{Exchange, L7Config, Reassembler},
    recorder::{Record, Recorder, SharedRecorder},
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
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PipelineConfig {
    pub l7: L7Config,
    pub correlate: CorrelateConfig,
    pub decide: DecideConfig,
}

/// See [`Pipeline::with_exchange_hook`].
pub type ExchangeHook = Box<dyn FnMut(&mut Exchange) + Send>;

/// Default evaluation period (capture time): decisions follow edge figures once a second.
pub const DEFAULT_EVAL_EVERY_NS: u64 = 1_000_000_000;

pub struct Pipeline {
    pub reassembler: Reassembler,
    pub engine: Engine,
    pub decider: Decider,
    eval_every_ns: u64,
    next_eval_ns: u64,
    tap: Option<SharedRecorder>,
    /// Adjusts each exchange before correlation (a replay restores the digests the live run
    /// computed from bytes the recorder masked).
    exchange_hook: Option<ExchangeHook>,
    /// Scratch buffers (reused: no allocation per event on the hot path).
    xs: Vec<Exchange>,
    vs: Vec<Verdict>,
    /// Where this push's derived records start in the output (for the tap).
    mark: (usize, usize, usize, usize),
}

impl Pipeline {
    pub fn new(l7: L7Config, correlate: CorrelateConfig, decide: DecideConfig) -> Self {
        Pipeline {
            reassembler: Reassembler::new(l7),
            engine: Engine::new(correlate),
            decider: Decider::new(decide),
            eval_every_ns: DEFAULT_EVAL_EVERY_NS,
            next_eval_ns: 0,
            tap: None,
            exchange_hook: None,
            xs: Vec::new(),
            vs: Vec::new(),
            mark: (0, 0, 0, 0),
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

    /// Evaluate decisions every `ns` of capture time (0 is treated as 1 ms).
    pub fn with_eval_every(mut self, ns: u64) -> Self {
        self.eval_every_ns = ns.max(1_000_000);
        self
    }

    /// Record every event and everything derived from it into `rec` (the live agent).
    pub fn with_recorder(mut self, rec: SharedRecorder) -> Self {
        let config = self.config();
        let _ = rec.with(|r| r.set_pipeline_config(config));
        self.tap = Some(rec);
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

    /// Feed one event (in kernel order).
    pub fn push(&mut self, ev: &Event, out: &mut StageOutput) {
        self.mark_out(out);
        match ev {
            Event::Process(p) => self.engine.on_process(p),
            Event::ProcessExit { pid, .. } => {
                self.reassembler.push(ev, &mut self.xs);
                self.engine.on_process_exit(*pid);
            }
            _ => self.reassembler.push(ev, &mut self.xs),
        }
        self.correlate(out);
        let ts = ev.ts_ns();
        let due = ts >= self.next_eval_ns && ts != 0;
        if due {
            self.evaluate(ts, out);
        }
        if let Some(tap) = &self.tap {
            let _ = tap.with(|r| {
                r.record_event(ev);
                Self::tap_out(r, out, self.mark);
            });
        }
    }

    /// Time passes without events (the live loop's idle timer): recorded, so a replay ticks too.
    pub fn tick(&mut self, now_ns: u64, out: &mut StageOutput) {
        self.mark_out(out);
        self.evaluate(now_ns, out);
        if let Some(tap) = &self.tap {
            let _ = tap.with(|r| {
                r.record(Record::Tick { now_ns });
                Self::tap_out(r, out, self.mark);
            });
        }
    }

    /// End of input (replay end, shutdown): judge everything still pending.
    pub fn finish(&mut self, out: &mut StageOutput) {
        self.engine.flush(&mut self.vs);
        out.verdicts.append(&mut self.vs);
    }

    fn mark_out(&mut self, out: &StageOutput) {
        self.mark = (out.exchanges.len(), out.verdicts.len(), out.decisions.len(), out.snapshots.len());
    }

    fn tap_out(r: &mut Recorder, out: &StageOutput, mark: (usize, usize, usize, usize)) {
        for x in out.exchanges.get(mark.0..).unwrap_or_default() {
            r.record(Record::Exchange(x.clone()));
        }
        for v in out.verdicts.get(mark.1..).unwrap_or_default() {
            r.record(Record::Verdict(v.clone()));
        }
        for s in out.snapshots.get(mark.3..).unwrap_or_default() {
            r.record(Record::Edges(s.clone()));
        }
        for d in out.decisions.get(mark.2..).unwrap_or_default() {
            r.record(Record::Decision(d.clone()));
        }
    }

    fn correlate(&mut self, out: &mut StageOutput) {
        for mut x in self.xs.drain(..) {
            if let Some(hook) = self.exchange_hook.as_mut() {
                hook(&mut x);
            }
            self.engine.push(&x, &mut self.vs);
            out.exchanges.push(x);
        }
        out.verdicts.append(&mut self.vs);
    }

    /// One evaluation at `now_ns`: l7 and correlate timers, edge figures, decisions.
    fn evaluate(&mut self, now_ns: u64, out: &mut StageOutput) {
        self.reassembler.tick(now_ns, &mut self.xs);
        self.correlate(out);
        self.engine.tick(now_ns, &mut self.vs);
        out.verdicts.append(&mut self.vs);
        let edges = self.engine.edges();
        let decisions = self.decider.evaluate_edges(&edges, now_ns);
        out.snapshots.push(EdgeSnapshot { ts_ns: now_ns, edges, paths: self.engine.paths() });
        out.decisions.extend(decisions);
        self.next_eval_ns = (now_ns / self.eval_every_ns + 1).saturating_mul(self.eval_every_ns);
    }
}
