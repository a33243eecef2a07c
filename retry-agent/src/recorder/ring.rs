//! The flight recorder's ring, and what a record is charged against its byte bound.
//!
//! Data events (nearly every record) are encoded as bytes, header then redacted payload, into
//! blocks of [`BLOCK`] bytes: recording one is two appends to a block, and letting records go
//! is moving a block's start forward or freeing a block whole, unread (per-block counts). Held
//! as structs (a 272-byte ring slot each, payloads in reference-counted buffers), storing and
//! evicting them was 13% of the agent's CPU under a keep-alive load and the buffers' atomic
//! counts another 4%; now ~6%, and a data record takes ~80 bytes before its payload, so the same
//! bound keeps 1.6× the history.
//!
//! Exchanges (one per request) are encoded into the same blocks (`codec::exchange`, ~150 bytes
//! instead of a 440-byte struct in a ring of their own). The rare other records (connection
//! events, verdicts, decisions, ticks) stay structs, in a ring of their own in the same order;
//! the byte ring holds a marker for each, so the order of all records is the byte ring's.
//!
//! Byte blocks and the other records are shared (`Arc`), and a block is only appended to while
//! the ring alone holds it: a dump's snapshot ([`Ring::freeze`]) shares the blocks instead of
//! decoding every record under the recorder's lock. That took 53 ms and +95 MB for a full
//! 64 MiB ring, during which the live pipeline waited; a frozen ring is decoded one record at
//! a time as the dump is written. What it costs is the blocks the ring lets go meanwhile: the
//! ring keeps them on its books (`retired`) until every snapshot let them go, and its bound
//! counts them, so a dump or a storm's held onset never takes the recorder past its bound
//! (under load the ring then keeps less new history until the writer, which lets each block
//! go once written, is done).
use std::{
    collections::VecDeque,
    ops::Deref,
    sync::{Arc, Weak},
};

use bytes::Bytes;

use self::codec::{
    HEADER, Header, KIND_DATA, KIND_EXCHANGE, KIND_OTHER, KIND_SUMMARY, decode_data,
    decode_exchange, decode_summary, meta_len, put_exchange, put_meta, put_summary, summary_len,
};
use crate::{
    capture::{DataEvent, Event, SummaryEvent},
    l7::Exchange,
    pipeline::Record,
};

mod codec;
mod read;

pub(super) use self::read::Frozen;
use self::read::{FrozenBlock, unpack};
#[cfg(test)]
use self::read::{Iter, View};

/// Size of a byte block (a larger record gets a block of its own size).
const BLOCK: usize = 64 * 1024;
/// zstd level a full block is packed at: the ring's blocks under an h2c load packed 6.1x at
/// 470 MB/s (lz4: 3.7x at 910 MB/s; zstd's fast levels lose ratio and gain little speed).
const PACK_LEVEL: i32 = 1;

#[derive(Default)]
struct Block {
    /// Shared with snapshots; appended to only while unshared ([`Ring::block_for`]). A packed
    /// block holds a zstd frame of its records instead (`packed`).
    buf: Arc<Vec<u8>>,
    /// Packed: the length of the records unpacked, and the oldest one's time (records are not
    /// read out of a packed block one by one: it is let go whole).
    packed: Option<(usize, u64)>,
    /// Where the block's first record still in the ring starts, and its sequence number.
    start: usize,
    start_seq: u64,
    /// The records from `start` on: how many, of which others, their charges.
    records: usize,
    others: usize,
    charge: usize,
    /// The newest record's time: a block older than the horizon goes whole, unread.
    newest_ns: u64,
    /// What its other records' structs are charged (their markers aside).
    structs: usize,
}

impl Block {
    fn add(&mut self, kind: u8, charge: usize, ts_ns: u64) {
        self.records += 1;
        if kind == KIND_OTHER {
            self.others += 1;
            self.structs += charge.saturating_sub(HEADER);
        }
        self.charge += charge;
        self.newest_ns = self.newest_ns.max(ts_ns);
    }
}

