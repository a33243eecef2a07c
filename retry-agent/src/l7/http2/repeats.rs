//! The header blocks a direction may answer from memory: which blocks leave the HPACK dynamic
//! table alone (a walk of their representations, RFC 7541 §6), and the last ones decoded.
use super::Block;

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

/// An HPACK integer with an `n`-bit prefix at the start of `b` (RFC 7541 §5.1): its value and
/// the rest of `b`. None when cut, or larger than any length a block of ours can hold.
fn hpack_int(b: &[u8], n: u32) -> Option<(usize, &[u8])> {
    let (&first, mut rest) = b.split_first()?;
    let max = (1usize << n) - 1;
    let mut v = usize::from(first) & max;
    if v < max {
        return Some((v, rest));
    }
    for shift in [0u32, 7, 14, 21] {
        let (&c, r) = rest.split_first()?;
        rest = r;
        v += usize::from(c & 0x7f) << shift;
        if c & 0x80 == 0 {
            return Some((v, rest));
        }
    }
    None
}

/// A string literal (length with a 7-bit prefix, Huffman or not): the rest of `b` after it.
fn skip_hpack_string(b: &[u8]) -> Option<&[u8]> {
    let (len, rest) = hpack_int(b, 7)?;
    rest.get(len..)
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
fn with_unindexed_literals(mut b: &[u8]) -> bool {
    if b.is_empty() {
        return false;
    }
    while let Some(&first) = b.first() {
        let rest = if first & 0x80 != 0 {
            // Indexed; index 0 is an error.
            match hpack_int(b, 7) {
                Some((i, r)) if i != 0 => Some(r),
                _ => None,
            }
        } else if first & 0xf0 == 0 {
            // Literal without indexing: an indexed name (4-bit prefix) or a literal one, then
            // the value.
            hpack_int(b, 4).and_then(|(name, r)| {
                let r = if name == 0 { skip_hpack_string(r)? } else { r };
                skip_hpack_string(r)
            })
        } else {
            // With incremental indexing (01), a size update (001), never indexed (0001).
            None
        };
        match rest {
            Some(r) => b = r,
            None => return false,
        }
    }
    true
}
