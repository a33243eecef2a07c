//! Reading the ring back: a block's records as they lie or unpacked, in order with the other
//! records' structs ([`Iter`]), and a frozen ring, what a dump's snapshot holds ([`Frozen`]).
use std::sync::Arc;

use bytes::Bytes;

use super::{
    Entry, Rec,
    codec::{HEADER, Header, KIND_DATA, KIND_EXCHANGE, KIND_SUMMARY},
};
use crate::pipeline::Record;

/// A block's records as the iterator reads them: where they lie, or packed (the length
/// unpacked, and how many other records it marks: skipped with it if it does not unpack).
#[derive(Clone, Copy)]
pub(super) enum View<'a> {
    Plain(&'a [u8]),
    Packed(&'a [u8], usize, usize),
}

/// A packed block's records (`None`: not a frame the ring packed; its records are lost, never
/// misread).
pub(super) fn unpack(z: &[u8], len: usize) -> Option<Bytes> {
    match zstd::bulk::decompress(z, len) {
        Ok(plain) if plain.len() == len => Some(Bytes::from(plain)),
        _ => {
            tracing::warn!(
                packed = z.len(),
                len,
                "recorder: a packed block did not unpack; its records are left out"
            );
            None
        }
    }
}

/// Where the iterator reads: a plain block's bytes, or a packed block unpacked (and how far).
enum Cur<'a> {
    In(&'a [u8]),
    Unpacked(Bytes, usize),
}

impl Cur<'_> {
    fn rest(&self) -> &[u8] {
        match self {
            Cur::In(b) => b,
            Cur::Unpacked(b, at) => b.get(*at..).unwrap_or_default(),
        }
    }
}

/// A ring's or a frozen ring's records in order: the byte blocks' records, each other-record
/// marker taking the next struct of their own sequence (which may outlive the blocks: a dump
/// lets each block go once read, [`Frozen::drain`]).
pub(super) struct Iter<'a, B, O> {
    blocks: B,
    cur: Cur<'a>,
    others: O,
}

impl<B, O> Iter<'_, B, O> {
    pub(super) fn new(blocks: B, others: O) -> Self {
        Iter {
            blocks,
            cur: Cur::In(&[]),
            others,
        }
    }
}

impl<'a, 'o: 'a, B, O> Iterator for Iter<'a, B, O>
where
    B: Iterator<Item = Option<(View<'a>, usize)>>,
    O: Iterator<Item = &'o Record>,
{
    type Item = (u64, Entry<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        while self.cur.rest().is_empty() {
            self.cur = match self.blocks.next()?? {
                (View::Plain(b), start) => Cur::In(b.get(start..).unwrap_or_default()),
                (View::Packed(z, len, others), start) => match unpack(z, len) {
                    Some(b) => Cur::Unpacked(b, start),
                    None => {
                        // Its markers' structs go with it: the next block's take their own.
                        self.others.by_ref().take(others).for_each(drop);
                        Cur::In(&[])
                    }
                },
            };
        }
        let h = Header::read(self.cur.rest())?;
        let body = HEADER..h.len;
        let rec = match &mut self.cur {
            Cur::In(b) => {
                let (rec, rest) = b.split_at_checked(h.len)?;
                *b = rest;
                Rec::In(rec.get(body)?)
            }
            Cur::Unpacked(b, at) => {
                let from = *at;
                *at += h.len;
                if *at > b.len() || h.len < HEADER {
                    return None;
                }
                Rec::Unpacked(b.slice(from + HEADER..from + h.len))
            }
        };
        let e = match h.kind {
            KIND_DATA => Entry::Data(h.ts_ns, rec),
            KIND_SUMMARY => Entry::Summary(h.ts_ns, rec),
            KIND_EXCHANGE => Entry::Exchange(rec),
            _ => Entry::Other(self.others.next()?),
        };
        Some((h.ts_ns, e))
    }
}

/// A block of a frozen ring.
#[derive(Clone)]
pub(super) struct FrozenBlock {
    pub(super) buf: Arc<Vec<u8>>,
    /// Where its first record still in the ring started (in its records unpacked).
    pub(super) start: usize,
    /// Packed: the length unpacked, and how many other records it marks.
    pub(super) packed: Option<(usize, usize)>,
}

impl FrozenBlock {
    pub(super) fn view(&self) -> Option<(View<'_>, usize)> {
        Some(match self.packed {
            Some((len, others)) => (View::Packed(&self.buf, len, others), self.start),
            None => (View::Plain(&self.buf), self.start),
        })
    }
}

/// Records of a ring as a snapshot took them ([`Ring::freeze`]): its blocks shared, nothing
/// decoded. Holding one keeps those blocks in memory after the ring lets them go.
#[derive(Clone, Default)]
pub(in crate::recorder) struct Frozen {
    /// Byte blocks.
    pub(super) blocks: Vec<FrozenBlock>,
    pub(super) others: Vec<Arc<Record>>,
    /// Records of the whole blocks left out as older than the range.
    pub(in crate::recorder) skipped: u64,
    /// Sequence numbers of its first record and of the record after its last.
    pub(in crate::recorder) first_seq: u64,
    pub(in crate::recorder) end_seq: u64,
}

impl Frozen {
    pub(in crate::recorder) fn iter(&self) -> impl Iterator<Item = (u64, Entry<'_>)> {
        Iter::new(
            self.blocks.iter().map(FrozenBlock::view),
            self.others.iter().map(|r| &**r),
        )
    }

    /// Every record in order, as [`Frozen::iter`], each byte block let go as soon as its
    /// records were read: a dump being written holds less and less of the ring's memory, and
    /// the ring, whose bound counts what snapshots hold, gets it back as the writer goes.
    pub(in crate::recorder) fn drain<E>(
        self,
        mut f: impl FnMut(u64, Entry<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut others = self.others.iter().map(|r| &**r);
        for block in self.blocks {
            for (ts, e) in Iter::new(std::iter::once(block.view()), others.by_ref()) {
                f(ts, e)?;
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for Frozen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frozen")
            .field("blocks", &self.blocks.len())
            .field("others", &self.others.len())
            .field("skipped", &self.skipped)
            .field("seq", &(self.first_seq..self.end_seq))
            .finish()
    }
}