/// The recorder's records, oldest first.
#[derive(Default)]
pub(super) struct Ring {
    blocks: VecDeque<Block>,
    /// The last block let go, reused for the next one (blocks come and go at the record rate).
    spare: Option<Vec<u8>>,
    /// An exchange's encoding, before it goes into a block.
    scratch: Vec<u8>,
    /// Full blocks are packed ([`Ring::pack_last`]) while the ring holds at least this many
    /// bytes (`None`: never).
    pack_above: Option<usize>,
    /// Packs full blocks (made at the first one) and the room it packs into.
    packer: Option<zstd::bulk::Compressor<'static>>,
    packing: Vec<u8>,
    /// Shared with snapshots, as the blocks are.
    others: VecDeque<Arc<Record>>,
    records: usize,
    bytes: usize,
    /// Records ever pushed: the next record's sequence number.
    pushed: u64,
    /// Blocks let go while a snapshot held them, and what they hold: memory the ring's bound
    /// still counts until the last snapshot holding one lets it go.
    retired: Vec<(Weak<Vec<u8>>, usize)>,
    /// Their sum, as of the last [`Ring::recount_held`] (an upper bound: snapshots may have let
    /// blocks go since).
    retired_bytes: usize,
}

/// What [`Ring::evict`] let go.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Evicted {
    pub(super) aged: u64,
    pub(super) sized: u64,
}

/// One record of the ring, as [`Ring::iter`] yields it.
pub(super) enum Entry<'a> {
    /// An encoded data event and its time (decoded by [`Entry::to_record`]).
    Data(u64, Rec<'a>),
    /// An encoded kernel summary and its time.
    Summary(u64, Rec<'a>),
    /// An encoded exchange.
    Exchange(Rec<'a>),
    Other(&'a Record),
}

/// An encoded record: in a plain block where it lies, or in a packed one's unpacked copy.
pub(super) enum Rec<'a> {
    In(&'a [u8]),
    Unpacked(Bytes),
}

impl Deref for Rec<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Rec::In(b) => b,
            Rec::Unpacked(b) => b,
        }
    }
}

impl Entry<'_> {
    /// The record again (`None` only for an encoding that does not decode, which the ring
    /// never writes).
    pub(super) fn to_record(&self) -> Option<Record> {
        Some(match self {
            Entry::Data(ts, b) => Record::Event(Event::Data(decode_data(*ts, b)?)),
            Entry::Summary(ts, b) => Record::Event(Event::Summary(decode_summary(*ts, b)?)),
            Entry::Exchange(b) => Record::Exchange(Box::new(decode_exchange(b)?)),
            Entry::Other(r) => (*r).clone(),
        })
    }
}

impl Ring {
    /// `pack_above`: full blocks are packed while the ring holds at least that many bytes.
    pub(super) fn new(pack_above: Option<usize>) -> Self {
        Ring {
            pack_above,
            ..Ring::default()
        }
    }

    pub(super) fn len(&self) -> usize {
        self.records
    }

    /// The sum of the records' charges.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes of blocks the ring let go that snapshots still hold, at most (cheap: a sum kept
    /// as blocks are retired; [`Ring::recount_held`] counts again).
    pub(super) fn held_at_most(&self) -> usize {
        self.retired_bytes
    }

    /// Bytes of blocks the ring let go that snapshots still hold now.
    pub(super) fn held(&self) -> usize {
        self.retired
            .iter()
            .filter(|(block, _)| block.strong_count() > 0)
            .map(|(_, n)| n)
            .sum()
    }

    /// Forgets the retired blocks every snapshot let go; returns what the rest hold.
    pub(super) fn recount_held(&mut self) -> usize {
        self.retired.retain(|(block, _)| block.strong_count() > 0);
        self.retired_bytes = self.held();
        self.retired_bytes
    }

    /// Sequence number of the oldest record (the next one's when empty).
    pub(super) fn front_seq(&self) -> u64 {
        self.blocks.front().map_or(self.pushed, |b| b.start_seq)
    }

    /// Time of the oldest record.
    pub(super) fn front_ts(&self) -> Option<u64> {
        let b = self.blocks.front()?;
        if let Some((_, oldest)) = b.packed {
            return Some(oldest);
        }
        Some(Header::read(b.buf.get(b.start..)?)?.ts_ns)
    }

