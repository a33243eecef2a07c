//! h2c multiplexed (`--shim-h2-upstream shared`, the default): HTTP/2 terminated frame by
//! frame on both sides, every client connection's streams carried on one of the io thread's
//! pooled connections to the original destination (`mux`; which one in `pool`), as HAProxy's
//! `http-reuse always` does. The callee then serves
//! a few busy connections instead of one per caller, which is where HAProxy's h2c latency comes
//! from; the `h2` crate did the same at three times the CPU per stream (stop 38's spike).
//!
//! The policy is the frame relay's, on the same functions: request blocks decoded for the key,
//! a request that may be a suppressed retry held for its body's first bytes, a suppressed retry
//! answered on the client's stream, a failure's block given the claim and the pushback,
//! outcomes recorded where responses end. What differs is what terminating takes:
//!
//! - Each side has its own SETTINGS, windows, PINGs and HPACK state. Blocks are decoded on the
//!   side they came from and re-encoded for the other through the static table only
//!   (`frame::put_field`), so a block left out (a suppressed retry) never puts a table out of
//!   step.
//! - Flow control per hop: a stream's DATA goes on within the receiving side's windows, the
//!   rest waits in the shim, and the sender's stream window is given back as its bytes go on
//!   (so a slow reader holds only its own streams' windows). Connection windows are given back
//!   as bytes arrive: one stalled client never stops the connection all clients share.
//! - Streams over the callee's concurrent-stream limit wait in the shim, in order.
//! - A frame that cannot be read ends the client's connection (GOAWAY PROTOCOL_ERROR): there is
//!   no byte stream of its own to pass it through to. The callee's connection failing resets
//!   the streams it carried (REFUSED_STREAM for those it never saw, which a client may retry);
//!   the client connections go on over a new one.
use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
    time::Instant,
};

use bytes::{Buf, Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    sync::Notify,
};

use self::{
    mux::Mux,
    pool::{forget, mux_for},
};
use super::{
    super::{ConnInfo, Ctx, ProxyError, bump},
    BODY_WAIT, Dropped, HOLD_MAX, Held, MAX_HPACK_TABLE, OUT_HIGH, PREFACE_LEN, READ_CHUNK, Step,
    Stream,
    block::read_block,
    body_ahead,
    fields::Fields,
    frame::{
        self, ACK, CONTINUATION, DATA, END_STREAM, HEADERS, Head, PING, PROTOCOL_ERROR,
        PUSH_PROMISE, REFUSED_STREAM, RST_STREAM, SETTINGS, SETTINGS_INITIAL_WINDOW_SIZE,
        SETTINGS_MAX_CONCURRENT_STREAMS, WINDOW_UPDATE,
    },
    put_answer, request_of, settle,
};
use crate::{actuate::shim::policy::Verdict, l7::hpack::Decoder};

mod mux;
mod pool;
mod response;

/// The window each stream gets, both ways (the default 64 KiB would cap a stream's throughput
/// at one window per round trip through the shim).
const STREAM_WINDOW: u32 = 256 * 1024;
/// The connection window both ways; given back in batches of [`CONN_CREDIT_BATCH`].
const CONN_WINDOW: u32 = 4 << 20;
const CONN_CREDIT_BATCH: u32 = 1 << 20;
/// Streams a client may have open at once on its connection to the shim.
const CLIENT_MAX_STREAMS: u32 = 256;
const DEFAULT_WINDOW: i64 = 65_535;

/// What a pooled connection hands a client relay, in the order the callee sent it.
enum Event {
    /// A response block (headers, or trailers with `end`), decoded.
    Head {
        stream: u32,
        fields: Fields,
        end: bool,
    },
    /// DATA content; `flow`: the frame's length (padding included), what its window took.
    Data {
        stream: u32,
        data: Bytes,
        end: bool,
        flow: u32,
    },
    Reset {
        stream: u32,
        code: u32,
    },
    /// `n` bytes of the client's DATA went on: its stream window reopens.
    Credit {
        stream: u32,
        n: u32,
    },
}

/// A client relay's mailbox.
struct Inbox {
    events: Mutex<Vec<Event>>,
    wake: Notify,
}

