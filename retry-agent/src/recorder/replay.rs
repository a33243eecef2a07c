//! Offline replay: recorded events (and the live loop's recorded ticks) through a fresh
//! [`Pipeline`], the same driver the live agent runs.
//!
//! The recorder masks query strings and bodies, so the bytes a replay reassembles cannot give
//! the digests retry matching compares (distinct `?id=1` and `?id=2` would both read `?****`
//! and replay as retries of each other). The live run recorded each exchange with its keyed
//! digests; the replay restores them ([`RecordedDigests`]) before correlation, so it sees
//! what the live detector saw without any secret in the dump.
use std::collections::{HashMap, VecDeque};

use crate::{
    capture::{ConnId, Role},
    correlate::Verdict,
    decide::Decision,
    l7::{Exchange, Text},
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
    /// Exchanges whose digests came from the live run's records.
    pub digests_restored: u64,
    /// Of `verdicts`, the last ones: requests still waiting for their verdict when the records
    /// end (a dump is cut while the live run goes on), judged by the replay's final flush.
    pub judged_at_end: usize,
}

/// One exchange as the live l7 stage saw it, recognised again by where and when it started.
type ExchangeKey = (ConnId, Role, Option<u32>, u64);

/// What the live run derived from bytes the recorder masked: the query and body digests and
/// the path (a Huffman-coded `:path` may not survive masking).
#[derive(Clone, Debug)]
struct Live {
    path: Option<Text>,
    route: Option<Text>,
    query_hash: Option<u64>,
    body_hash: Option<u64>,
}

/// The live run's digests, from the exchanges it recorded (in order: pipelined requests that
/// started in one record share a key and are restored in the order the live run saw them).
#[derive(Clone, Debug, Default)]
pub struct RecordedDigests(HashMap<ExchangeKey, VecDeque<Live>>);

impl RecordedDigests {
    pub fn from_records<'a>(records: impl IntoIterator<Item = &'a Record>) -> Self {
        let mut m = HashMap::new();
        for r in records {
            if let Record::Exchange(x) = r {
                m.entry(key(x))
                    .or_insert_with(VecDeque::new)
                    .push_back(Live {
                        path: x.path.clone(),
                        route: x.route.clone(),
                        query_hash: x.query_hash,
                        body_hash: x.body_hash,
                    });
            }
        }
        RecordedDigests(m)
    }

    /// Restore what the live run saw on `x`; false if it recorded no such exchange (then the
    /// digests of the masked bytes stay: equal masks may then look like retries).
    pub fn restore(&mut self, x: &mut Exchange) -> bool {
        let Some(l) = self.0.get_mut(&key(x)).and_then(VecDeque::pop_front) else {
            return false;
        };
        x.query_hash = l.query_hash;
        x.body_hash = l.body_hash;
        if l.path.is_some() {
            x.path = l.path;
            x.route = l.route;
        }
        true
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn key(x: &Exchange) -> ExchangeKey {
    (x.conn, x.role, x.stream_id, x.request_start_ns)
}

/// Replay recorded events (and recorded live ticks) through a fresh pipeline, with the live
/// run's digests restored on every exchange it recorded.
pub fn replay<'a>(
    pipeline: &mut Pipeline,
    records: impl IntoIterator<Item = &'a Record> + Clone,
) -> Replayed {
    let mut digests = RecordedDigests::from_records(records.clone());
    let restored = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = restored.clone();
    pipeline.set_exchange_hook(Some(Box::new(move |x: &mut Exchange| {
        if digests.restore(x) {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    })));
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
    let judged_before_end = out.verdicts.len();
    pipeline.finish(&mut out);
    pipeline.set_exchange_hook(None);
    Replayed {
        events,
        exchanges: out.exchanges,
        judged_at_end: out.verdicts.len().saturating_sub(judged_before_end),
        verdicts: out.verdicts,
        decisions: out.decisions,
        snapshots: out.snapshots,
        digests_restored: restored.load(std::sync::atomic::Ordering::Relaxed),
    }
}