    /// Append a data event whose payload `redact` masks in place once copied; `redact` returns
    /// how many of the payload's bytes to keep. The rest, a masked body's dots, are left out as
    /// a capture leaves out what is past its prefix: the event's `len` still counts them, so the
    /// reassembler frames the record as it framed the live one (bodies are skipped by counting),
    /// and the same bound holds that much more history (a masked body is most of a response's
    /// captured bytes).
    pub(super) fn push_data(&mut self, d: &DataEvent, redact: impl FnOnce(&mut [u8]) -> usize) {
        let header = |len| Header {
            len,
            kind: KIND_DATA,
            charge: len,
            ts_ns: d.ts_exit_ns,
        };
        let most = HEADER + meta_len(d) + d.payload.len();
        let block = self.block_for(most);
        // Unshared (`block_for`): no copy.
        let buf = Arc::make_mut(&mut block.buf);
        let start = buf.len();
        header(most).put(buf);
        put_meta(buf, d);
        let at = buf.len();
        buf.extend_from_slice(&d.payload);
        let keep = buf.get_mut(at..).map_or(0, redact);
        buf.truncate(at + keep);
        let len = buf.len() - start;
        header(len).overwrite(buf.get_mut(start..).unwrap_or_default());
        block.add(KIND_DATA, len, d.ts_exit_ns);
        self.records += 1;
        self.pushed += 1;
        self.bytes += len;
    }

    /// Append a kernel summary; `redact` redacts its request's bytes in place and says how many
    /// to keep, as for [`Self::push_data`].
    pub(super) fn push_summary(
        &mut self,
        s: &SummaryEvent,
        redact: impl FnOnce(&mut [u8]) -> usize,
    ) {
        let ts_ns = s.response.ts_exit_ns;
        let header = |len| Header {
            len,
            kind: KIND_SUMMARY,
            charge: len,
            ts_ns,
        };
        let most = HEADER + summary_len(s);
        let block = self.block_for(most);
        // Unshared (`block_for`): no copy.
        let buf = Arc::make_mut(&mut block.buf);
        let start = buf.len();
        header(most).put(buf);
        put_summary(buf, s);
        let at = buf.len() - s.request.payload.len();
        let keep = buf.get_mut(at..).map_or(0, redact);
        buf.truncate(at + keep);
        let len = buf.len() - start;
        header(len).overwrite(buf.get_mut(start..).unwrap_or_default());
        block.add(KIND_SUMMARY, len, ts_ns);
        self.records += 1;
        self.pushed += 1;
        self.bytes += len;
    }

    pub(super) fn push_exchange(&mut self, x: &Exchange) {
        // Encoded aside first: its length decides the block.
        let mut enc = std::mem::take(&mut self.scratch);
        enc.clear();
        put_exchange(&mut enc, x);
        let len = HEADER + enc.len();
        let ts_ns = x.end_ns();
        let block = self.block_for(len);
        let buf = Arc::make_mut(&mut block.buf);
        Header {
            len,
            kind: KIND_EXCHANGE,
            charge: len,
            ts_ns,
        }
        .put(buf);
        buf.extend_from_slice(&enc);
        block.add(KIND_EXCHANGE, len, ts_ns);
        self.records += 1;
        self.pushed += 1;
        self.bytes += len;
        self.scratch = enc;
    }

    /// Any record but a data event or an exchange (those have their own pushes).
    pub(super) fn push_other(&mut self, rec: Record) {
        self.push_marker(KIND_OTHER, approx_size(&rec), rec.ts_ns());
        self.others.push_back(Arc::new(rec));
    }

    /// Let go of the oldest records while they are older than `horizon` or the charges, with
    /// what snapshots hold of the blocks let go before ([`Ring::held`]), exceed `target`: stops
    /// at the first record that is neither (records are in arrival order). Over `target`, whole
    /// blocks go (the bound is met within a block's worth of bytes): evicting does not read the
    /// records it lets go, which sit in memory long out of the caches. A block a snapshot holds
    /// frees nothing when it goes (it joins the retired ones), so newer blocks go after it.
    pub(super) fn evict(&mut self, horizon: u64, target: usize) -> Evicted {
        let mut ev = Evicted::default();
        let mut others = 0;
        while let Some(b) = self.blocks.front_mut() {
            let aged = b.newest_ns < horizon;
            if !aged && self.bytes + self.retired_bytes <= target {
                if b.packed.is_some() {
                    // Kept whole until its newest record ages.
                    break;
                }
                // Only its oldest records may have aged: read them one by one.
                while let Some(h) = b.buf.get(b.start..).and_then(Header::read) {
                    if h.ts_ns >= horizon {
                        break;
                    }
                    ev.aged += 1;
                    b.records -= 1;
                    b.charge = b.charge.saturating_sub(h.charge);
                    self.bytes = self.bytes.saturating_sub(h.charge);
                    self.records = self.records.saturating_sub(1);
                    if h.kind == KIND_OTHER {
                        b.others -= 1;
                        others += 1;
                    }
                    b.start += h.len;
                    b.start_seq += 1;
                }
                if b.records > 0 {
                    break;
                }
            } else if aged {
                ev.aged += b.records as u64;
            } else {
                ev.sized += b.records as u64;
            }
            self.bytes = self.bytes.saturating_sub(b.charge);
            self.records = self.records.saturating_sub(b.records);
            others += b.others;
            match self.blocks.pop_front().map(|b| Arc::try_unwrap(b.buf)) {
                Some(Ok(mut done)) if done.capacity() == BLOCK => {
                    done.clear();
                    self.spare = Some(done);
                }
                // A block a snapshot still holds is freed with the snapshot; until then it
                // counts.
                Some(Err(held)) => {
                    let n = held.capacity();
                    self.retired_bytes += n;
                    self.retired.push((Arc::downgrade(&held), n));
                }
                _ => {}
            }
        }
        self.others.drain(..others.min(self.others.len()));
        ev
    }

