//! HTTP/2 frames as the relay needs them (RFC 9113 §4, §6): the 9-byte header, a header
//! block's fragment inside HEADERS / PUSH_PROMISE / CONTINUATION, and the frames the relay
//! writes itself, with header fields encoded as HPACK literals that leave the peer's dynamic
//! table alone (RFC 7541 §6.2.2), so a block of ours never puts the two ends' tables out of step.
use crate::l7::hpack::STATIC_TABLE;
use bytes::{BufMut, BytesMut};

pub const HEADER_LEN: usize = 9;
/// The size every peer accepts (SETTINGS_MAX_FRAME_SIZE's floor): frames we write stay within.
pub const MIN_MAX_FRAME: usize = 16_384;

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const PUSH_PROMISE: u8 = 0x5;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;
/// SETTINGS and PING acknowledgements.
pub const ACK: u8 = 0x1;

/// RST_STREAM codes the relay sends.
pub const NO_ERROR: u32 = 0x0;
pub const PROTOCOL_ERROR: u32 = 0x1;
pub const INTERNAL_ERROR: u32 = 0x2;
pub const REFUSED_STREAM: u32 = 0x7;
pub const CANCEL: u32 = 0x8;

/// SETTINGS parameters the relays send or follow (RFC 9113 §6.5.2).
pub const SETTINGS_ENABLE_PUSH: u16 = 0x2;
pub const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;

/// A frame's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    pub len: usize,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

impl Head {
    /// The header at the start of `b`, if all 9 bytes are there.
    pub fn parse(b: &[u8]) -> Option<Head> {
        let h = b.get(..HEADER_LEN)?;
        Some(Head {
            len: usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]),
            kind: h[3],
            flags: h[4],
            stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
        })
    }

    /// Header and payload.
    pub fn total(&self) -> usize {
        HEADER_LEN + self.len
    }

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

/// Why a frame cannot be read as the protocol says.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("padding longer than the frame")]
    Padding,
    #[error("frame shorter than its fixed fields")]
    Short,
}

/// The part of a DATA, HEADERS or PUSH_PROMISE payload that is not padding, priority or the
/// promised stream id: the data, or the header block fragment.
pub fn content(head: &Head, payload: &[u8]) -> Result<std::ops::Range<usize>, FrameError> {
    let mut start = 0;
    let mut end = payload.len();
    if matches!(head.kind, DATA | HEADERS | PUSH_PROMISE) && head.has(PADDED) {
        let pad = usize::from(*payload.first().ok_or(FrameError::Short)?);
        start = 1;
        end = end.checked_sub(pad).ok_or(FrameError::Padding)?;
    }
    match head.kind {
        HEADERS if head.has(PRIORITY) => start += 5,
        PUSH_PROMISE => start += 4,
        _ => {}
    }
    if start > end {
        return Err(FrameError::Short);
    }
    Ok(start..end)
}

pub fn put_head(out: &mut BytesMut, len: usize, kind: u8, flags: u8, stream: u32) {
    out.put_u8((len >> 16) as u8);
    out.put_u8((len >> 8) as u8);
    out.put_u8(len as u8);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(stream & 0x7fff_ffff);
}

pub fn put_rst(out: &mut BytesMut, stream: u32, code: u32) {
    put_head(out, 4, RST_STREAM, 0, stream);
    out.put_u32(code);
}

pub fn put_window_update(out: &mut BytesMut, stream: u32, increment: u32) {
    put_head(out, 4, WINDOW_UPDATE, 0, stream);
    out.put_u32(increment & 0x7fff_ffff);
}

/// A SETTINGS frame of these parameters.
pub fn put_settings(out: &mut BytesMut, params: &[(u16, u32)]) {
    put_head(out, 6 * params.len(), SETTINGS, 0, 0);
    for &(id, v) in params {
        out.put_u16(id);
        out.put_u32(v);
    }
}

/// A SETTINGS payload's parameters; `None` when its length is not a whole number of them.
pub fn settings_params(payload: &[u8]) -> Option<impl Iterator<Item = (u16, u32)> + '_> {
    let (params, rest) = payload.as_chunks::<6>();
    rest.is_empty().then(|| {
        params.iter().map(|p| {
            (
                u16::from_be_bytes([p[0], p[1]]),
                u32::from_be_bytes([p[2], p[3], p[4], p[5]]),
            )
        })
    })
}

