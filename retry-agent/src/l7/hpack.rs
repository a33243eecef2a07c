//! HPACK (RFC 7541) decoding for readers that follow a connection's header blocks: l7's
//! reassembler, the recorder's redactor and the shim's h2c relay each keep one decoder per
//! direction in step with the sender's encoder.
//!
//! Our own rather than loona-hpack's (still a dev-dependency: the tests check this decoder
//! against it): that one builds a hash map of the 257 Huffman codes for every Huffman-coded
//! string and walks the string a bit at a time through it, and every real HTTP/2 client (gRPC,
//! Go, hyper, Envoy, browsers) Huffman-codes its literals. Here Huffman strings decode an octet
//! a step through a table built once (`huffman`), into scratch buffers the decoder reuses, and
//! a short string decoded lately on this thread is copied from a memo of them instead (`memo`:
//! literals sent again and again, names a table never keeps, are most of what is decoded); raw
//! strings and table entries are handed to the caller borrowed. A field costs an allocation only
//! when it enters the dynamic table (one per entry, name and value together).
//!
//! Malformed input is an error, never a panic; the caller decides what an error means (for all
//! three, that this direction's table is unknowable from then on).
//!
//! A decoder whose table is unknowable (a connection picked up mid-life, a block missed) can
//! `forget` it and go on in part: a field of the static table, a literal, and a reference to an
//! entry added since are read as they are (an index names the entry added that many insertions
//! ago, whatever the table's size: an entry the sender evicted is one it never refers to); a
//! reference into what came before is unresolved, and counted (`unresolved`), never guessed.
use std::collections::VecDeque;

pub mod huffman;
mod memo;
#[cfg(test)]
mod tests;

/// The dynamic table size a decoder starts with (SETTINGS_HEADER_TABLE_SIZE's default).
pub const DEFAULT_TABLE_SIZE: usize = 4096;

/// Largest scratch buffer a decoder keeps between blocks.
const MAX_KEPT_BUFFER: usize = 1024;

/// Why a header block did not decode. After any of them the dynamic table may differ from the
/// sender's: the block's later fields were not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    #[error("header block ends inside a field")]
    Truncated,
    #[error("integer too large")]
    IntegerOverflow,
    #[error("index {0} is not in the table")]
    BadIndex(usize),
    #[error("invalid Huffman code")]
    Huffman,
    #[error("table size update to {0} is above the allowed {1}")]
    TableSize(usize, usize),
}

/// The static table, RFC 7541 Appendix A (index 1 is the first entry).
pub static STATIC_TABLE: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// A field's representation (RFC 7541 §6), from its first octet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repr {
    /// Indexed field (§6.1).
    Indexed,
    /// Literal with incremental indexing (§6.2.1): it enters the dynamic table.
    Incremental,
    /// Literal without indexing or never indexed (§6.2.2, §6.2.3).
    Literal,
    /// Dynamic table size update (§6.3).
    SizeUpdate,
}

impl Repr {
    pub fn of(first: u8) -> Repr {
        if first & 0x80 != 0 {
            Repr::Indexed
        } else if first & 0xc0 == 0x40 {
            Repr::Incremental
        } else if first & 0xe0 == 0x20 {
            Repr::SizeUpdate
        } else {
            Repr::Literal
        }
    }

    /// Bits of the first octet that hold the field's integer (index or size).
    pub fn prefix_bits(self) -> u8 {
        match self {
            Repr::Indexed => 7,
            Repr::Incremental => 6,
            Repr::SizeUpdate => 5,
            Repr::Literal => 4,
        }
    }
}

/// Read an integer with an `n`-bit prefix (§5.1) at `at`: (value, position after it).
pub fn read_int(b: &[u8], at: usize, n: u8) -> Result<(usize, usize), HpackError> {
    let mask = (1usize << n) - 1;
    let mut v = usize::from(*b.get(at).ok_or(HpackError::Truncated)?) & mask;
    let mut p = at + 1;
    if v < mask {
        return Ok((v, p));
    }
    let mut shift = 0u32;
    loop {
        let c = *b.get(p).ok_or(HpackError::Truncated)?;
        p += 1;
        // 2^28 is far past any table size, index or string a header block can carry.
        if shift > 21 {
            return Err(HpackError::IntegerOverflow);
        }
        v += usize::from(c & 0x7f) << shift;
        if c & 0x80 == 0 {
            return Ok((v, p));
        }
        shift += 7;
    }
}

/// A string literal (§5.2) at `at`: (Huffman-coded, its octets, position after it).
pub fn read_str(b: &[u8], at: usize) -> Result<(bool, &[u8], usize), HpackError> {
    let huff = *b.get(at).ok_or(HpackError::Truncated)? & 0x80 != 0;
    let (len, start) = read_int(b, at, 7)?;
    let end = start.checked_add(len).ok_or(HpackError::Truncated)?;
    let raw = b.get(start..end).ok_or(HpackError::Truncated)?;
    Ok((huff, raw, end))
}

