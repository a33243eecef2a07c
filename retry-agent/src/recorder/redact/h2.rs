//! HTTP/2 redaction: frame headers kept, DATA digested, header blocks judged field by field on
//! the *decoded* name (HPACK: Huffman-coded names and values, dynamic-table references), with
//! the same allow-list as HTTP/1.
//!
//! The redactor runs its own HPACK decoder per connection and direction (l7's `hpack`), so a
//! name sent as a Huffman literal or as a dynamic-table index is known. A header block that does
//! not arrive whole in one record is masked whole, but still fed to the decoder once complete, so
//! the table stays in step. When the table cannot be trusted (a block decoded
//! with an error, uncaptured bytes inside a block, capture started mid-connection), the decoder
//! forgets it and reads on in part (`hpack::Decoder::forget`): a name from an entry added since
//! is known exactly (an index counts the insertions since), and a field whose name refers to
//! the unseen part is masked: what cannot be classified is not kept. (Masking every name from
//! the dynamic table instead masked, for the life of a connection older than the agent, even
//! the `:authority` and `content-type` its peer indexed afterwards.)
use std::borrow::Cow;

use super::{Redacted, mask_query};
use crate::l7::hpack::{self, Decoder, STATIC_TABLE, huffman, read_int};

pub(super) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Largest header block held to keep the decoder in step (beyond it the table is given up).
const MAX_HELD: usize = 64 * 1024;
/// Largest buffer (held block, frame, decoded names) kept from one block to the next.
const MAX_KEPT: usize = 4096;

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PRIORITY: u8 = 0x2;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIO: u8 = 0x20;

/// Per connection and direction HTTP/2 state.
pub(super) struct H2 {
    preface_left: usize,
    hdr: [u8; 9],
    have: usize,
    /// Payload bytes of the current frame still to come.
    left: u32,
    len: u32,
    kind: u8,
    flags: u8,
    /// The current frame's payload starts in the record being redacted.
    fresh: bool,
    /// A header block continues in CONTINUATION frames.
    continuing: bool,
    /// Payload of the current header-block frame, when held (not whole in one record).
    frame: Vec<u8>,
    /// Fragments of the current header block, when held.
    held: Vec<u8>,
    holding: bool,
    /// Part of the current header block went uncaptured or over the bound: it is not decoded
    /// (its table changes are unknowable; the decoder forgot its table at the loss).
    held_lost: bool,
    /// Partial (`Decoder::partial`) once the sender's table is unknowable.
    decoder: Decoder,
    /// What the decoder read of the block being masked.
    decoded: Decoded,
}

/// What the decoder read of a header block: each field's name and, for `:path`, its value (the
/// query is masked from it), in buffers kept from block to block. Other values are not decoded.
#[derive(Default)]
struct Decoded {
    bytes: Vec<u8>,
    /// Per field: its name's end in `bytes` (it starts where the previous field ended), and
    /// the end of a decoded value after it.
    fields: Vec<(usize, Option<usize>)>,
}

impl Decoded {
    fn clear(&mut self) {
        self.bytes.clear();
        self.fields.clear();
    }

    /// Emptied, and its buffers let go when a large block grew them.
    fn release(&mut self) {
        release(&mut self.bytes);
        self.fields.clear();
        if self.fields.capacity() > 256 {
            self.fields = Vec::new();
        }
    }

    fn push(&mut self, name: &[u8], value: Option<&[u8]>) {
        self.bytes.extend_from_slice(name);
        let name_end = self.bytes.len();
        let value_end = value.map(|v| {
            self.bytes.extend_from_slice(v);
            self.bytes.len()
        });
        self.fields.push((name_end, value_end));
    }

    /// A field whose name the decoder could not know takes its place as a nameless one: no
    /// name is on the allow-list, so its value is masked.
    fn push_unresolved(&mut self) {
        self.push(b"", None);
    }

    fn start(&self, field: usize) -> usize {
        field
            .checked_sub(1)
            .and_then(|i| self.fields.get(i))
            .map_or(0, |&(n, v)| v.unwrap_or(n))
    }

    fn name(&self, field: usize) -> Option<&[u8]> {
        let &(end, _) = self.fields.get(field)?;
        self.bytes.get(self.start(field)..end)
    }

    fn value(&self, field: usize) -> Option<&[u8]> {
        let &(name_end, value_end) = self.fields.get(field)?;
        self.bytes.get(name_end..value_end?)
    }
}

/// What a frame header says about the frame.
pub(super) enum FrameCheck {
    Ok,
    /// Not a frame a peer could send here: the stream is out of sync.
    Bad,
}