impl Inbox {
    fn push(&self, e: Event) {
        self.events.lock().push(e);
        self.wake.notify_one();
    }
}

/// What waits for one side's windows on a stream, in the order it came: DATA content and
/// header blocks (trailers may not pass the data before them).
enum Queued {
    Data {
        data: Bytes,
        end: bool,
        /// Window to give back to the sender once the last of `data` went on (padding
        /// included, which never goes on).
        flow: u32,
    },
    Block(BytesMut, bool),
}

/// Writes what `q` holds for `stream` into `out`, DATA within the stream's `window` and the
/// connection's `conn`, in frames of at most the size every peer accepts; returns the window
/// the sender gets back for what went.
fn flush_queue(
    out: &mut BytesMut,
    stream: u32,
    q: &mut VecDeque<Queued>,
    window: &mut i64,
    conn: &mut i64,
) -> u32 {
    let mut credit = 0u32;
    while let Some(p) = q.front_mut() {
        match p {
            Queued::Block(b, end) => {
                frame::put_block(out, stream, if *end { END_STREAM } else { 0 }, b);
                q.pop_front();
            }
            Queued::Data { data, end, flow } => {
                let room = (*window).min(*conn).max(0) as usize;
                let n = data.len().min(room).min(frame::MIN_MAX_FRAME);
                if n == 0 && !data.is_empty() {
                    break;
                }
                let last = n == data.len();
                let flags = if last && *end { END_STREAM } else { 0 };
                frame::put_head(out, n, DATA, flags, stream);
                out.extend_from_slice(&data[..n]);
                data.advance(n);
                *window -= n as i64;
                *conn -= n as i64;
                if last {
                    credit += *flow;
                    q.pop_front();
                } else {
                    credit += n as u32;
                    *flow -= n as u32;
                }
            }
        }
    }
    credit
}

/// One client stream.
struct CStream {
    mux: Arc<Mux>,
    /// Its id on the callee's connection.
    id: u32,
    /// What the policy follows of it (`None`: not a request it can key).
    policy: Option<Stream>,
    /// What the client lets us send on it.
    window: i64,
    pending: VecDeque<Queued>,
    req_ended: bool,
    resp_ended: bool,
}

struct Client {
    ctx: Arc<Ctx>,
    info: ConnInfo,
    inbox: Arc<Inbox>,
    /// The inbox's last batch, emptied, kept for the next.
    events: Vec<Event>,
    mux: Option<Arc<Mux>>,
    dec: Decoder,
    fields: Fields,
    streams: HashMap<u32, CStream>,
    last_stream: u32,
    dropped: Dropped,
    held: Option<Held>,
    preface_left: usize,
    out: BytesMut,
    /// What the client lets us send on the connection, and its streams' initial window.
    conn_window: i64,
    peer_window: i64,
    /// Streams with something waiting for the client's window.
    blocked: VecDeque<u32>,
    /// DATA received and not yet credited back on the connection.
    received: u32,
    /// Why the connection must end (GOAWAY sent).
    failed: Option<&'static str>,
}