    /// Every record, oldest first, with its time (dumps read a frozen ring instead).
    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, Entry<'_>)> {
        Iter::new(
            self.blocks.iter().map(|b| {
                Some(match b.packed {
                    Some((len, _)) => (View::Packed(&b.buf, len, b.others), b.start),
                    None => (View::Plain(&b.buf), b.start),
                })
            }),
            self.others.iter().map(|r| &**r),
        )
    }

    /// The records from sequence number `since_seq` on (an earlier snapshot's `end_seq`: the two
    /// then hold every record the ring kept once), from the first block holding one at or
    /// after `from_ns`, and at most the newest `max_bytes` of them (by whole blocks), frozen:
    /// the blocks are shared, not copied or decoded (what a dump's snapshot takes under the
    /// lock).
    pub(super) fn freeze(&self, from_ns: u64, since_seq: u64, max_bytes: usize) -> Frozen {
        let (mut skipped, mut others) = (0, 0);
        let mut blocks = Vec::with_capacity(self.blocks.len());
        let mut first_seq = None;
        let mut left = self.bytes;
        for b in &self.blocks {
            let over = left > max_bytes;
            left = left.saturating_sub(b.charge);
            if blocks.is_empty() && b.start_seq + b.records as u64 <= since_seq {
                // Records an earlier snapshot holds: left out, not missing.
                others += b.others;
            } else if blocks.is_empty() && (b.newest_ns < from_ns || over) {
                // Whole blocks before the range or past the bytes asked for: left out unread,
                // counted as missing.
                skipped += b.records as u64;
                others += b.others;
            } else if blocks.is_empty() && b.start_seq < since_seq {
                // The block where the earlier snapshot ended: walk past its records (a packed
                // one is unpacked for it, rarely: a storm's after-window ending mid-block).
                let buf = match b.packed {
                    Some((len, _)) => match unpack(&b.buf, len) {
                        Some(plain) => Arc::new(Vec::from(plain)),
                        None => {
                            // Lost whole, its markers' structs with it.
                            others += b.others;
                            continue;
                        }
                    },
                    None => b.buf.clone(),
                };
                let mut at = b.start;
                for _ in b.start_seq..since_seq {
                    let Some(h) = buf.get(at..).and_then(Header::read) else {
                        break;
                    };
                    others += usize::from(h.kind == KIND_OTHER);
                    at += h.len;
                }
                first_seq = Some(since_seq);
                blocks.push(FrozenBlock {
                    buf,
                    start: at,
                    packed: None,
                });
            } else {
                first_seq.get_or_insert(b.start_seq);
                blocks.push(FrozenBlock {
                    buf: b.buf.clone(),
                    start: b.start,
                    packed: b.packed.map(|(len, _)| (len, b.others)),
                });
            }
        }
        Frozen {
            blocks,
            others: self.others.iter().skip(others).cloned().collect(),
            skipped,
            first_seq: first_seq.unwrap_or(self.pushed),
            end_seq: self.pushed,
        }
    }

    /// A record held outside the byte blocks (`size`: its own charge): its header alone marks
    /// its place.
    fn push_marker(&mut self, kind: u8, size: usize, ts_ns: u64) {
        let charge = HEADER + size;
        let block = self.block_for(HEADER);
        block.add(kind, charge, ts_ns);
        Header {
            len: HEADER,
            kind,
            charge,
            ts_ns,
        }
        .put(Arc::make_mut(&mut block.buf));
        self.records += 1;
        self.pushed += 1;
        self.bytes += charge;
    }

    /// Packs the last block, now full, when no snapshot holds it and none of its records has
    /// gone: its charge becomes its packed size (and its other records' structs), so the same
    /// bound keeps that much more history. Dumps unpack it; a block that packs poorly stays.
    /// Only a ring that nears its bound packs: until then packing would keep no more history,
    /// and the CPU (zstd, ~0.5 GB/s here) is spent only where it buys some.
    fn pack_last(&mut self) {
        if self
            .pack_above
            .is_none_or(|above| self.bytes + self.retired_bytes < above)
        {
            return;
        }
        let Some(b) = self.blocks.back_mut() else {
            return;
        };
        if b.packed.is_some() || b.start != 0 || b.records == 0 {
            return;
        }
        let Some(plain) = Arc::get_mut(&mut b.buf) else {
            return;
        };
        let Some(oldest) = Header::read(plain).map(|h| h.ts_ns) else {
            return;
        };
        let packer = match &mut self.packer {
            Some(p) => p,
            None => {
                let Ok(mut p) = zstd::bulk::Compressor::new(PACK_LEVEL) else {
                    return;
                };
                // A frame that does not unpack to what was packed is refused, never misread.
                if p.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))
                    .is_err()
                {
                    return;
                }
                self.packer.insert(p)
            }
        };
        self.packing.clear();
        self.packing
            .reserve(zstd::zstd_safe::compress_bound(plain.len()));
        let Ok(n) = packer.compress_to_buffer(plain.as_slice(), &mut self.packing) else {
            return;
        };
        let len = plain.len();
        if n > len - len / 8 {
            return;
        }
        // Its own allocation, of its size: the room it was packed into is kept for the next.
        let packed = self.packing.get(..n).unwrap_or_default().to_vec();
        let mut old = std::mem::replace(plain, packed);
        b.packed = Some((len, oldest));
        let charge = n + b.structs;
        self.bytes = self.bytes.saturating_sub(b.charge) + charge;
        b.charge = charge;
        if old.capacity() == BLOCK && self.spare.is_none() {
            old.clear();
            self.spare = Some(old);
        }
    }

    /// The block the next `len` bytes go into: the last one if it has room and no snapshot
    /// holds it (a frozen block never changes), else a new one.
    fn block_for(&mut self, len: usize) -> &mut Block {
        let fits = self.blocks.back_mut().is_some_and(|b| {
            b.buf.capacity() - b.buf.len() >= len && Arc::get_mut(&mut b.buf).is_some()
        });
        if !fits {
            self.pack_last();
            let buf = match self.spare.take() {
                Some(s) if len <= BLOCK => s,
                _ => Vec::with_capacity(BLOCK.max(len)),
            };
            self.blocks.push_back(Block {
                buf: Arc::new(buf),
                start_seq: self.pushed,
                ..Block::default()
            });
        }
        // Not empty: it had a last block with room, or one was just pushed.
        let last = self.blocks.len() - 1;
        &mut self.blocks[last]
    }
}

