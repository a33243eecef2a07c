//! Offline replay: recorded events (and the live loop's recorded ticks) through a fresh
//! [`Pipeline`], the same driver the live agent runs.
use crate::{
    correlate::Verdict,
    decide::Decision,
    l7::Exchange,
    pipeline::{EdgeSnapshot, Pipeline, Record, StageOutput},
};

/// Everything a replay produced, in order.
#[derive(Debug, Default)]
pub struct Replayed {
    pub events: u64,
    pub exchanges: Vec<Exchange>,
    pub verdicts: Vec<Verdict>,
    pub decisions: Vec<Decision>,
    pub snapshots: Vec<EdgeSnapshot>,
}

/// Replay recorded events (and recorded live ticks) through a fresh pipeline.
pub fn replay<'a>(pipeline: &mut Pipeline, records: impl IntoIterator<Item = &'a Record>) -> Replayed {
    let mut out = StageOutput::default();
    let mut events = 0;
    for r in records {
        match r {
            Record::Event(ev) => {
                events += 1;
                pipeline.push(ev, &mut out);
            }
            Record::Tick { now_ns } => pipeline.tick(*now_ns, &mut out),
            _ => {}
        }
    }
    pipeline.finish(&mut out);
    Replayed {
        events,
        exchanges: out.exchanges,
        verdicts: out.verdicts,
        decisions: out.decisions,
        snapshots: out.snapshots,
    }
}