/// Relays one h2c client connection onto the io thread's pooled connection to its original
/// destination; `upstream` (dialled before detection) joins the pool when there is none.
pub(in super::super) async fn relay(
    mut client: TcpStream,
    prefix: Bytes,
    upstream: TcpStream,
    info: ConnInfo,
    ctx: Arc<Ctx>,
) -> Result<(), ProxyError> {
    let mut dialled = Some(upstream);
    let mut c = Client::new(ctx.clone(), info);
    c.mux = Some(mux_for(c.info.orig, &ctx, &mut dialled).await?);
    drop(dialled);
    let mut cbuf = BytesMut::with_capacity(READ_CHUNK);
    cbuf.extend_from_slice(&prefix);
    let (mut cr, mut cw) = client.split();
    let mut eof = false;
    c.on_client(&mut cbuf, false);
    let r = loop {
        if c.failed.is_some() {
            let _ = cw.write_all(&c.out).await;
            break Ok(());
        }
        if c.waits_for_connection(&cbuf) && c.mux.as_ref().is_none_or(|m| !m.usable()) {
            match mux_for(c.info.orig, &ctx, &mut None).await {
                Ok(m) => {
                    if let Some(old) = c.mux.replace(m) {
                        old.release();
                    }
                }
                Err(e) => break Err(ProxyError::Connect(e)),
            }
            c.on_client(&mut cbuf, false);
            continue;
        }
        if cbuf.capacity() - cbuf.len() < READ_CHUNK / 4 {
            cbuf.reserve(READ_CHUNK);
        }
        if c.out.is_empty() && c.out.capacity() > 4 * READ_CHUNK {
            c.out = BytesMut::new();
        }
        let deadline = c.held.as_ref().map(|h| h.deadline);
        let inbox = c.inbox.clone();
        tokio::select! {
            n = cr.read_buf(&mut cbuf), if !eof && c.out.len() < OUT_HIGH => match n {
                Ok(n) if n > 0 => c.on_client(&mut cbuf, false),
                _ => eof = true,
            },
            w = cw.write(&c.out), if !c.out.is_empty() => match w {
                Ok(n) => c.out.advance(n),
                Err(e) => break Err(ProxyError::Connect(e)),
            },
            () = inbox.wake.notified() => c.on_events(),
            () = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)),
                if deadline.is_some() => c.on_client(&mut cbuf, true),
        }
        if eof {
            // The caller is gone: what it sent goes on (a held request included), nothing
            // comes back to it.
            if c.held.is_some() {
                c.on_client(&mut cbuf, true);
            }
            break Ok(());
        }
    };
    c.detach();
    r
}