/// The answer to a PING (`payload`: its 8 bytes, echoed).
pub fn put_ping_ack(out: &mut BytesMut, payload: &[u8]) {
    put_head(out, payload.len(), PING, ACK, 0);
    out.extend_from_slice(payload);
}

/// A WINDOW_UPDATE's increment (its reserved bit cleared); `None` for a short payload.
pub fn window_increment(payload: &[u8]) -> Option<i64> {
    let b: [u8; 4] = payload.get(..4)?.try_into().ok()?;
    Some(i64::from(u32::from_be_bytes(b) & 0x7fff_ffff))
}

/// GOAWAY: streams up to `last` may have been processed; `code` says why.
pub fn put_goaway(out: &mut BytesMut, last: u32, code: u32) {
    put_head(out, 8, GOAWAY, 0, 0);
    out.put_u32(last & 0x7fff_ffff);
    out.put_u32(code);
}

/// A header block of ours as HEADERS (`flags` may add END_STREAM) and as many CONTINUATION
/// frames as the block needs.
pub fn put_block(out: &mut BytesMut, stream: u32, flags: u8, block: &[u8]) {
    let mut chunks = block.chunks(MIN_MAX_FRAME).peekable();
    let mut kind = HEADERS;
    let mut first_flags = flags & END_STREAM;
    if chunks.peek().is_none() {
        put_head(out, 0, HEADERS, first_flags | END_HEADERS, stream);
        return;
    }
    while let Some(c) = chunks.next() {
        let last = chunks.peek().is_none();
        let f = first_flags | if last { END_HEADERS } else { 0 };
        put_head(out, c.len(), kind, f, stream);
        out.put_slice(c);
        kind = CONTINUATION;
        first_flags = 0;
    }
}

/// HPACK integer with an `n`-bit prefix, the first byte's other bits being `mark`.
fn put_int(out: &mut BytesMut, mark: u8, n: u8, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.put_u8(mark | v as u8);
        return;
    }
    out.put_u8(mark | max as u8);
    v -= max;
    while v >= 128 {
        out.put_u8((v % 128 + 128) as u8);
        v /= 128;
    }
    out.put_u8(v as u8);
}

/// A field as briefly as the static table allows without touching the dynamic one: an entry of
/// the table as its index (`:method POST`, `:status 200`), a name of the table by its index and
/// the value as a literal without indexing, any other as [`put_literal`]. The receiver's
/// dynamic table is left as it was, so a block can be left out or sent later without putting
/// either end out of step; the receiver reads a few bytes where it read the names spelled out.
pub fn put_field(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    // Entries of one name are adjacent in the table: the first by name, then its values.
    let Some(first) = STATIC_TABLE
        .iter()
        .position(|(n, _)| n.len() == name.len() && *n == name)
    else {
        return put_literal(out, name, value);
    };
    let same_name = STATIC_TABLE
        .get(first..)
        .unwrap_or_default()
        .iter()
        .take_while(|(n, _)| *n == name);
    if let Some(i) = same_name.clone().position(|(_, v)| *v == value) {
        put_int(out, 0x80, 7, first + i + 1);
        return;
    }
    put_int(out, 0x00, 4, first + 1);
    put_int(out, 0x00, 7, value.len());
    out.put_slice(value);
}