/// Rough heap + inline size of a record held as a struct, for the ring's byte bound (cheap: no
/// serialisation).
fn approx_size(rec: &Record) -> usize {
    use std::mem::size_of;
    // Its slot in the ring of other records.
    const BASE: usize = size_of::<Record>();
    match rec {
        Record::Event(Event::Data(d)) => BASE + d.payload.len(),
        Record::Event(Event::Summary(s)) => {
            BASE + size_of::<crate::capture::SummaryEvent>() + s.request.payload.len()
        }
        Record::Event(Event::Process(p)) => {
            BASE + p.comm.len()
                + p.exe.as_ref().map_or(0, String::len)
                + p.cgroup.as_ref().map_or(0, String::len)
                + p.container_id.as_ref().map_or(0, String::len)
        }
        // Exchanges go into the byte blocks; never held here.
        Record::Exchange(_) => BASE + size_of::<Exchange>(),
        Record::Verdict(v) => {
            BASE + size_of::<crate::correlate::Verdict>() + v.caused_by.len() * 48
        }
        Record::Decision(d) => BASE + 256 + d.callee_addrs.len() * 32,
        Record::Edges(e) => BASE + e.edges.len() * 512 + e.paths.depths.len() * 128,
        Record::Event(Event::Conn(_) | Event::ProcessExit { .. }) | Record::Tick { .. } => BASE,
    }
}

#[cfg(test)]
mod tests;