impl Client {
    fn new(ctx: Arc<Ctx>, info: ConnInfo) -> Client {
        let mut out = BytesMut::with_capacity(READ_CHUNK);
        frame::put_settings(
            &mut out,
            &[
                (SETTINGS_MAX_CONCURRENT_STREAMS, CLIENT_MAX_STREAMS),
                (SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
            ],
        );
        frame::put_window_update(&mut out, 0, CONN_WINDOW - DEFAULT_WINDOW as u32);
        Client {
            ctx,
            info,
            inbox: Arc::new(Inbox {
                events: Mutex::new(Vec::new()),
                wake: Notify::new(),
            }),
            events: Vec::new(),
            mux: None,
            dec: Decoder::new(MAX_HPACK_TABLE),
            fields: Fields::default(),
            streams: HashMap::new(),
            last_stream: 0,
            dropped: Dropped::default(),
            held: None,
            preface_left: PREFACE_LEN,
            out,
            conn_window: DEFAULT_WINDOW,
            peer_window: DEFAULT_WINDOW,
            blocked: VecDeque::new(),
            received: 0,
            failed: None,
        }
    }

    /// Whether what is buffered cannot go on without a live pooled connection: a held request,
    /// or a block that opens a stream.
    fn waits_for_connection(&self, buf: &[u8]) -> bool {
        self.held.is_some()
            || Head::parse(buf)
                .is_some_and(|h| h.kind == HEADERS && !self.streams.contains_key(&h.stream))
    }

    /// Its streams still open on pooled connections are cancelled there.
    fn detach(&mut self) {
        if let Some(m) = &self.mux {
            m.release();
        }
        let mut seen: Vec<&Arc<Mux>> = Vec::new();
        for s in self.streams.values() {
            if !seen.iter().any(|m| Arc::ptr_eq(m, &s.mux)) {
                seen.push(&s.mux);
            }
        }
        for m in seen {
            m.detach(&self.inbox);
        }
    }

    /// Client bytes: every complete frame acted on; `force` decides a held request now.
    fn on_client(&mut self, buf: &mut BytesMut, force: bool) {
        if self.failed.is_some() {
            buf.clear();
            return;
        }
        if let Err(why) = self.client_frames(buf, force) {
            tracing::debug!(peer = %self.info.peer, why, "h2c pooled relay: ending the client's connection");
            frame::put_goaway(&mut self.out, self.last_stream, PROTOCOL_ERROR);
            self.failed = Some(why);
            buf.clear();
        }
    }

    fn client_frames(&mut self, buf: &mut BytesMut, mut force: bool) -> Result<(), &'static str> {
        if self.preface_left > 0 {
            let n = self.preface_left.min(buf.len());
            buf.advance(n);
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
                if !self.try_release(buf, force)? {
                    return Ok(());
                }
                force = false;
                continue;
            }
            let Some(head) = Head::parse(buf) else {
                return Ok(());
            };
            // A new stream needs a live pooled connection: the relay's loop finds one first.
            // Frames of streams already open go on meanwhile (to the connection they are on,
            // which may be draining after a GOAWAY).
            if head.kind == HEADERS
                && !self.streams.contains_key(&head.stream)
                && self.mux.as_ref().is_none_or(|m| !m.usable())
            {
                return Ok(());
            }
            if head.kind == HEADERS {
                let Some(len) = read_block(&mut self.dec, &mut self.fields, buf, &head)? else {
                    return Ok(());
                };
                self.client_block(buf, head, len)?;
                continue;
            }
            if buf.len() < head.total() {
                return Ok(());
            }
            let f = buf.split_to(head.total()).freeze();
            let payload = f.slice(frame::HEADER_LEN..);
            match head.kind {
                DATA => self.client_data(&head, &payload)?,
                RST_STREAM => {
                    let code = read_u32(&payload).ok_or("RST_STREAM")?;
                    // The caller gave the request up: no outcome of the callee's to record.
                    if let Some(s) = self.streams.remove(&head.stream) {
                        s.mux.reset(s.id, code);
                    }
                }
                SETTINGS if head.flags & ACK == 0 => self.client_settings(&payload)?,
                PING if head.flags & ACK == 0 => frame::put_ping_ack(&mut self.out, &payload),
                WINDOW_UPDATE => {
                    let n = frame::window_increment(&payload).ok_or("WINDOW_UPDATE")?;
                    if head.stream == 0 {
                        self.conn_window += n;
                        self.flush_blocked();
                    } else if let Some(s) = self.streams.get_mut(&head.stream) {
                        s.window += n;
                        self.flush(head.stream);
                    }
                }
                CONTINUATION => return Err("CONTINUATION outside a header block"),
                PUSH_PROMISE => return Err("PUSH_PROMISE from a client"),
                // PRIORITY, GOAWAY (the client closes after), extensions.
                _ => {}
            }
        }
    }

    /// A decoded client block at the front of `buf`: a new request, or trailers.
    fn client_block(
        &mut self,
        buf: &mut BytesMut,
        head: Head,
        len: usize,
    ) -> Result<(), &'static str> {
        let end = head.has(END_STREAM);
        if self.dropped.has(head.stream) {
            buf.advance(len);
            return Ok(());
        }
        if let Some(s) = self.streams.get_mut(&head.stream) {
            // Trailers.
            buf.advance(len);
            s.req_ended |= end;
            s.mux.block(s.id, self.fields.encode(), end);
            if end && let Some(st) = s.policy.as_mut() {
                settle(&self.ctx, &self.info, st);
            }
            self.close_if_done(head.stream);
            return Ok(());
        }
        if head.stream <= self.last_stream || head.stream.is_multiple_of(2) {
            return Err("a client stream id that does not open a stream");
        }
        self.last_stream = head.stream;
        bump(&self.ctx.stats.requests);
        let st = request_of(&self.ctx, &self.info, &self.fields);
        let may_answer = st
            .as_ref()
            .is_some_and(|st| st.marked || self.ctx.tracker.remembers_failures());
        if (end || may_answer)
            && let Some(st) = st
        {
            // Decided now when it has no body; else once its body's first bytes are here.
            self.held = Some(Held {
                stream: head.stream,
                block_len: len,
                end_stream: end,
                deadline: tokio::time::Instant::now() + BODY_WAIT,
                st,
            });
            return Ok(());
        }
        buf.advance(len);
        self.open(head.stream, st, end);
        Ok(())
    }

    /// The decoded block opens `stream` on the pooled connection.
    fn open(&mut self, stream: u32, policy: Option<Stream>, end: bool) {
        let Some(mux) = self.mux.clone() else {
            return;
        };
        let block = self.fields.encode();
        let Some(id) = mux.open(&self.inbox, stream, &block, end) else {
            // The connection closed between the relay's check and now: the client may retry.
            bump(&self.ctx.stats.h2_refused);
            frame::put_rst(&mut self.out, stream, REFUSED_STREAM);
            return;
        };
        self.streams.insert(
            stream,
            CStream {
                mux,
                id,
                policy,
                window: self.peer_window,
                pending: VecDeque::new(),
                req_ended: end,
                resp_ended: false,
            },
        );
    }

    /// The held request, once its body's first bytes are buffered (or `force`): decided.
    /// Returns whether it was.
    fn try_release(&mut self, buf: &mut BytesMut, force: bool) -> Result<bool, &'static str> {
        let Some(h) = self.held.as_ref() else {
            return Ok(true);
        };
        let (ready, ended, digest) = match body_ahead(buf, h.stream, h.block_len, h.end_stream) {
            Ok(r) => r,
            Err(Step::Unreadable(why)) => return Err(why),
            Err(Step::More) => return Ok(false),
        };
        if !ready && !force {
            return Ok(false);
        }
        if self.mux.as_ref().is_none_or(|m| !m.usable()) {
            // Decided once the relay has a connection for it.
            return Ok(false);
        }
        let Some(mut h) = self.held.take() else {
            return Ok(true);
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
        buf.advance(h.block_len);
        match v {
            Verdict::Answer { reason, reply } => {
                bump(&self.ctx.stats.suppressed);
                tracing::debug!(peer = %self.info.peer, orig = %self.info.orig, reason = reason.as_str(), "retry answered locally");
                self.dropped.add(h.stream);
                put_answer(&mut self.out, h.stream, reason, reply, h.st.grpc, ended);
            }
            Verdict::Forward { retry } => {
                if retry {
                    bump(&self.ctx.stats.retries_forwarded);
                }
                self.open(h.stream, Some(h.st), h.end_stream);
            }
        }
        Ok(true)
    }

    /// DATA from the client: on to the callee within its windows; its key's digest fed.
    fn client_data(&mut self, head: &Head, payload: &Bytes) -> Result<(), &'static str> {
        // The connection's window comes back as bytes arrive; streams', as they go on.
        self.received += head.len as u32;
        if self.received >= CONN_CREDIT_BATCH {
            frame::put_window_update(&mut self.out, 0, self.received);
            self.received = 0;
        }
        let r = frame::content(head, payload).map_err(|_| "DATA padding")?;
        // A view of the frame, not a copy: it goes on as it is or waits for a window.
        let data = payload.slice(r);
        let end = head.has(END_STREAM);
        let Some(s) = self.streams.get_mut(&head.stream) else {
            // A left-out or finished stream: nothing goes on.
            return Ok(());
        };
        if let Some(st) = s.policy.as_mut()
            && let Some(d) = st.digest.as_mut()
        {
            let more = d.feed(&data);
            if !more || end {
                settle(&self.ctx, &self.info, st);
            }
        }
        s.req_ended |= end;
        // Padding never goes on: its share of the window comes back at once.
        let padding = head.len - data.len();
        let credit = s.mux.data(s.id, data, end) + padding;
        if !s.req_ended && credit > 0 {
            frame::put_window_update(&mut self.out, head.stream, credit as u32);
        }
        self.close_if_done(head.stream);
        Ok(())
    }

    fn client_settings(&mut self, payload: &[u8]) -> Result<(), &'static str> {
        let params = frame::settings_params(payload).ok_or("SETTINGS length")?;
        for (id, v) in params {
            if id == SETTINGS_INITIAL_WINDOW_SIZE {
                let v = i64::from(v);
                // Every open stream's window moves by the change (RFC 9113 §6.9.2).
                let delta = v - self.peer_window;
                self.peer_window = v;
                for st in self.streams.values_mut() {
                    st.window += delta;
                }
            }
        }
        frame::put_head(&mut self.out, 0, SETTINGS, ACK, 0);
        self.flush_blocked();
        Ok(())
    }

    /// Forgets `stream` once both sides ended and the client has the whole response.
    fn close_if_done(&mut self, stream: u32) {
        if self
            .streams
            .get(&stream)
            .is_some_and(|s| s.req_ended && s.resp_ended && s.pending.is_empty())
        {
            self.streams.remove(&stream);
        }
    }
}

fn read_u32(b: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(..4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests;
