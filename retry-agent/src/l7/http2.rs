//! HTTP/2 (h2c, gRPC): frame parsing per direction through captured prefixes, header blocks
//! (HEADERS + CONTINUATION, PUSH_PROMISE) joined and handed to `blocks`, which reads them with
//! one HPACK decoder per direction (in part once the sender's table is unknowable: a block
//! missed or cut short, capture started mid-connection). Frame payloads we do not need are
//! skipped by counting.
use super::{
    http1::{Side, recycle},
    msg::{Ctx, ReqInfo, RespInfo},
};

mod blocks;
mod repeats;

use blocks::Blocks;
// Its tests tell blocks that leave the table alone from the rest.
#[cfg(test)]
pub(crate) use repeats::table_preserving;

pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;

const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FrameHeader {
    pub len: u32,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

impl FrameHeader {
    pub(crate) fn parse(b: &[u8]) -> Option<FrameHeader> {
        let h: &[u8; 9] = b.get(..9)?.try_into().ok()?;
        Some(FrameHeader {
            len: u32::from_be_bytes([0, h[0], h[1], h[2]]),
            kind: h[3],
            flags: h[4],
            stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
        })
    }

    /// Plausible as a frame of a live connection: a known type on the stream kind it belongs
    /// to, within the default maximum frame size (16 KiB) or a common larger setting.
    fn plausible(&self) -> bool {
        let on_zero = matches!(self.kind, SETTINGS | 0x6 | GOAWAY);
        let on_stream = matches!(
            self.kind,
            DATA | HEADERS | 0x2 | RST_STREAM | PUSH_PROMISE | CONTINUATION
        );
        self.len <= 1 << 20
            && ((on_zero && self.stream == 0)
                || (on_stream && self.stream != 0)
                || self.kind == 0x8)
            && match self.kind {
                RST_STREAM => self.len == 4,
                0x2 => self.len == 5,
                0x6 => self.len == 8,
                0x8 => self.len == 4,
                SETTINGS => self.len.is_multiple_of(6),
                _ => true,
            }
    }
}

/// Whether `b` starts with an HTTP/2 server preface (a SETTINGS frame on stream 0).
pub(crate) fn is_server_preface(b: &[u8]) -> bool {
    FrameHeader::parse(b).is_some_and(|h| {
        h.kind == SETTINGS
            && h.stream == 0
            && h.flags & 0x1 == 0
            && h.len.is_multiple_of(6)
            && h.len <= 6 * 16
    })
}

/// Whether a whole syscall's bytes are a run of plausible frames ending exactly at its end
/// (mid-connection detection and resync: a strong signal, rarely matched by chance).
pub(crate) fn is_frame_run(b: &[u8]) -> bool {
    let mut off = 0usize;
    let mut frames = 0;
    while off < b.len() {
        let Some(h) = b.get(off..).and_then(FrameHeader::parse) else {
            return false;
        };
        if !h.plausible() {
            return false;
        }
        off += 9 + h.len as usize;
        frames += 1;
    }
    frames > 0 && off == b.len()
}

/// Whether `b` starts with plausible frame headers: every header that lies wholly within `b`
/// is plausible (the last frame may run past the captured prefix).
pub(crate) fn starts_with_frames(b: &[u8]) -> bool {
    let mut off = 0usize;
    let mut frames = 0;
    while let Some(h) = b.get(off..).and_then(FrameHeader::parse) {
        if !h.plausible() {
            return false;
        }
        frames += 1;
        off += 9 + h.len as usize;
    }
    frames > 0
}

/// A decoded header block, or the admission that it could not be decoded.
#[derive(Clone, Debug)]
pub(crate) enum Block {
    Request(ReqInfo),
    Response(RespInfo),
    Unknown,
}

/// The connection's half of the conversation with a frame parser.
pub(crate) trait H2Sink {
    fn headers(&mut self, stream: u32, block: Block, end_stream: bool, start: &Ctx, ctx: &Ctx);
    /// Captured bytes of a DATA frame's payload (padding length byte removed).
    fn data_bytes(&mut self, stream: u32, bytes: &[u8]);
    fn data_gap(&mut self, stream: u32);
    /// A DATA frame ended (`len`: its whole length).
    fn data_end(&mut self, stream: u32, len: u64, end_stream: bool, ctx: &Ctx);
    fn rst(&mut self, stream: u32, code: u32, ctx: &Ctx);
    fn goaway(&mut self, last_stream: u32, code: u32, ctx: &Ctx);
    /// Frame sync lost: frames went by unseen.
    fn lost(&mut self, ctx: &Ctx);
    fn truncated(&mut self);
    fn parse_error(&mut self);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Client direction of a fresh connection: the 24-byte preface, `got` bytes matched.
    Preface { got: usize },
    /// Reading a 9-byte frame header (`hdr_got` bytes so far).
    Header,
    /// Inside a frame's payload.
    Payload,
    /// Out of sync: wait for a syscall that is a run of whole frames.
    Lost,
}

pub(crate) struct H2Dir {
    side: Side,
    state: State,
    hdr: [u8; 9],
    hdr_got: usize,
    frame: FrameHeader,
    frame_start: Ctx,
    remaining: u64,
    /// Payload of the current frame, kept for the frame kinds we read.
    keep: bool,
    payload: Vec<u8>,
    payload_cut: bool,
    /// DATA padding: bytes still to drop at the payload start (the pad-length byte).
    data_skip: u64,
    /// Header block being assembled across HEADERS + CONTINUATION.
    block: Vec<u8>,
    block_stream: u32,
    block_end_stream: bool,
    block_push: bool,
    block_cut: bool,
    block_start: Ctx,
    in_block: bool,
    /// Its header blocks as fields.
    blocks: Blocks,
    cap: usize,
}

impl H2Dir {
    /// `preface`: this is the client direction of a connection seen from its start.
    /// `hpack_ok`: false when capture started mid-connection.
    pub(crate) fn new(side: Side, preface: bool, hpack_ok: bool, cap: usize) -> Self {
        H2Dir {
            side,
            state: if preface {
                State::Preface { got: 0 }
            } else {
                State::Header
            },
            hdr: [0; 9],
            hdr_got: 0,
            frame: FrameHeader::default(),
            frame_start: Ctx::default(),
            remaining: 0,
            keep: false,
            payload: Vec::new(),
            payload_cut: false,
            data_skip: 0,
            block: Vec::new(),
            block_stream: 0,
            block_end_stream: false,
            block_push: false,
            block_cut: false,
            block_start: Ctx::default(),
            in_block: false,
            blocks: Blocks::new(hpack_ok),
            cap: cap.max(256),
        }
    }

    pub(crate) fn new_lost(side: Side, cap: usize) -> Self {
        let mut d = Self::new(side, false, false, cap);
        d.state = State::Lost;
        d
    }

    pub(crate) fn buffered(&self) -> usize {
        self.payload.capacity() + self.block.capacity()
    }

    /// A syscall's bytes begin: a lost direction resyncs on a run of whole frames, or, for
    /// bytes the observed process wrote, on plausible frame headers (HTTP/2 writers write whole
    /// frames, so a write starts at a frame; reads may start anywhere).
    pub(crate) fn event_start(&mut self, payload: &[u8], complete: bool, written: bool) {
        // Only a lost direction looks (the walk over the frame headers was ~6% of the gRPC
        // reassembly when it ran on every syscall).
        if self.state != State::Lost {
            return;
        }
        let aligned =
            (complete && is_frame_run(payload)) || (written && starts_with_frames(payload));
        if aligned {
            self.state = State::Header;
            self.hdr_got = 0;
            self.in_block = false;
        }
    }

    pub(crate) fn feed(&mut self, mut data: &[u8], ctx: &Ctx, sink: &mut impl H2Sink) {
        while !data.is_empty() {
            match self.state {
                State::Preface { got } => {
                    let want = PREFACE.get(got..).unwrap_or_default();
                    let n = want.len().min(data.len());
                    let (head, rest) = data.split_at(n);
                    if want.get(..n) != Some(head) {
                        sink.parse_error();
                        self.lose(ctx, sink);
                        return;
                    }
                    data = rest;
                    self.state = if got + n == PREFACE.len() {
                        State::Header
                    } else {
                        State::Preface { got: got + n }
                    };
                }
                State::Header => {
                    if self.hdr_got == 0 {
                        self.frame_start = *ctx;
                        // The common case: the whole frame lies in these bytes. Read where it
                        // lies instead of copied into the header and payload buffers first
                        // (those copies and their state steps were most of the frame walk).
                        if let Some(h) = FrameHeader::parse(data)
                            && let Some(rest) = data.get(9..)
                            && let Some(payload) = rest.get(..h.len as usize)
                        {
                            data = rest.get(h.len as usize..).unwrap_or_default();
                            self.whole_frame(h, payload, ctx, sink);
                            continue;
                        }
                    }
                    let n = (9 - self.hdr_got).min(data.len());
                    let (head, rest) = data.split_at(n);
                    if let Some(dst) = self.hdr.get_mut(self.hdr_got..self.hdr_got + n) {
                        dst.copy_from_slice(head);
                    }
                    self.hdr_got += n;
                    data = rest;
                    if self.hdr_got == 9 {
                        self.hdr_got = 0;
                        self.begin_frame(ctx, sink);
                    }
                }
                State::Payload => {
                    let take = usize::try_from(self.remaining)
                        .unwrap_or(usize::MAX)
                        .min(data.len());
                    let (chunk, rest) = data.split_at(take);
                    data = rest;
                    self.payload_bytes(chunk, sink);
                    self.remaining -= take as u64;
                    if self.remaining == 0 {
                        self.end_frame(ctx, sink);
                    }
                }
                State::Lost => return,
            }
        }
    }

    pub(crate) fn gap(&mut self, mut n: u64, ctx: &Ctx, sink: &mut impl H2Sink) {
        while n > 0 {
            match self.state {
                State::Preface { .. } | State::Header => {
                    sink.truncated();
                    self.lose(ctx, sink);
                    return;
                }
                State::Payload => {
                    let take = self.remaining.min(n);
                    n -= take;
                    self.remaining -= take;
                    if self.frame.kind == DATA {
                        let skipped = self.data_skip.min(take);
                        self.data_skip -= skipped;
                        sink.data_gap(self.frame.stream);
                    } else if self.keep {
                        self.payload_cut = true;
                    }
                    if self.remaining == 0 {
                        self.end_frame(ctx, sink);
                    }
                }
                State::Lost => return,
            }
        }
    }

    fn lose(&mut self, ctx: &Ctx, sink: &mut impl H2Sink) {
        self.state = State::Lost;
        // Header blocks may have gone by unseen: the dynamic table is unknowable from here on.
        self.blocks.forget();
        self.in_block = false;
        self.block.clear();
        self.payload.clear();
        sink.lost(ctx);
    }

    /// A frame whose header and payload are all in one syscall's captured bytes: the same steps
    /// as [`Self::begin_frame`], the payload's bytes and [`Self::end_frame`], without buffering.
    fn whole_frame(&mut self, h: FrameHeader, payload: &[u8], ctx: &Ctx, sink: &mut impl H2Sink) {
        if !self.enter_frame(h, ctx, sink) {
            return;
        }
        self.state = State::Header;
        if h.kind == DATA {
            // The pad-length byte is not content (the padding itself is fed, as when buffered).
            let content = if h.flags & FLAG_PADDED != 0 {
                payload.get(1..).unwrap_or_default()
            } else {
                payload
            };
            if !content.is_empty() {
                sink.data_bytes(h.stream, content);
            }
        }
        let (n, cut) = if self.keep {
            self.kept_of(h.kind, 0, payload.len())
        } else {
            (0, false)
        };
        self.end_frame_kind(h, payload.get(..n).unwrap_or_default(), cut, ctx, sink);
        self.release_block();
    }

    /// Of `n` more payload bytes of a kept frame of `kind`, `held` kept already: how many are
    /// kept (up to the cap), and whether leaving the rest out cuts the payload. GOAWAY's debug
    /// data is not needed: its first 8 bytes are kept, and leaving the rest out is no cut.
    fn kept_of(&self, kind: u8, held: usize, n: usize) -> (usize, bool) {
        let limit = if kind == GOAWAY { 8 } else { self.cap };
        let room = limit.saturating_sub(held);
        (n.min(room), n > room && kind != GOAWAY)
    }

    /// A frame ended outside a header block: the block buffer is not kept large.
    fn release_block(&mut self) {
        if !self.in_block {
            self.block = recycle(std::mem::take(&mut self.block));
        }
    }

    /// A frame's header is read: checked against the header block in progress (false: the
    /// connection lost its framing) and its kind's handling chosen.
    fn enter_frame(&mut self, h: FrameHeader, ctx: &Ctx, sink: &mut impl H2Sink) -> bool {
        // A header block must continue with CONTINUATION frames on its stream only.
        if self.in_block && (h.kind != CONTINUATION || h.stream != self.block_stream) {
            sink.parse_error();
            self.lose(ctx, sink);
            return false;
        }
        self.keep = matches!(
            h.kind,
            HEADERS | CONTINUATION | PUSH_PROMISE | RST_STREAM | GOAWAY
        );
        true
    }

    fn begin_frame(&mut self, ctx: &Ctx, sink: &mut impl H2Sink) {
        let Some(h) = FrameHeader::parse(&self.hdr) else {
            return;
        };
        if !self.enter_frame(h, ctx, sink) {
            return;
        }
        // Read by the payload's steps and at its end (a whole frame needs no copy of it).
        self.frame = h;
        self.payload.clear();
        self.payload_cut = false;
        self.data_skip = if h.kind == DATA && h.flags & FLAG_PADDED != 0 {
            1
        } else {
            0
        };
        self.remaining = u64::from(h.len);
        self.state = State::Payload;
        if self.remaining == 0 {
            self.end_frame(ctx, sink);
        }
    }

    fn payload_bytes(&mut self, mut chunk: &[u8], sink: &mut impl H2Sink) {
        if self.frame.kind == DATA {
            if self.data_skip > 0 && !chunk.is_empty() {
                self.data_skip = 0;
                chunk = chunk.get(1..).unwrap_or_default();
            }
            if !chunk.is_empty() {
                sink.data_bytes(self.frame.stream, chunk);
            }
            return;
        }
        if !self.keep {
            return;
        }
        let (n, cut) = self.kept_of(self.frame.kind, self.payload.len(), chunk.len());
        self.payload_cut |= cut;
        self.payload
            .extend_from_slice(chunk.get(..n).unwrap_or_default());
    }

    fn end_frame(&mut self, ctx: &Ctx, sink: &mut impl H2Sink) {
        self.state = State::Header;
        let h = self.frame;
        let payload = std::mem::take(&mut self.payload);
        self.end_frame_kind(h, &payload, self.payload_cut, ctx, sink);
        self.payload = recycle(payload);
        self.release_block();
    }

    /// A frame ended; `payload`: what was kept of it (see `keep`), `payload_cut`: less than all.
    fn end_frame_kind(
        &mut self,
        h: FrameHeader,
        payload: &[u8],
        payload_cut: bool,
        ctx: &Ctx,
        sink: &mut impl H2Sink,
    ) {
        match h.kind {
            DATA => sink.data_end(
                h.stream,
                u64::from(h.len),
                h.flags & FLAG_END_STREAM != 0,
                ctx,
            ),
            HEADERS | PUSH_PROMISE => {
                let fragment = header_fragment(payload, h);
                self.block.clear();
                self.block_stream = h.stream;
                self.block_end_stream = h.kind == HEADERS && h.flags & FLAG_END_STREAM != 0;
                self.block_push = h.kind == PUSH_PROMISE;
                self.block_start = self.frame_start;
                self.in_block = true;
                // A fragment cut by the capture keeps its prefix: whole instructions in it
                // still decode (the table before it is known).
                if h.flags & FLAG_END_HEADERS != 0 {
                    // The whole block is this frame's fragment (nearly always): decoded where
                    // it lies instead of copied into the block buffer first.
                    // (The payload is already held to the cap, so the block is too.)
                    self.block_cut = fragment.is_none() || payload_cut;
                    self.end_block_of(fragment.unwrap_or_default(), ctx, sink);
                } else {
                    self.block_cut = false;
                    match fragment {
                        Some(f) => self.push_fragment(f),
                        None => self.block_cut = true,
                    }
                    self.block_cut |= payload_cut;
                }
            }
            CONTINUATION => {
                self.push_fragment(payload);
                self.block_cut |= payload_cut;
                if h.flags & FLAG_END_HEADERS != 0 {
                    self.end_block(ctx, sink);
                }
            }
            RST_STREAM => {
                let code = be32(payload, 0).unwrap_or_else(|| {
                    sink.truncated();
                    0
                });
                sink.rst(h.stream, code, ctx);
            }
            GOAWAY => {
                if let (Some(last), Some(code)) = (be32(payload, 0), be32(payload, 4)) {
                    sink.goaway(last & 0x7fff_ffff, code, ctx);
                } else {
                    sink.truncated();
                }
            }
            _ => {}
        }
    }

    fn push_fragment(&mut self, f: &[u8]) {
        // After a cut, later bytes are not contiguous with the prefix we hold.
        if self.block_cut {
            return;
        }
        if self.block.len() + f.len() > self.cap {
            self.block_cut = true;
            return;
        }
        self.block.extend_from_slice(f);
    }

    /// The held block (its fragments joined) is complete.
    fn end_block(&mut self, ctx: &Ctx, sink: &mut impl H2Sink) {
        let mut block = std::mem::take(&mut self.block);
        self.end_block_of(&block, ctx, sink);
        block.clear();
        self.block = block;
    }

    /// `bytes` is the whole header block (or, when `block_cut`, its captured prefix).
    fn end_block_of(&mut self, bytes: &[u8], ctx: &Ctx, sink: &mut impl H2Sink) {
        self.in_block = false;
        // A promised request's fields are a request's.
        let side = if self.block_push {
            Side::Request
        } else {
            self.side
        };
        let shape = blocks::Shape {
            side,
            cut: self.block_cut,
            ends_stream: self.block_end_stream,
            remembered: !self.block_push,
        };
        if self.block_cut {
            sink.truncated();
        }
        let block = self.blocks.read(bytes, shape);
        if self.block_push {
            // Promised requests are not exchanges we pair; decoding kept the table in sync.
            return;
        }
        let start = self.block_start;
        sink.headers(self.block_stream, block, self.block_end_stream, &start, ctx);
    }
}

/// The header block fragment of a HEADERS or PUSH_PROMISE payload (padding, priority and the
/// promised stream id removed).
fn header_fragment(p: &[u8], h: FrameHeader) -> Option<&[u8]> {
    let mut start = 0usize;
    let mut end = p.len();
    if h.flags & FLAG_PADDED != 0 {
        let pad = usize::from(*p.first()?);
        start += 1;
        // Padding ends the frame; `p` may be only a captured prefix of it.
        end = end.min((h.len as usize).checked_sub(pad)?);
    }
    if h.kind == HEADERS && h.flags & FLAG_PRIORITY != 0 {
        start += 5;
    }
    if h.kind == PUSH_PROMISE {
        start += 4;
    }
    p.get(start..end)
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    let s: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
    Some(u32::from_be_bytes(s))
}
