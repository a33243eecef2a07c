//! h2c as frames: one upstream connection per client connection, stream ids, SETTINGS, flow
//! control, PING and GOAWAY passed through as the two ends sent them, so the callee and the
//! caller negotiate with each other as they would without the shim. The relay reads what it
//! must and changes as little as it can:
//!
//! - Client header blocks are decoded (an HPACK decoder in step with the callee's) for the
//!   request's key and forwarded byte for byte. A request that may be a suppressed retry (a
//!   marker, or some failure is remembered) waits for its body's first bytes, as the key needs
//!   them; other requests go at once and their key is completed as their body passes.
//! - A suppressed retry never reaches the callee: its frames are left out and the relay answers
//!   on the client's stream with literals that leave the client's HPACK table alone. A block
//!   left out may have added to the callee's table, so every later client block on that
//!   connection is re-encoded as literals without indexing (the callee's table is then never
//!   referenced). The DATA of a left-out stream is credited back to the client (WINDOW_UPDATE),
//!   since the callee, which never saw it, never will.
//! - Response header blocks are decoded (in step with the client's decoder) for the status,
//!   grpc-status and claim; a failure's block gets the claim and the gRPC pushback appended as a
//!   CONTINUATION of literals without indexing.
//!
//! Blocks are forwarded whole, so a local answer is never written inside another stream's
//! HEADERS / CONTINUATION run. A frame the relay cannot read makes it stop reading and pass the
//! rest of the connection through untouched (fail open), unless a block was already left out
//! (the callee could not read what follows): then the connection ends.
use std::{collections::HashMap, sync::Arc, time::Instant};

use bytes::{Buf, Bytes, BytesMut};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use self::{
    block::{block_extent, decode_into},
    fields::Fields,
    frame::{CONTINUATION, DATA, END_STREAM, HEADERS, Head, RST_STREAM},
    stream::{Dropped, Held, Stream, body_ahead, put_answer, request_of, settle},
};
use super::{ConnInfo, Ctx, ProxyError, bump};
use crate::{
    actuate::shim::{answer::BODY_WAIT, policy::Verdict},
    l7::hpack::Decoder,
};

/// Largest HPACK table a peer may ask for that the relay follows; past it the connection is
/// unreadable and passed through untouched, as l7 gives up such a table (bounded memory per
/// connection: loona's decoder followed any size a peer announced).
const MAX_HPACK_TABLE: usize = 64 * 1024;

#[cfg(test)]
mod conversation;
mod block;
mod fields;
pub mod frame;
pub(super) mod pooled;
mod response;
mod stream;
#[cfg(test)]
mod tests;

const PREFACE_LEN: usize = 24;
/// What one read asks for: a frame of the default maximum size and its header, about. Buffers
/// start there and grow only for what a burst needs.
const READ_CHUNK: usize = 16 * 1024;
/// Bytes waiting to be written toward one side before the relay stops reading the other.
const OUT_HIGH: usize = 1 << 20;
/// Bytes a held request may have queued behind it before it is decided with what it has.
const HOLD_MAX: usize = 1 << 20;
/// Streams followed at once (the callee's SETTINGS_MAX_CONCURRENT_STREAMS bounds real ones);
/// past this a new stream is relayed unobserved.
const MAX_STREAMS: usize = 4096;

/// What reading one side's buffer came to.
enum Step {
    /// Need more bytes (or the held request's deadline).
    More,
    /// A frame that cannot be read: pass the rest through.
    Unreadable(&'static str),
}

struct Relay {
    ctx: Arc<Ctx>,
    info: ConnInfo,
    req_dec: Decoder,
    resp_dec: Decoder,
    /// The last client block decoded (a held request's, until it is decided).
    req_fields: Fields,
    resp_fields: Fields,
    streams: HashMap<u32, Stream>,
    dropped: Dropped,
    last_client_stream: u32,
    reencode: bool,
    blind: bool,
    preface_left: usize,
    held: Option<Held>,
    to_server: BytesMut,
    to_client: BytesMut,
}

/// Relays one h2c connection; `prefix` is what detection read from the client already.
pub(super) async fn relay(
    mut client: TcpStream,
    prefix: Bytes,
    mut upstream: TcpStream,
    info: ConnInfo,
    ctx: Arc<Ctx>,
) -> Result<(), ProxyError> {
    let _ = upstream.set_nodelay(true);
    let mut r = Relay::new(ctx, info);
    let mut cbuf = BytesMut::with_capacity(READ_CHUNK);
    cbuf.extend_from_slice(&prefix);
    let mut sbuf = BytesMut::with_capacity(READ_CHUNK);
    let (mut cr, mut cw) = client.split();
    let (mut sr, mut sw) = upstream.split();
    let (mut client_eof, mut server_eof) = (false, false);
    r.on_client(&mut cbuf, false);
    loop {
        for b in [&mut cbuf, &mut sbuf] {
            if b.capacity() - b.len() < READ_CHUNK / 4 {
                b.reserve(READ_CHUNK);
            }
        }
        for b in [&mut r.to_server, &mut r.to_client] {
            // A burst's buffer is not kept by an idle connection.
            if b.is_empty() && b.capacity() > 4 * READ_CHUNK {
                *b = BytesMut::new();
            }
        }
        let deadline = r.held.as_ref().map(|h| h.deadline);
        let read_client = !client_eof && r.to_server.len() < OUT_HIGH;
        let read_server = !server_eof && r.to_client.len() < OUT_HIGH;
        tokio::select! {
            n = cr.read_buf(&mut cbuf), if read_client => {
                match n {
                    Ok(n) if n > 0 => r.on_client(&mut cbuf, false),
                    _ => client_eof = true,
                }
            }
            n = sr.read_buf(&mut sbuf), if read_server => {
                match n {
                    Ok(n) if n > 0 => r.on_server(&mut sbuf),
                    _ => server_eof = true,
                }
            }
            w = sw.write(&r.to_server), if !r.to_server.is_empty() => {
                r.to_server.advance(w?);
            }
            w = cw.write(&r.to_client), if !r.to_client.is_empty() => {
                r.to_client.advance(w?);
            }
            () = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)),
                if deadline.is_some() => r.on_client(&mut cbuf, true),
        }
        if client_eof {
            // The caller is gone: what it sent goes on, nothing comes back to it.
            let rest = r.release_all(&mut cbuf);
            sw.write_all(&rest).await?;
            let _ = sw.shutdown().await;
            return Ok(());
        }
        if server_eof {
            r.upstream_ended();
            cw.write_all(&r.to_client).await?;
            let _ = cw.shutdown().await;
            return Ok(());
        }
        if r.blind && r.reencode {
            return Err(ProxyError::Relay("unreadable frame after a left-out block"));
        }
    }
}

