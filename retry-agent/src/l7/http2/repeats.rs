//! The header blocks a direction may answer from memory: which blocks leave the HPACK dynamic
//! table alone (a walk of their representations, RFC 7541 §6), and the last ones decoded.
use super::{
    super::hpack::{Repr, read_int, read_str},
    Block,
};

/// The last header blocks this direction decoded that left the dynamic table alone, with what
/// they decoded to. While every block since was of that kind the same bytes decode to the same
/// headers: a repeat is answered from here, without HPACK or header parsing. gRPC sends such
/// blocks on every call of a method (the response head, its trailers; requests whose headers do
/// not change), from encoders that index every field (Go's, netty's) and from those that send
/// some as literals without indexing every time (nghttp2's `:path`, loona's every field). Any
/// block that may change the table (a literal with indexing, a size update) empties it. A block
/// with a never-indexed field (RFC 7541 §6.2.3: a credential, most likely) is not kept: its
/// bytes would stay in memory for the connection's life.
#[derive(Default)]
pub(super) struct Repeats(Vec<(Box<[u8]>, Block)>);

impl Repeats {
    /// Blocks remembered per direction: a response's head and its trailers.
    const MAX: usize = 2;
    /// Longer blocks are not remembered (a gRPC request's seven fields as literals are ~110).
    const MAX_BYTES: usize = 256;

    pub(super) fn get(&self, bytes: &[u8]) -> Option<&Block> {
        self.0
            .iter()
            .find(|(b, _)| **b == *bytes)
            .map(|(_, blk)| blk)
    }

    /// A block that may have changed the table: nothing remembered holds any more.
    pub(super) fn clear(&mut self) {
        self.0.clear();
    }

    pub(super) fn put(&mut self, bytes: &[u8], block: &Block) {
        if bytes.len() > Self::MAX_BYTES {
            return;
        }
        if self.0.len() >= Self::MAX {
            self.0.remove(0);
        }
        self.0.push((bytes.into(), block.clone()));
    }
}

/// Whether a header block leaves the dynamic table as it found it and carries no never-indexed
/// field: only indexed fields (§6.1, index not 0) and literals without indexing (§6.2.2).
pub(crate) fn table_preserving(b: &[u8]) -> bool {
    indexed_only(b) || with_unindexed_literals(b)
}

/// Only indexed fields (RFC 7541 §6.1, index not 0): the common case, checked first.
fn indexed_only(mut b: &[u8]) -> bool {
    if b.is_empty() {
        return false;
    }
    while let Some((&first, rest)) = b.split_first() {
        if first & 0x80 == 0 || first == 0x80 {
            return false;
        }
        b = rest;
        if first & 0x7f == 0x7f {
            // Continuation bytes of the index: their high bit says another one follows.
            let n = b.iter().take_while(|&&c| c & 0x80 != 0).count();
            match b.get(n + 1..) {
                Some(r) => b = r,
                None => return false,
            }
        }
    }
    true
}

/// Indexed fields and literals without indexing. Out of line: inlined into `decode` it made
/// the sink's moves compile worse (the indexed bench lost ~5%).
#[inline(never)]
fn with_unindexed_literals(b: &[u8]) -> bool {
    if b.is_empty() {
        return false;
    }
    let mut p = 0;
    while let Some(&first) = b.get(p) {
        let next = match Repr::of(first) {
            // Indexed; index 0 is an error.
            Repr::Indexed => read_int(b, p, 7)
                .ok()
                .filter(|&(i, _)| i != 0)
                .map(|(_, q)| q),
            // Literal without indexing (0000; 0001 is never indexed): an indexed name or a
            // literal one, then the value.
            Repr::Literal if first & 0x10 == 0 => read_int(b, p, 4).ok().and_then(|(name, q)| {
                let q = if name == 0 { read_str(b, q).ok()?.2 } else { q };
                read_str(b, q).ok().map(|(_, _, q)| q)
            }),
            // With incremental indexing, a size update, never indexed.
            _ => None,
        };
        match next {
            Some(q) => p = q,
            None => return false,
        }
    }
    true
}