impl H2 {
    /// `preface`: the connection preface is expected first. `hpack_ok`: the decoder starts in
    /// step (a connection seen from its start).
    pub(super) fn new(preface: bool, hpack_ok: bool) -> Self {
        // Peers may announce a larger table than the default; the decoder must not refuse it.
        let mut decoder = Decoder::new(1 << 20);
        if !hpack_ok {
            decoder.forget();
        }
        H2 {
            preface_left: if preface { PREFACE.len() } else { 0 },
            hdr: [0; 9],
            have: 0,
            left: 0,
            len: 0,
            kind: 0,
            flags: 0,
            fresh: false,
            continuing: false,
            frame: Vec::new(),
            held: Vec::new(),
            holding: false,
            held_lost: false,
            decoder,
            decoded: Decoded::default(),
        }
    }

    /// Bytes moved but not captured: returns false when the framing is lost.
    pub(super) fn skip(&mut self, n: u64) -> bool {
        if self.have != 0 || u64::from(self.left) < n || self.preface_left > 0 {
            return false;
        }
        if matches!(self.kind, HEADERS | CONTINUATION | PUSH_PROMISE) {
            // Part of a header block is gone: the table can no longer be followed.
            self.lose_block();
            self.holding = false;
            release(&mut self.held);
            release(&mut self.frame);
        }
        self.left -= n as u32;
        self.fresh = false;
        true
    }

    /// Redact `b[i..]`; returns `None` when the bytes are not HTTP/2 framing (out of sync).
    pub(super) fn bytes(
        &mut self,
        b: &mut [u8],
        mut i: usize,
        red: &mut Redacted,
        body: &mut Vec<(usize, usize)>,
    ) -> Option<usize> {
        let n = b.len();
        if i == 0 {
            self.fresh = false;
        }
        while i < n {
            if self.preface_left > 0 {
                let at = PREFACE.len() - self.preface_left;
                let take = self.preface_left.min(n - i);
                if b.get(i..i + take) != PREFACE.get(at..at + take) {
                    return None;
                }
                self.preface_left -= take;
                i += take;
                continue;
            }
            if self.left == 0 && self.have < 9 {
                // A whole frame header in this record (the common case) is taken at once; the
                // octet-a-step path below was most of this function's time under h2c load.
                if self.have == 0
                    && let Some(h) = b.get(i..i + 9)
                {
                    self.hdr.copy_from_slice(h);
                    self.have = 9;
                    i += 9;
                } else {
                    if let (Some(slot), Some(&c)) = (self.hdr.get_mut(self.have), b.get(i)) {
                        *slot = c;
                    }
                    self.have += 1;
                    i += 1;
                }
                if self.have == 9 {
                    self.have = 0;
                    if let FrameCheck::Bad = self.start_frame() {
                        return None;
                    }
                    if self.len == 0 {
                        self.end_frame();
                    }
                }
                continue;
            }
            let take = (self.left as usize).min(n - i);
            let whole = self.fresh && take == self.len as usize;
            let (from, to) = (i, i + take);
            match self.kind {
                DATA => body.push((from, to)),
                HEADERS | PUSH_PROMISE if whole && !self.continuing && !self.holding => {
                    if let Some(p) = b.get_mut(from..to) {
                        self.mask_block(p, red);
                    }
                }
                HEADERS | PUSH_PROMISE | CONTINUATION => {
                    // Not whole here: held for the decoder, and none of it is kept.
                    self.holding = true;
                    if let Some(p) = b.get(from..to)
                        && self.frame.len() + p.len() <= MAX_HELD
                    {
                        self.frame.extend_from_slice(p);
                    } else {
                        self.lose_block();
                    }
                    red.headers += 1;
                    if let Some(p) = b.get_mut(from..to) {
                        p.fill(b'*');
                    }
                }
                GOAWAY => {
                    // Last stream id and error code kept; the debug data is free text.
                    let done = (self.len - self.left) as usize;
                    let keep = 8usize.saturating_sub(done).min(take);
                    if from + keep < to {
                        body.push((from + keep, to));
                    }
                }
                PRIORITY | RST_STREAM | SETTINGS | PING | WINDOW_UPDATE => {}
                // Extension frames: their payload means nothing to us.
                _ => body.push((from, to)),
            }
            i = to;
            self.left -= take as u32;
            if self.left == 0 {
                self.end_frame();
            }
        }
        Some(i)
    }

