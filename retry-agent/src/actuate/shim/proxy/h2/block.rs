//! Header blocks as the relays read them: where a block's HEADERS / CONTINUATION run ends, and
//! its fields decoded.
use super::{
    Step,
    fields::Fields,
    frame::{self, CONTINUATION, END_HEADERS, Head},
};
use crate::l7::hpack::Decoder;

/// The header block at the front of `buf`, opened by `head`, decoded into `fields` once all
/// its frames are buffered: its length in bytes, or `None` until then.
pub(super) fn read_block(
    dec: &mut Decoder,
    fields: &mut Fields,
    buf: &[u8],
    head: &Head,
) -> Result<Option<usize>, &'static str> {
    let len = match block_extent(buf, head) {
        Ok(Some(len)) => len,
        Ok(None) | Err(Step::More) => return Ok(None),
        Err(Step::Unreadable(why)) => return Err(why),
    };
    decode_into(dec, fields, buf, len).map_err(|_| "HPACK")?;
    Ok(Some(len))
}

/// Decodes the block of `len` bytes of frames at the front of `buf` into `fields`.
pub(super) fn decode_into(
    dec: &mut Decoder,
    fields: &mut Fields,
    buf: &[u8],
    len: usize,
) -> Result<(), Step> {
    fields.clear();
    // Most blocks are one HEADERS frame: decoded where they lie.
    if let Some(head) = Head::parse(buf)
        && head.total() == len
    {
        let payload = buf
            .get(frame::HEADER_LEN..len)
            .ok_or(Step::Unreadable("header block cut"))?;
        let r =
            frame::content(&head, payload).map_err(|_| Step::Unreadable("header block padding"))?;
        return dec
            .decode(payload.get(r).unwrap_or_default(), |n, v| fields.push(n, v))
            .map_err(|_| Step::Unreadable("HPACK"));
    }
    let mut block = Vec::new();
    let mut at = 0;
    while at < len {
        let head = buf
            .get(at..)
            .and_then(Head::parse)
            .ok_or(Step::Unreadable("header block cut"))?;
        let payload = buf
            .get(at + frame::HEADER_LEN..at + head.total())
            .ok_or(Step::Unreadable("header block cut"))?;
        let r =
            frame::content(&head, payload).map_err(|_| Step::Unreadable("header block padding"))?;
        block.extend_from_slice(payload.get(r).unwrap_or_default());
        at += head.total();
    }
    dec.decode(&block, |n, v| fields.push(n, v))
        .map_err(|_| Step::Unreadable("HPACK"))
}

/// Bytes of the header block starting at the front of `buf` (its HEADERS or PUSH_PROMISE and
/// CONTINUATION frames through END_HEADERS), once all are buffered.
pub(super) fn block_extent(buf: &[u8], first: &Head) -> Result<Option<usize>, Step> {
    let mut at = 0;
    let mut head = *first;
    loop {
        if buf.len() < at + head.total() {
            return Ok(None);
        }
        at += head.total();
        if head.has(END_HEADERS) {
            return Ok(Some(at));
        }
        let Some(next) = buf.get(at..).and_then(Head::parse) else {
            return Ok(None);
        };
        if next.kind != CONTINUATION || next.stream != first.stream {
            return Err(Step::Unreadable("header block interrupted"));
        }
        head = next;
    }
}