/// A string's octets: borrowed when sent raw, decoded into `scratch` when Huffman-coded.
fn string<'a>(huff: bool, raw: &'a [u8], scratch: &'a mut Vec<u8>) -> Result<&'a [u8], HpackError> {
    if !huff {
        return Ok(raw);
    }
    scratch.clear();
    memo::decode(raw, scratch).map_err(|_| HpackError::Huffman)?;
    Ok(scratch)
}

/// Write an integer with an `n`-bit prefix (§5.1) after the pattern `first`: for the tests and
/// benchmarks that encode what real clients send.
#[cfg(any(test, feature = "testkit"))]
pub fn encode_int(out: &mut Vec<u8>, first: u8, n: u8, v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    let mut rest = v - max;
    while rest >= 0x80 {
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// Write a string literal (§5.2), Huffman-coded or not.
#[cfg(any(test, feature = "testkit"))]
pub fn encode_str(out: &mut Vec<u8>, s: &[u8], huff: bool) {
    if huff {
        encode_int(out, 0x80, 7, huffman::encoded_len(s));
        huffman::encode(s, out);
    } else {
        encode_int(out, 0, 7, s.len());
        out.extend_from_slice(s);
    }
}

/// One dynamic table entry: name and value in one allocation. `name_len` is `UNSEEN` for one
/// added while the table was partly unknown whose name was an unresolved reference: its place
/// is known, not its field.
struct Entry {
    bytes: Box<[u8]>,
    name_len: usize,
}

/// `Entry::name_len` of an entry whose field is unknown.
const UNSEEN: usize = usize::MAX;

impl Entry {
    fn name(&self) -> &[u8] {
        &self.bytes[..self.name_len]
    }
    fn value(&self) -> &[u8] {
        &self.bytes[self.name_len..]
    }
    /// An entry's size for the table's bound (§4.1); an unseen one's, at least.
    fn size(&self) -> usize {
        self.bytes.len() + 32
    }

    fn unseen() -> Entry {
        Entry {
            bytes: Box::default(),
            name_len: UNSEEN,
        }
    }
}

/// The dynamic table (§2.3.2): newest first.
struct Table {
    entries: VecDeque<Entry>,
    size: usize,
    max: usize,
    /// What the table held before its oldest entry here is unknown (`Decoder::forget`).
    partial: bool,
}

/// A field's name and value, borrowed.
type Field<'a> = (&'a [u8], &'a [u8]);

impl Table {
    /// The field at `index`; `None` when it is one this decoder cannot know (partial table).
    fn get(&self, index: usize) -> Result<Option<Field<'_>>, HpackError> {
        if let Some(&(n, v)) = index.checked_sub(1).and_then(|i| STATIC_TABLE.get(i)) {
            return Ok(Some((n, v)));
        }
        match index
            .checked_sub(STATIC_TABLE.len() + 1)
            .map(|i| self.entries.get(i))
        {
            Some(Some(e)) if e.name_len != UNSEEN => Ok(Some((e.name(), e.value()))),
            Some(Some(_)) => Ok(None),
            Some(None) if self.partial => Ok(None),
            _ => Err(HpackError::BadIndex(index)),
        }
    }

    fn evict_to(&mut self, max: usize) {
        while self.size > max {
            match self.entries.pop_back() {
                Some(e) => self.size -= e.size(),
                None => break,
            }
        }
    }

    /// Add an entry; one larger than the table empties it and is not kept (§4.4).
    fn insert(&mut self, e: Entry) {
        let need = e.size();
        if need > self.max {
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max - need);
        self.size += need;
        self.entries.push_front(e);
    }
}

/// An HPACK decoder for one direction of one connection.
pub struct Decoder {
    table: Table,
    /// Largest size update honoured: bounds the table's memory whatever the peer says.
    max_allowed: usize,
    name_buf: Vec<u8>,
    value_buf: Vec<u8>,
    /// Fields of the last block that referred to entries this decoder cannot know.
    unresolved: usize,
}

impl Decoder {
    /// A decoder with the default table size that honours size updates up to `max_allowed`.
    pub fn new(max_allowed: usize) -> Decoder {
        Decoder {
            table: Table {
                entries: VecDeque::new(),
                size: 0,
                max: DEFAULT_TABLE_SIZE.min(max_allowed),
                partial: false,
            },
            max_allowed,
            name_buf: Vec::new(),
            value_buf: Vec::new(),
            unresolved: 0,
        }
    }

    /// The sender's table is unknowable from here (blocks went by unseen, or one did not
    /// decode): what this decoder holds is dropped and the next blocks are read in part (see
    /// the module's header). The table's bound is kept: a later size update still applies.
    pub fn forget(&mut self) {
        self.table.entries.clear();
        self.table.size = 0;
        self.table.partial = true;
    }

    /// Whether the table is partly unknown (since `forget`).
    pub fn partial(&self) -> bool {
        self.table.partial
    }

    /// How many fields of the last block decoded referred to entries this decoder cannot know
    /// (0 unless `partial`): they were not handed over.
    pub fn unresolved(&self) -> usize {
        self.unresolved
    }

    /// The dynamic table's current size (§4.1) and bound.
    pub fn table_size(&self) -> (usize, usize) {
        (self.table.size, self.table.max)
    }

    /// Decode one whole header block, calling `field(name, value)` for each field in order.
    /// Fields before an error have been handed over, and the table holds what they added.
    pub fn decode(
        &mut self,
        block: &[u8],
        mut field: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), HpackError> {
        self.decode_some(block, |_| true, |n, v| field(n, v.unwrap_or_default()))
    }

    /// As [`Decoder::decode`], but the value of a literal that does not enter the table is
    /// decoded only when `wants(name)`, and handed over as `None` otherwise: a reader that looks
    /// at a few fields skips the Huffman decoding of the others (a value that enters the table is
    /// always decoded: a later block may refer to it). A skipped value's octets are not checked.
    pub fn decode_some(
        &mut self,
        block: &[u8],
        wants: impl Fn(&[u8]) -> bool,
        mut field: impl FnMut(&[u8], Option<&[u8]>),
    ) -> Result<(), HpackError> {
        self.decode_in_part(block, wants, |f| {
            if let Some((n, v)) = f {
                field(n, v)
            }
        })
    }

    /// As [`Decoder::decode_some`], with `None` handed over in the place of a field that
    /// refers to an entry this decoder cannot know (a partial table): a reader that walks the
    /// block's fields itself keeps its count of them in step.
    pub fn decode_in_part(
        &mut self,
        block: &[u8],
        wants: impl Fn(&[u8]) -> bool,
        field: impl FnMut(Option<(&[u8], Option<&[u8]>)>),
    ) -> Result<(), HpackError> {
        let res = self.decode_fields(block, wants, field);
        // A decoder lives as long as its connection and there may be thousands: a rare long
        // string's buffer is not kept.
        for buf in [&mut self.name_buf, &mut self.value_buf] {
            if buf.capacity() > MAX_KEPT_BUFFER {
                *buf = Vec::new();
            }
        }
        res
    }

    fn decode_fields(
        &mut self,
        block: &[u8],
        wants: impl Fn(&[u8]) -> bool,
        mut field: impl FnMut(Option<(&[u8], Option<&[u8]>)>),
    ) -> Result<(), HpackError> {
        self.unresolved = 0;
        let mut p = 0;
        while let Some(&first) = block.get(p) {
            let repr = Repr::of(first);
            let (index, next) = read_int(block, p, repr.prefix_bits())?;
            p = next;
            match repr {
                Repr::Indexed => {
                    if index == 0 {
                        return Err(HpackError::BadIndex(0));
                    }
                    match self.table.get(index)? {
                        Some((n, v)) => field(Some((n, Some(v)))),
                        None => {
                            self.unresolved += 1;
                            field(None);
                        }
                    }
                }
                Repr::SizeUpdate => {
                    if index > self.max_allowed {
                        return Err(HpackError::TableSize(index, self.max_allowed));
                    }
                    self.table.max = index;
                    self.table.evict_to(index);
                }
                Repr::Incremental | Repr::Literal => {
                    let Decoder {
                        table,
                        name_buf,
                        value_buf,
                        ..
                    } = self;
                    let name = if index == 0 {
                        let (huff, raw, after) = read_str(block, p)?;
                        p = after;
                        string(huff, raw, name_buf)?
                    } else if let Some((n, _)) = table.get(index)? {
                        n
                    } else {
                        // A name this decoder cannot know: its value is skipped; an entry it
                        // adds keeps its place, unseen.
                        let (_, _, after) = read_str(block, p)?;
                        p = after;
                        self.unresolved += 1;
                        field(None);
                        if repr == Repr::Incremental {
                            table.insert(Entry::unseen());
                        }
                        continue;
                    };
                    let (huff, raw, after) = read_str(block, p)?;
                    p = after;
                    if repr == Repr::Literal {
                        let value = if wants(name) {
                            Some(string(huff, raw, value_buf)?)
                        } else {
                            None
                        };
                        field(Some((name, value)));
                        continue;
                    }
                    let value = string(huff, raw, value_buf)?;
                    field(Some((name, Some(value))));
                    let mut bytes = Vec::with_capacity(name.len() + value.len());
                    bytes.extend_from_slice(name);
                    bytes.extend_from_slice(value);
                    table.insert(Entry {
                        bytes: bytes.into_boxed_slice(),
                        name_len: name.len(),
                    });
                }
            }
        }
        Ok(())
    }
}
