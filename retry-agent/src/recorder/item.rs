//! What the flight recorder's ring holds per record, and what a record is charged against its
//! byte bound.
use crate::{
    capture::{ConnEvent, DataEvent, Event},
    l7::Exchange,
    pipeline::Record,
};

pub(super) struct Stored {
    pub(super) ts_ns: u64,
    pub(super) size: usize,
    pub(super) item: Item,
}

/// A record as the ring keeps it. Data and connection events (nearly every record) are held
/// inline; the rest, whose types are several times larger, behind a box, so every push into and
/// eviction from the ring moves a data event's size, not the largest record's (those moves were
/// ~6% of the agent's CPU under a keep-alive load).
pub(super) enum Item {
    Data(DataEvent),
    Conn(ConnEvent),
    Exchange(Box<Exchange>),
    Other(Box<Record>),
}

impl Item {
    pub(super) fn new(rec: Record) -> Self {
        match rec {
            Record::Event(Event::Data(d)) => Item::Data(d),
            Record::Event(Event::Conn(c)) => Item::Conn(c),
            Record::Exchange(x) => Item::Exchange(x),
            other => Item::Other(Box::new(other)),
        }
    }

    pub(super) fn to_record(&self) -> Record {
        match self {
            Item::Data(d) => Record::Event(Event::Data(d.clone())),
            Item::Conn(c) => Record::Event(Event::Conn(c.clone())),
            Item::Exchange(x) => Record::Exchange(x.clone()),
            Item::Other(r) => (**r).clone(),
        }
    }
}

/// Rough heap + inline size of a record, for the ring's byte bound (cheap: no serialisation).
pub(super) fn approx_size(rec: &Record) -> usize {
    use std::mem::size_of;
    const BASE: usize = size_of::<Stored>();
    // A boxed record's slot, its box and the allocator's header.
    const BOXED: usize = BASE + size_of::<Record>() + 16;
    match rec {
        Record::Event(Event::Data(d)) => BASE + d.payload.len(),
        Record::Event(Event::Process(p)) => {
            BOXED
                + p.comm.len()
                + p.exe.as_ref().map_or(0, String::len)
                + p.cgroup.as_ref().map_or(0, String::len)
                + p.container_id.as_ref().map_or(0, String::len)
        }
        Record::Event(Event::Conn(_)) => BASE,
        Record::Exchange(x) => {
            BASE + size_of::<Exchange>()
                + 16
                + x.authority.as_ref().map_or(0, String::len)
                + x.path.as_ref().map_or(0, String::len)
                + x.route.as_ref().map_or(0, String::len)
        }
        Record::Verdict(v) => BOXED + v.caused_by.len() * 48,
        Record::Decision(d) => BOXED + d.callee_addrs.len() * 32,
        Record::Edges(e) => BOXED + e.edges.len() * 512 + e.paths.depths.len() * 128,
        Record::Event(Event::ProcessExit { .. }) | Record::Tick { .. } => BOXED,
    }
}