    fn start_frame(&mut self) -> FrameCheck {
        let h = self.hdr;
        self.len = u32::from_be_bytes([0, h[0], h[1], h[2]]);
        self.kind = h[3];
        self.flags = h[4];
        self.left = self.len;
        self.fresh = true;
        let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
        if !frame_plausible(self.kind, self.flags, self.len, stream)
            || (self.continuing && self.kind != CONTINUATION)
        {
            return FrameCheck::Bad;
        }
        if matches!(self.kind, HEADERS | PUSH_PROMISE) {
            self.continuing = self.flags & END_HEADERS == 0;
            self.held_lost = false;
        }
        FrameCheck::Ok
    }

    /// The current frame is complete: a held header-block frame joins its block, and a complete
    /// held block goes through the decoder so the table follows the sender.
    fn end_frame(&mut self) {
        if self.kind == CONTINUATION && self.flags & END_HEADERS != 0 {
            self.continuing = false;
        }
        if !self.holding || !matches!(self.kind, HEADERS | PUSH_PROMISE | CONTINUATION) {
            return;
        }
        let frame = std::mem::take(&mut self.frame);
        if let Some(frag) = fragment(&frame, self.kind, self.flags) {
            if self.held.len() + frag.len() <= MAX_HELD {
                self.held.extend_from_slice(frag);
            } else {
                self.lose_block();
            }
        } else {
            self.lose_block();
        }
        self.frame = frame;
        release(&mut self.frame);
        if !self.continuing {
            if !self.held_lost && self.decoder.decode(&self.held, |_, _| {}).is_err() {
                self.decoder.forget();
            }
            release(&mut self.held);
            self.holding = false;
        }
    }

    /// Part of the held block is gone: the table is unknowable after it, and what is held of
    /// it is not decoded (a prefix would add entries the rest may have evicted).
    fn lose_block(&mut self) {
        self.decoder.forget();
        self.held_lost = true;
    }

    /// Mask one whole header-block frame payload in place.
    fn mask_block(&mut self, payload: &mut [u8], red: &mut Redacted) {
        let (from, to) = match fragment_bounds(payload, self.kind, self.flags) {
            Some(r) => r,
            None => {
                red.headers += 1;
                payload.fill(b'*');
                return;
            }
        };
        let Some(block) = payload.get_mut(from..to) else {
            return;
        };
        let decoded = &mut self.decoded;
        decoded.clear();
        let read = self.decoder.decode_in_part(
            block,
            |n| n == b":path",
            |f| match f {
                // Only `:path`'s value is read; a value entering the table is not kept.
                Some((n, v)) => decoded.push(n, v.filter(|_| n == b":path")),
                None => decoded.push_unresolved(),
            },
        );
        if read.is_err() {
            // Fields after the error went unread, and what they added is unknown.
            self.decoder.forget();
        }
        mask_fields(block, read.is_ok().then_some(&self.decoded), red);
        self.decoded.release();
    }
}

/// Empty a buffer kept per connection and direction, and let it go if a rare large block grew it
/// past [`MAX_KEPT`]: thousands of connections would otherwise each hold their largest block.
fn release(b: &mut Vec<u8>) {
    b.clear();
    if b.capacity() > MAX_KEPT {
        *b = Vec::new();
    }
}

/// Whether a frame header could come from a peer (RFC 9113 §6): a known type with only its
/// defined flags, its stream rules and its fixed length. A misread after lost bytes rarely
/// passes (a frame header is kept as it is, so a misread one would keep 9 bytes of body).
fn frame_plausible(kind: u8, flags: u8, len: u32, stream: u32) -> bool {
    let defined = match kind {
        DATA => 0x1 | PADDED,
        HEADERS => 0x1 | END_HEADERS | PADDED | PRIO,
        SETTINGS | PING => 0x1,
        PUSH_PROMISE => END_HEADERS | PADDED,
        CONTINUATION => END_HEADERS,
        PRIORITY | RST_STREAM | GOAWAY | WINDOW_UPDATE => 0,
        _ => 0xff,
    };
    if flags & !defined != 0 {
        return false;
    }
    match kind {
        DATA | HEADERS | CONTINUATION | PUSH_PROMISE => stream != 0,
        PRIORITY => stream != 0 && len == 5,
        RST_STREAM => stream != 0 && len == 4,
        SETTINGS => stream == 0 && len.is_multiple_of(6),
        PING => stream == 0 && len == 8,
        GOAWAY => stream == 0 && len >= 8,
        WINDOW_UPDATE => len == 4,
        // ALTSVC, ORIGIN, PRIORITY_UPDATE: payload masked.
        0xa | 0xc | 0x10 => true,
        _ => false,
    }
}