impl Relay {
    fn new(ctx: Arc<Ctx>, info: ConnInfo) -> Relay {
        Relay {
            ctx,
            info,
            req_dec: Decoder::new(MAX_HPACK_TABLE),
            resp_dec: Decoder::new(MAX_HPACK_TABLE),
            req_fields: Fields::default(),
            resp_fields: Fields::default(),
            streams: HashMap::new(),
            dropped: Dropped::default(),
            last_client_stream: 0,
            reencode: false,
            blind: false,
            preface_left: PREFACE_LEN,
            held: None,
            to_server: BytesMut::new(),
            to_client: BytesMut::new(),
        }
    }

    /// Client bytes: relay every complete frame; `force` decides a held request now.
    fn on_client(&mut self, buf: &mut BytesMut, force: bool) {
        if let Err(Step::Unreadable(why)) = self.client_frames(buf, force) {
            tracing::debug!(peer = %self.info.peer, why, "h2c relay: passing the client's bytes through");
            self.blind = true;
        }
        if self.blind {
            // What was held goes on with the rest, as it came.
            self.held = None;
            self.to_server.extend_from_slice(buf);
            buf.clear();
        }
    }

    fn client_frames(&mut self, buf: &mut BytesMut, mut force: bool) -> Result<(), Step> {
        if self.blind {
            return Ok(());
        }
        if self.preface_left > 0 {
            let n = self.preface_left.min(buf.len());
            self.to_server.extend_from_slice(&buf.split_to(n));
            self.preface_left -= n;
            if self.preface_left > 0 {
                return Ok(());
            }
        }
        loop {
            if self.held.is_some() {
                if buf.len() > HOLD_MAX {
                    force = true;
                }
                match self.try_release(buf, force) {
                    Ok(()) => {}
                    Err(Step::More) => return Ok(()),
                    Err(e) => return Err(e),
                }
                force = false;
                continue;
            }
            let Some(head) = Head::parse(buf) else {
                return Ok(());
            };
            if head.kind == HEADERS {
                let Some(len) = block_extent(buf, &head)? else {
                    return Ok(());
                };
                self.decode_block(buf, len, Side::Request)?;
                self.client_block(buf, head, len)?;
                continue;
            }
            if head.kind == CONTINUATION {
                return Err(Step::Unreadable("CONTINUATION outside a header block"));
            }
            if buf.len() < head.total() {
                return Ok(());
            }
            let f = buf.split_to(head.total());
            if self.dropped.has(head.stream) {
                if head.kind == DATA && head.len > 0 {
                    // The callee never saw it, so never credits it: we do.
                    frame::put_window_update(&mut self.to_client, 0, head.len as u32);
                }
                continue;
            }
            match head.kind {
                DATA => self.client_data(&head, &f)?,
                // The caller gave the request up: no outcome of the callee's to record.
                RST_STREAM => {
                    self.streams.remove(&head.stream);
                }
                _ => {}
            }
            self.to_server.extend_from_slice(&f);
        }
    }

