//! What the flight recorder's ring holds per record, and what a record is charged against its
//! byte bound.
use std::collections::VecDeque;

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
/// ~6% of the agent's CPU under a keep-alive load). Exchanges (one per request) are neither:
/// they sit inline in a ring of their own ([`Exchanges`]), in the same order, so letting one go
/// reads memory the prefetcher has already brought in, instead of freeing a cold box (those
/// frees were ~15% of the agent's CPU under a keep-alive load).
pub(super) enum Item {
    Data(DataEvent),
    Conn(ConnEvent),
    /// The next exchange of the exchange ring.
    Exchange,
    Other(Box<Record>),
}

/// The recorder's exchanges, oldest first: one per [`Item::Exchange`] of the main ring. Held in
/// blocks of [`Exchanges::BLOCK`], not one deque: a deque doubles its buffer as it grows, so at
/// the ring's steady size up to half of a large allocation sat unused (+10 MiB of peak RSS under
/// a keep-alive load), while a block is allocated and freed whole, once per `BLOCK` exchanges.
#[derive(Default)]
pub(super) struct Exchanges {
    blocks: VecDeque<VecDeque<Exchange>>,
}

impl Exchanges {
    const BLOCK: usize = 64;

    pub(super) fn push_back(&mut self, x: Exchange) {
        match self.blocks.back_mut() {
            Some(b) if b.len() < Self::BLOCK => b.push_back(x),
            _ => {
                let mut b = VecDeque::with_capacity(Self::BLOCK);
                b.push_back(x);
                self.blocks.push_back(b);
            }
        }
    }

    /// Drop the `n` oldest exchanges in place (whole blocks where it can).
    pub(super) fn drop_front(&mut self, mut n: usize) {
        while n > 0 {
            let Some(first) = self.blocks.front_mut() else {
                return;
            };
            if first.len() <= n {
                n -= first.len();
                self.blocks.pop_front();
            } else {
                first.drain(..n);
                return;
            }
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Exchange> {
        self.blocks.iter().flatten()
    }
}

impl Item {
    /// The ring's item for `rec`, not an exchange (those go to [`Exchanges`], marked by
    /// [`Item::Exchange`]).
    pub(super) fn new(rec: Record) -> Self {
        match rec {
            Record::Event(Event::Data(d)) => Item::Data(d),
            Record::Event(Event::Conn(c)) => Item::Conn(c),
            other => Item::Other(Box::new(other)),
        }
    }

    /// The record again; `next_exchange` yields the exchange ring's entries in order.
    pub(super) fn to_record<'a>(
        &self,
        next_exchange: &mut impl Iterator<Item = &'a Exchange>,
    ) -> Option<Record> {
        Some(match self {
            Item::Data(d) => Record::Event(Event::Data(d.clone())),
            Item::Conn(c) => Record::Event(Event::Conn(c.clone())),
            Item::Exchange => Record::Exchange(Box::new(next_exchange.next()?.clone())),
            Item::Other(r) => (**r).clone(),
        })
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
        Record::Exchange(x) => exchange_size(x),
        Record::Verdict(v) => BOXED + v.caused_by.len() * 48,
        Record::Decision(d) => BOXED + d.callee_addrs.len() * 32,
        Record::Edges(e) => BOXED + e.edges.len() * 512 + e.paths.depths.len() * 128,
        Record::Event(Event::ProcessExit { .. }) | Record::Tick { .. } => BOXED,
    }
}

/// An exchange's charge: its slot in the ring, its place inline in the exchange ring, and its
/// strings' heap (none when short).
pub(super) fn exchange_size(x: &Exchange) -> usize {
    size_of::<Stored>()
        + size_of::<Exchange>()
        + x.authority.as_ref().map_or(0, heap_len)
        + x.path.as_ref().map_or(0, heap_len)
        + x.route.as_ref().map_or(0, heap_len)
}

/// Heap bytes of an exchange's string: none when it is held inline.
fn heap_len(t: &crate::l7::Text) -> usize {
    if t.is_heap_allocated() { t.len() } else { 0 }
}