/// Whether `b` is a run of whole HTTP/2 frames (a record that can resynchronise a lost stream):
/// every header plausible, on a plausible stream, and the frames fill `b` exactly.
pub(super) fn starts_with_frames(b: &[u8]) -> bool {
    let mut off = 0usize;
    let mut frames = 0;
    while let Some(h) = b.get(off..off + 9) {
        let len = u32::from_be_bytes([0, h[0], h[1], h[2]]);
        let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
        if !frame_plausible(h[3], h[4], len, stream) || h[3] == CONTINUATION || stream >= 1 << 24 {
            return false;
        }
        frames += 1;
        off += 9 + len as usize;
    }
    frames > 0 && off == b.len()
}

/// Header-block fragment bounds inside a HEADERS / PUSH_PROMISE / CONTINUATION payload.
fn fragment_bounds(p: &[u8], kind: u8, flags: u8) -> Option<(usize, usize)> {
    let mut from = 0usize;
    let mut to = p.len();
    if kind != CONTINUATION && flags & PADDED != 0 {
        let pad = usize::from(*p.first()?);
        from = 1;
        to = to.checked_sub(pad)?;
    }
    if kind == HEADERS && flags & PRIO != 0 {
        from += 5;
    }
    if kind == PUSH_PROMISE {
        from += 4;
    }
    (from <= to).then_some((from, to))
}

fn fragment(p: &[u8], kind: u8, flags: u8) -> Option<&[u8]> {
    let (from, to) = fragment_bounds(p, kind, flags)?;
    p.get(from..to)
}

/// A string literal at `at`: (huffman, bytes start, bytes end).
fn hpack_str(b: &[u8], at: usize) -> Option<(bool, usize, usize)> {
    let (huff, raw, end) = hpack::read_str(b, at).ok()?;
    Some((huff, end - raw.len(), end))
}

/// A name of the static table (RFC 7541 Appendix A), by its index.
fn static_name(idx: usize) -> Option<&'static [u8]> {
    STATIC_TABLE.get(idx.checked_sub(1)?).map(|&(n, _)| n)
}

/// The name a literal field carries: indexed (static only when the decoder is not trusted) or
/// a literal string (Huffman-decoded).
fn literal_name(b: &[u8], huff: bool, from: usize, to: usize) -> Option<Vec<u8>> {
    let raw = b.get(from..to)?;
    if huff {
        huffman_decode(raw)
    } else {
        Some(raw.to_vec())
    }
}

/// A Huffman-coded string, decoded (None: not a valid code).
fn huffman_decode(raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    huffman::decode(raw, &mut out).ok().map(|()| out)
}

/// Walk the fields of a whole header block, masking every literal value whose name is not on
/// the allow-list. `decoded`: what the decoder read, when it read the block in step.
fn mask_fields(b: &mut [u8], decoded: Option<&Decoded>, red: &mut Redacted) {
    let mut p = 0usize;
    let mut field = 0usize;
    let n = b.len();
    while p < n {
        let Some(&c) = b.get(p) else { return };
        if c & 0x80 != 0 {
            // Indexed field: no literal bytes here (a dynamic entry was masked when it was sent).
            match read_int(b, p, 7).ok() {
                Some((_, np)) => p = np,
                None => return mask_rest(b, p, red),
            }
            field += 1;
            continue;
        }
        if c & 0xe0 == 0x20 {
            // Dynamic table size update: not a field.
            match read_int(b, p, 5).ok() {
                Some((_, np)) => p = np,
                None => return mask_rest(b, p, red),
            }
            continue;
        }
        let prefix = if c & 0x40 != 0 { 6 } else { 4 };
        let Some((idx, np)) = read_int(b, p, prefix).ok() else {
            return mask_rest(b, p, red);
        };
        p = np;
        let from_decoder = decoded.and_then(|d| d.name(field));
        let path_value = decoded.and_then(|d| d.value(field));
        let mut literal = None;
        if idx == 0 {
            let Some((huff, s, e)) = hpack_str(b, p) else {
                return mask_rest(b, p, red);
            };
            p = e;
            literal = Some((huff, s, e));
        }
        let name = match (from_decoder, literal) {
            (Some(d), _) => Some(Cow::Borrowed(d)),
            (None, Some((huff, s, e))) => literal_name(b, huff, s, e).map(Cow::Owned),
            (None, None) => static_name(idx).map(Cow::Borrowed),
        };
        let Some((huff, s, e)) = hpack_str(b, p) else {
            return mask_rest(b, p, red);
        };
        let lead = p;
        p = e;
        field += 1;
        let name = name.as_deref().unwrap_or_default();
        if name == b":path" {
            mask_path(b, (lead, s, e), huff, path_value, red);
        } else if !super::keep_value(name) {
            red.headers += 1;
            // Plain (not Huffman) so the masked value still decodes, in no more octets.
            if let Some(l) = b.get_mut(lead) {
                *l &= 0x7f;
            }
            if let Some(v) = b.get_mut(s..e) {
                v.fill(b'*');
            }
        }
    }
}