/// A field as a literal without indexing, its name spelled out: the receiver's dynamic table is
/// left as it was.
pub fn put_literal(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    out.put_u8(0x00);
    put_int(out, 0x00, 7, name.len());
    out.put_slice(name);
    put_int(out, 0x00, 7, value.len());
    out.put_slice(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_goes_out_and_comes_back() {
        let mut b = BytesMut::new();
        put_head(
            &mut b,
            70_000,
            HEADERS,
            END_HEADERS | END_STREAM,
            0x8000_0007,
        );
        let h = Head::parse(&b).expect("head");
        assert_eq!(
            h,
            Head {
                len: 70_000,
                kind: HEADERS,
                flags: END_HEADERS | END_STREAM,
                stream: 7
            }
        );
        assert_eq!(Head::parse(&b[..8]), None);
    }

    #[test]
    fn content_skips_padding_priority_and_the_promised_id() {
        let h = |kind, flags, len| Head {
            len,
            kind,
            flags,
            stream: 1,
        };
        // Pad length 2, then "abc", then two bytes of padding.
        let p = b"\x02abc\0\0";
        assert_eq!(content(&h(DATA, PADDED, 6), p), Ok(1..4));
        assert_eq!(content(&h(DATA, 0, 6), p), Ok(0..6));
        // Padded and with priority: pad length, 5 bytes of priority, the fragment.
        let p = b"\x01\0\0\0\x03\x10xy\0";
        assert_eq!(content(&h(HEADERS, PADDED | PRIORITY, 9), p), Ok(6..8));
        assert_eq!(content(&h(PUSH_PROMISE, 0, 6), b"\0\0\0\x02ab"), Ok(4..6));
        assert_eq!(
            content(&h(DATA, PADDED, 2), b"\x05a"),
            Err(FrameError::Padding)
        );
        assert_eq!(
            content(&h(HEADERS, PRIORITY, 3), b"abc"),
            Err(FrameError::Short)
        );
        assert_eq!(content(&h(DATA, PADDED, 0), b""), Err(FrameError::Short));
    }

    /// Every static entry, every static name with another value, and names the table lacks:
    /// each decodes to what went in, the dynamic table stays empty, and the table's own fields
    /// take a byte or two.
    #[test]
    fn fields_use_the_static_table_and_leave_the_dynamic_one_alone() {
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = STATIC_TABLE
            .iter()
            .flat_map(|(n, v)| [(n.to_vec(), v.to_vec()), (n.to_vec(), b"other".to_vec())])
            .collect();
        fields.push((b"x-request-id".to_vec(), vec![b'r'; 200]));
        fields.push((b"grpc-timeout".to_vec(), b"1S".to_vec()));
        let mut b = BytesMut::new();
        for (n, v) in &fields {
            put_field(&mut b, n, v);
        }
        let mut d = loona_hpack::Decoder::new();
        assert_eq!(d.decode(&b).expect("decodes"), fields);
        assert!(d.decode(&[0x80 | 62]).is_err(), "nothing was indexed");
        let mut one = BytesMut::new();
        put_field(&mut one, b":method", b"POST");
        assert_eq!(&one[..], &[0x83]);
        one.clear();
        put_field(&mut one, b":path", b"/shop.v1.Orders/Get");
        assert_eq!(one.len(), 2 + b"/shop.v1.Orders/Get".len());
    }

    #[test]
    fn literals_decode_and_leave_the_table_alone() {
        let mut b = BytesMut::new();
        put_literal(&mut b, b":status", b"503");
        let long = vec![b'v'; 300];
        put_literal(&mut b, b"x-long", &long);
        let mut d = loona_hpack::Decoder::new();
        let got = d.decode(&b).expect("decodes");
        assert_eq!(
            got,
            vec![
                (b":status".to_vec(), b"503".to_vec()),
                (b"x-long".to_vec(), long)
            ]
        );
        // Nothing was added: index 62 (the first dynamic entry) does not exist.
        assert!(d.decode(&[0x80 | 62]).is_err());
    }

    #[test]
    fn a_long_block_is_split_into_continuations() {
        let block = vec![0u8; MIN_MAX_FRAME + 10];
        let mut b = BytesMut::new();
        put_block(&mut b, 3, END_STREAM, &block);
        let h1 = Head::parse(&b).expect("first");
        assert_eq!(
            (h1.kind, h1.flags, h1.len),
            (HEADERS, END_STREAM, MIN_MAX_FRAME)
        );
        let h2 = Head::parse(&b[h1.total()..]).expect("second");
        assert_eq!((h2.kind, h2.flags, h2.len), (CONTINUATION, END_HEADERS, 10));
        assert_eq!(b.len(), h1.total() + h2.total());
        let mut e = BytesMut::new();
        put_block(&mut e, 3, END_STREAM, &[]);
        assert_eq!(
            Head::parse(&e).map(|h| (h.kind, h.flags, h.len)),
            Some((HEADERS, END_STREAM | END_HEADERS, 0))
        );
    }
}