    /// A decoded client block (request headers or trailers) at the front of `buf`.
    fn client_block(&mut self, buf: &mut BytesMut, head: Head, len: usize) -> Result<(), Step> {
        let end_stream = head.has(END_STREAM);
        if self.dropped.has(head.stream) {
            buf.advance(len);
            return Ok(());
        }
        let new = head.stream > self.last_client_stream && head.stream % 2 == 1;
        if !new {
            // Trailers (or a block of a stream we do not follow): on as they are.
            self.send_block(buf, head, len);
            if end_stream {
                self.settle(head.stream);
            }
            return Ok(());
        }
        self.last_client_stream = head.stream;
        bump(&self.ctx.stats.requests);
        let Some(st) = request_of(&self.ctx, &self.info, &self.req_fields) else {
            // No method: not a request we can key. On it goes.
            self.send_block(buf, head, len);
            return Ok(());
        };
        let may_answer = st.marked || self.ctx.tracker.remembers_failures();
        if end_stream || may_answer {
            // Decided now when it has no body; else once its body's first bytes are here.
            self.held = Some(Held {
                stream: head.stream,
                block_len: len,
                end_stream,
                deadline: tokio::time::Instant::now() + BODY_WAIT,
                st,
            });
            return Ok(());
        }
        self.send_block(buf, head, len);
        if self.streams.len() < MAX_STREAMS {
            self.streams.insert(head.stream, st);
        }
        Ok(())
    }

    /// DATA on a followed stream feeds its key's body digest.
    fn client_data(&mut self, head: &Head, f: &[u8]) -> Result<(), Step> {
        let Some(st) = self.streams.get_mut(&head.stream) else {
            return Ok(());
        };
        if let Some(d) = st.digest.as_mut() {
            let payload = f.get(frame::HEADER_LEN..).unwrap_or_default();
            let r = frame::content(head, payload).map_err(|_| Step::Unreadable("DATA padding"))?;
            let more = d.feed(payload.get(r).unwrap_or_default());
            if !more || head.has(END_STREAM) {
                settle(&self.ctx, &self.info, st);
            }
        }
        Ok(())
    }

    /// A followed request's key is complete (its digest full, its body or its wait over):
    /// the tracker counts it now, if it has not (it went on already, whatever it says).
    fn settle(&mut self, stream: u32) {
        if let Some(st) = self.streams.get_mut(&stream) {
            settle(&self.ctx, &self.info, st);
        }
    }

    /// The held request, once its body's first bytes are buffered (or `force`): decided.
    fn try_release(&mut self, buf: &mut BytesMut, force: bool) -> Result<(), Step> {
        let Some(h) = self.held.as_mut() else {
            return Ok(());
        };
        let (ready, ended, digest) = body_ahead(buf, h.stream, h.block_len, h.end_stream)?;
        if !ready && !force {
            return Err(Step::More);
        }
        let Some(mut h) = self.held.take() else {
            return Ok(());
        };
        h.st.key.body = digest.finish();
        h.st.digest = None;
        h.st.counted = true;
        let now = Instant::now();
        let suppressed = self.ctx.view.suppression(&self.info.orig, now);
        let v = self
            .ctx
            .tracker
            .on_request(&h.st.key, h.st.marked, suppressed, now);
        let head = Head::parse(buf).ok_or(Step::Unreadable("held block vanished"))?;
        match v {
            Verdict::Answer { reason, reply } => {
                bump(&self.ctx.stats.suppressed);
                tracing::debug!(peer = %self.info.peer, orig = %self.info.orig, reason = reason.as_str(), "retry answered locally");
                buf.advance(h.block_len);
                // The callee's HPACK table may have missed what that block added.
                self.reencode = true;
                self.dropped.add(h.stream);
                put_answer(
                    &mut self.to_client,
                    h.stream,
                    reason,
                    reply,
                    h.st.grpc,
                    ended,
                );
            }
            Verdict::Forward { retry } => {
                if retry {
                    bump(&self.ctx.stats.retries_forwarded);
                }
                self.send_block(buf, head, h.block_len);
                if self.streams.len() < MAX_STREAMS {
                    self.streams.insert(h.stream, h.st);
                }
            }
        }
        Ok(())
    }

    /// The block at the front of `buf` (`len` bytes of frames) to the callee: as it is, or
    /// re-encoded once a block was left out.
    fn send_block(&mut self, buf: &mut BytesMut, head: Head, len: usize) {
        let frames = buf.split_to(len);
        if self.reencode {
            let block = self.req_fields.encode();
            frame::put_block(&mut self.to_server, head.stream, head.flags, &block);
        } else {
            self.to_server.extend_from_slice(&frames);
        }
    }

    /// Everything still buffered from the client, as it would go (the held request forwarded).
    fn release_all(&mut self, buf: &mut BytesMut) -> BytesMut {
        if self.held.is_some() {
            self.on_client(buf, true);
        }
        let mut rest = std::mem::take(&mut self.to_server);
        rest.extend_from_slice(buf);
        buf.clear();
        rest
    }

    /// Decodes the block of `len` bytes of frames at the front of `buf` into `self.fields`.
    fn decode_block(&mut self, buf: &[u8], len: usize, side: Side) -> Result<(), Step> {
        let (dec, fields) = match side {
            Side::Request => (&mut self.req_dec, &mut self.req_fields),
            Side::Response => (&mut self.resp_dec, &mut self.resp_fields),
        };
        decode_into(dec, fields, buf, len)
    }
}

#[derive(Clone, Copy)]
enum Side {
    Request,
    Response,
}