/// `:path` keeps the path and loses the query. A Huffman-coded value is rewritten plain when
/// the path and `?` fit in its octets; otherwise it is masked whole. `(lead, s, e)`: where the
/// string starts, and its octets; `decoded`: its value, when the decoder read it.
fn mask_path(
    b: &mut [u8],
    (lead, s, e): (usize, usize, usize),
    huff: bool,
    decoded: Option<&[u8]>,
    red: &mut Redacted,
) {
    if !huff {
        if let Some(v) = b.get_mut(s..e)
            && mask_query(v)
        {
            red.headers += 1;
        }
        return;
    }
    let decoded = match decoded {
        Some(d) => Some(Cow::Borrowed(d)),
        None => b.get(s..e).and_then(huffman_decode).map(Cow::Owned),
    };
    let Some(decoded) = decoded else {
        red.headers += 1;
        if let Some(l) = b.get_mut(lead) {
            *l &= 0x7f;
        }
        if let Some(v) = b.get_mut(s..e) {
            v.fill(b'*');
        }
        return;
    };
    let Some(q) = decoded.iter().position(|&c| c == b'?') else {
        return;
    };
    red.headers += 1;
    if let Some(l) = b.get_mut(lead) {
        *l &= 0x7f;
    }
    if let Some(v) = b.get_mut(s..e) {
        let keep = decoded
            .get(..=q)
            .filter(|k| k.len() <= v.len())
            .unwrap_or_default();
        v.fill(b'*');
        if let Some(dst) = v.get_mut(..keep.len()) {
            dst.copy_from_slice(keep);
        }
    }
}

/// A block that stopped parsing: nothing after `p` is kept.
fn mask_rest(b: &mut [u8], p: usize, red: &mut Redacted) {
    red.headers += 1;
    if let Some(r) = b.get_mut(p..) {
        r.fill(0);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A string's length with a 7-bit prefix (RFC 7541 §5.1), not Huffman-coded.
    fn len7(out: &mut Vec<u8>, n: usize) {
        if n < 127 {
            out.push(n as u8);
            return;
        }
        out.push(0x7f);
        let mut rest = n - 127;
        while rest >= 128 {
            out.push((rest % 128) as u8 | 0x80);
            rest /= 128;
        }
        out.push(rest as u8);
    }

    /// A 20 KiB header block that arrives in two records is held, decoded and masked; the
    /// buffers it grew are let go after it, and the next block still decodes in step.
    #[test]
    fn a_large_block_leaves_no_large_buffer_behind() {
        // x-custom: 1,000 octets, into the table; x-pad: 19,000, without indexing.
        let mut block = vec![0x40, 8];
        block.extend_from_slice(b"x-custom");
        len7(&mut block, 1_000);
        block.extend(std::iter::repeat_n(b'V', 1_000));
        block.extend_from_slice(&[0x00, 5]);
        block.extend_from_slice(b"x-pad");
        len7(&mut block, 19_000);
        block.extend(std::iter::repeat_n(b'P', 19_000));
        let len = block.len() as u32;
        let mut wire = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            HEADERS,
            END_HEADERS,
        ];
        wire.extend_from_slice(&1u32.to_be_bytes());
        wire.extend_from_slice(&block);
        // The next block refers to the entry: dynamic index 62, then a static one.
        wire.extend_from_slice(&[0, 0, 2, HEADERS, END_HEADERS, 0, 0, 0, 3, 0x80 | 62, 0x82]);
        let mut h = H2::new(false, true);
        let mut red = Redacted::default();
        let mut body = Vec::new();
        let (first, second) = wire.split_at_mut(5_000);
        h.bytes(first, 0, &mut red, &mut body).unwrap();
        assert!(h.holding, "the block is held across records");
        h.bytes(second, 0, &mut red, &mut body).unwrap();
        assert!(!h.decoder.partial(), "both blocks decoded in step");
        assert_eq!(h.decoder.table_size().0, 8 + 1_000 + 32);
        for (what, cap) in [
            ("held", h.held.capacity()),
            ("frame", h.frame.capacity()),
            ("names", h.decoded.bytes.capacity()),
        ] {
            assert!(cap <= MAX_KEPT, "{what} keeps {cap} bytes");
        }
        assert!(
            !wire.iter().any(|&c| c == b'V' || c == b'P'),
            "values masked"
        );
    }
}
