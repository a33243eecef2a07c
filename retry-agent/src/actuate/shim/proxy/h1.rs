//! HTTP/1 as bytes: one upstream connection per client connection, every message passed on as
//! the caller and the callee wrote it (header names in their own case, chunks as they were
//! cut, keep-alive and close as each end says). The relay reads only what it must:
//!
//! - A request head is parsed for its key; its body is walked (length or chunks) to find where
//!   the next request starts, its first bytes digested for the key. A request that may be a
//!   retry to answer (a marker, or some failure remembered) waits up to [`BODY_WAIT`] for those
//!   bytes; others go at once.
//! - A suppressed retry never reaches the callee: its head and body are left out and the relay
//!   answers in its place in the response order (pipelined requests before it are answered
//!   first), or resets the connection when the last attempt was reset.
//! - A response head is parsed for its status and claim; a failure's head gets the claim
//!   header; its body is walked to find the response's end, where its outcome is recorded.
//!
//! A message the relay cannot read (a head too long or malformed, a bad chunk), an upgrade or
//! a CONNECT makes it stop reading and pass the rest of the connection through untouched.
use std::{collections::VecDeque, sync::Arc, time::Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use self::body::{Chunked, Framing};
use super::{ConnInfo, Ctx, ProxyError, bump, key_of_fields, net};
use crate::{
    actuate::shim::{
        answer::{self, BODY_WAIT, LocalAnswer},
        policy::{self, BodyDigest, FailureReply, RequestKey, SuppressReason, Verdict},
    },
    l7::{Claim, RETRY_SUPPRESSED_HEADER},
};

pub mod body;
mod response;
#[cfg(test)]
mod tests;

/// A head longer than this is not parsed: the connection is passed through.
const MAX_HEAD: usize = 64 * 1024;
/// Header fields parsed per head (more: passed through).
const MAX_FIELDS: usize = 128;
const READ_CHUNK: usize = 16 * 1024;
/// Bytes waiting to be written toward one side before the relay stops reading the other.
const OUT_HIGH: usize = 1 << 20;
/// Bytes a held request may have queued behind it before it is decided with what it has.
const HOLD_MAX: usize = 1 << 20;
/// Requests in flight followed at once (pipelining); past this the connection is passed
/// through.
const MAX_IN_FLIGHT: usize = 256;

/// A request whose response has not ended.
struct InFlight {
    key: RequestKey,
    /// Until the body's digest is complete.
    digest: Option<BodyDigest>,
    marked: bool,
    counted: bool,
    head: bool,
    /// Answered here: written when the responses before it are done.
    local: Option<Local>,
    status: Option<StatusCode>,
    claim: Claim,
    watch: bool,
}

/// A suppressed retry's answer.
#[derive(Clone)]
enum Local {
    /// The response, and whether the connection then closes (the request asked for it).
    Reply(Bytes, bool),
    /// The last attempt was reset: so is the connection.
    Reset,
}

/// How the connection ends once what is queued for the client is written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    Close,
    Reset,
}

/// Where the client's bytes are.
enum ReqState {
    Head,
    /// Forwarding a request's body.
    Body(Framing),
    /// Leaving out a suppressed request's body.
    Skip(Framing),
}

enum RespState {
    Head,
    Body(Framing),
}

struct Relay {
    ctx: Arc<Ctx>,
    info: ConnInfo,
    req: ReqState,
    resp: RespState,
    queue: VecDeque<InFlight>,
    /// Waiting for the head at the front of the client buffer's body, since then.
    held: Option<tokio::time::Instant>,
    blind: bool,
    /// A local answer ended the connection: it ends once the client's bytes are written.
    end: Option<End>,
    to_server: BytesMut,
    to_client: BytesMut,
}

/// Relays one HTTP/1 connection; `prefix` is what detection read from the client already.
pub(super) async fn relay(
    mut client: TcpStream,
    prefix: Bytes,
    mut upstream: TcpStream,
    info: ConnInfo,
    ctx: Arc<Ctx>,
) -> Result<(), ProxyError> {
    let _ = upstream.set_nodelay(true);
    let mut r = Relay {
        ctx,
        info,
        req: ReqState::Head,
        resp: RespState::Head,
        queue: VecDeque::new(),
        held: None,
        blind: false,
        end: None,
        to_server: BytesMut::new(),
        to_client: BytesMut::new(),
    };
    let mut cbuf = BytesMut::with_capacity(READ_CHUNK);
    cbuf.extend_from_slice(&prefix);
    let mut sbuf = BytesMut::with_capacity(READ_CHUNK);
    let (mut client_eof, mut server_eof, mut client_shut) = (false, false, false);
    r.on_client(&mut cbuf, false);
    let end = {
        let (mut cr, mut cw) = client.split();
        let (mut sr, mut sw) = upstream.split();
        loop {
            for b in [&mut cbuf, &mut sbuf] {
                if b.capacity() - b.len() < READ_CHUNK / 4 {
                    b.reserve(READ_CHUNK);
                }
            }
            for b in [&mut r.to_server, &mut r.to_client] {
                if b.is_empty() && b.capacity() > 4 * READ_CHUNK {
                    *b = BytesMut::new();
                }
            }
            if let Some(end) = r.end
                && r.to_client.is_empty()
            {
                break end;
            }
            let deadline = r.held.map(|t| t + BODY_WAIT);
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
                w = sw.write(&r.to_server), if !r.to_server.is_empty() && !client_shut => {
                    r.to_server.advance(w?);
                }
                w = cw.write(&r.to_client), if !r.to_client.is_empty() => {
                    r.to_client.advance(w?);
                }
                () = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)),
                    if deadline.is_some() => r.on_client(&mut cbuf, true),
            }
            if client_eof && !client_shut {
                // The caller is done sending: what it sent goes on, then its FIN. Answers
                // still come back until the callee closes (a half-close, as without the shim;
                // if the caller closed altogether, writing to it fails and ends this).
                if r.held.is_some() {
                    r.on_client(&mut cbuf, true);
                }
                r.to_server.extend_from_slice(&cbuf);
                cbuf.clear();
                sw.write_all(&r.to_server).await?;
                r.to_server.clear();
                let _ = sw.shutdown().await;
                client_shut = true;
            }
            if server_eof {
                r.upstream_ended();
                cw.write_all(&r.to_client).await?;
                let _ = cw.shutdown().await;
                return Ok(());
            }
        }
    };
    match end {
        // A suppressed retry whose last attempt was reset: so is this connection.
        End::Reset => net::reset_ref(&client),
        End::Close => {
            let _ = client.shutdown().await;
        }
    }
    Ok(())
}

impl Relay {
    /// Reading stops: the rest passes through as it is, unless the client's bytes are in the
    /// middle of a request left out (the callee would read the rest of its body as requests of
    /// their own): then the connection is reset.
    fn unreadable(&mut self, why: &'static str) {
        if matches!(self.req, ReqState::Skip(_)) {
            tracing::debug!(peer = %self.info.peer, why, "http1 relay: unreadable inside a left-out request; resetting");
            self.end = Some(End::Reset);
            self.to_server.clear();
        } else {
            tracing::debug!(peer = %self.info.peer, why, "http1 relay: passing the rest through");
            self.blind = true;
        }
    }

    fn on_client(&mut self, buf: &mut BytesMut, force: bool) {
        if self.readable()
            && let Err(why) = self.client_bytes(buf, force)
        {
            self.unreadable(why);
        }
        self.pass_rest(buf, true);
    }

    /// Still reading: not passing bytes through, not resetting.
    fn readable(&self) -> bool {
        !self.blind && self.end != Some(End::Reset)
    }

    /// What reading left in `buf`: passed on once the relay stopped reading, dropped once it
    /// resets the connection, else kept for more bytes.
    fn pass_rest(&mut self, buf: &mut BytesMut, toward_server: bool) {
        if self.end == Some(End::Reset) {
            buf.clear();
        } else if self.blind {
            self.held = None;
            let out = if toward_server {
                &mut self.to_server
            } else {
                &mut self.to_client
            };
            out.extend_from_slice(buf);
            buf.clear();
        }
    }

    fn client_bytes(&mut self, buf: &mut BytesMut, mut force: bool) -> Result<(), &'static str> {
        loop {
            if buf.is_empty() {
                return Ok(());
            }
            let (mut f, forward) = match self.req {
                ReqState::Head => {
                    if !self.request_head(buf, force)? {
                        return Ok(());
                    }
                    // A forced decision is for the request that was held, not the next one.
                    force = false;
                    continue;
                }
                ReqState::Body(f) => (f, true),
                ReqState::Skip(f) => (f, false),
            };
            let mut digest = if forward {
                self.queue.back_mut().and_then(|x| x.digest.take())
            } else {
                None
            };
            let step = f
                .walk(buf, |d| {
                    if let Some(g) = digest.as_mut() {
                        g.feed(d);
                    }
                })
                .map_err(|_| "malformed request body")?;
            let part = buf.split_to(step.used);
            if forward {
                self.to_server.extend_from_slice(&part);
                if let Some(x) = self.queue.back_mut() {
                    x.digest = digest;
                    if step.ended {
                        settle(&self.ctx, &self.info, x);
                    }
                }
            }
            self.req = match (step.ended, forward) {
                (true, _) => ReqState::Head,
                (false, true) => ReqState::Body(f),
                (false, false) => ReqState::Skip(f),
            };
            if !step.ended {
                return Ok(());
            }
        }
    }

    /// The request head at the front of `buf`: on, held or answered here. False: wait.
    fn request_head(&mut self, buf: &mut BytesMut, force: bool) -> Result<bool, &'static str> {
        let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
        let mut req = httparse::Request::new(&mut fields);
        let len = match req.parse(buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD => return Ok(false),
            _ => return Err("request head"),
        };
        let (Some(method), Some(target)) = (req.method, req.path) else {
            return Err("request line");
        };
        let mut headers = HeaderMap::with_capacity(req.headers.len());
        for h in req.headers.iter() {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(h.name.as_bytes()),
                HeaderValue::from_bytes(h.value),
            ) {
                headers.append(n, v);
            }
        }
        if method == "CONNECT" || headers.contains_key(http::header::UPGRADE) {
            return Err("upgrade");
        }
        let framing = request_framing(&headers)?;
        if self.queue.len() >= MAX_IN_FLIGHT {
            return Err("too many requests in flight");
        }
        let method = http::Method::from_bytes(method.as_bytes()).map_err(|_| "method")?;
        let authority = headers
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let is_head = method == http::Method::HEAD;
        let close = wants_close(&headers, req.version);
        let key = key_of_fields(&self.info, method, authority, target.to_string(), &headers);
        let marked = policy::retry_markers(&headers).says_retry();
        let may_answer = marked || self.ctx.tracker.remembers_failures();
        let has_body = framing != Framing::None;
        let now = Instant::now();
        let mut x = InFlight {
            key,
            digest: has_body.then(BodyDigest::default),
            marked,
            counted: false,
            head: is_head,
            local: None,
            status: None,
            claim: Claim::Missing,
            watch: true,
        };
        if !may_answer {
            if !has_body {
                settle(&self.ctx, &self.info, &mut x);
            }
            self.held = None;
            bump(&self.ctx.stats.requests);
            self.to_server.extend_from_slice(&buf.split_to(len));
            self.queue.push_back(x);
            self.req = ReqState::Body(framing);
            return Ok(true);
        }
        // Decided on its key, body digest included: wait for the body's first bytes.
        if has_body {
            let mut f = framing;
            let mut d = BodyDigest::default();
            let mut full = false;
            let step = f
                .walk(buf.get(len..).unwrap_or_default(), |b| full |= !d.feed(b))
                .map_err(|_| "malformed request body")?;
            if !(step.ended || full || force || buf.len() > HOLD_MAX) {
                if self.held.is_none() && self.queue.is_empty() && expects_continue(&headers) {
                    // The client sends its body, which the key needs, only once told to: told
                    // here. (If the request goes on, the callee's own 100 is one more interim
                    // answer, which clients read past.)
                    self.to_client
                        .extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                }
                self.held.get_or_insert_with(tokio::time::Instant::now);
                return Ok(false);
            }
            x.key.body = d.finish();
            x.digest = None;
        }
        self.held = None;
        bump(&self.ctx.stats.requests);
        x.counted = true;
        let v = self.ctx.tracker.on_request(
            &x.key,
            marked,
            self.ctx.view.suppression(&self.info.orig, now),
            now,
        );
        match v {
            Verdict::Forward { retry } => {
                if retry {
                    bump(&self.ctx.stats.retries_forwarded);
                }
                self.to_server.extend_from_slice(&buf.split_to(len));
                self.queue.push_back(x);
                self.req = ReqState::Body(framing);
            }
            Verdict::Answer { reason, reply } => {
                bump(&self.ctx.stats.suppressed);
                tracing::debug!(peer = %self.info.peer, orig = %self.info.orig, reason = reason.as_str(), "retry answered locally");
                buf.advance(len);
                x.local = Some(local_answer(reason, reply, is_head, close));
                x.watch = false;
                self.queue.push_back(x);
                self.req = ReqState::Skip(framing);
                self.flush_local();
            }
        }
        Ok(true)
    }

    /// Local answers at the front of the response order go out.
    fn flush_local(&mut self) {
        while self.end.is_none()
            && let Some(Some(local)) = self.queue.front().map(|x| x.local.clone())
        {
            self.queue.pop_front();
            match local {
                Local::Reply(b, close) => {
                    self.to_client.extend_from_slice(&b);
                    if close {
                        self.end = Some(End::Close);
                    }
                }
                Local::Reset => self.end = Some(End::Reset),
            }
        }
    }
}

/// The key is as complete as it will be: the tracker counts the request, once.
fn settle(ctx: &Ctx, info: &ConnInfo, x: &mut InFlight) {
    if let Some(d) = x.digest.take() {
        x.key.body = d.finish();
    }
    if x.counted {
        return;
    }
    x.counted = true;
    let now = Instant::now();
    let v = ctx
        .tracker
        .on_request(&x.key, x.marked, ctx.view.suppression(&info.orig, now), now);
    if matches!(v, Verdict::Forward { retry: true }) {
        bump(&ctx.stats.retries_forwarded);
    }
}

/// How a request's body is delimited: chunked, by its length, or none.
fn request_framing(h: &HeaderMap) -> Result<Framing, &'static str> {
    if let Some(te) = h.get(http::header::TRANSFER_ENCODING) {
        return if ends_with_chunked(te.as_bytes()) {
            Ok(Framing::Chunked(Chunked::start()))
        } else {
            Err("transfer-encoding without chunked")
        };
    }
    let mut lengths = h.get_all(http::header::CONTENT_LENGTH).iter();
    match lengths.next() {
        None => Ok(Framing::None),
        Some(v) => {
            let n = std::str::from_utf8(v.as_bytes())
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or("content-length")?;
            if lengths.any(|w| w != v) {
                return Err("conflicting content-length");
            }
            Ok(if n == 0 {
                Framing::None
            } else {
                Framing::Length(n)
            })
        }
    }
}

fn ends_with_chunked(v: &[u8]) -> bool {
    v.rsplit(|&b| b == b',')
        .next()
        .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}

fn expects_continue(h: &HeaderMap) -> bool {
    h.get(http::header::EXPECT).is_some_and(|v| {
        v.as_bytes()
            .trim_ascii()
            .eq_ignore_ascii_case(b"100-continue")
    })
}

/// Whether the connection closes after this request's response: `Connection: close`, or
/// HTTP/1.0 without keep-alive.
fn wants_close(h: &HeaderMap, version: Option<u8>) -> bool {
    let has = |token: &str| {
        h.get_all(http::header::CONNECTION).iter().any(|v| {
            v.as_bytes()
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
        })
    };
    has("close") || (version == Some(0) && !has("keep-alive"))
}

/// A suppressed retry's answer: the status the last attempt got, `x-retry-suppressed`, a
/// short body (none for HEAD); or a reset where the last attempt was reset.
fn local_answer(
    reason: SuppressReason,
    reply: Option<FailureReply>,
    head: bool,
    close: bool,
) -> Local {
    let status = match answer::local_answer(reply, false) {
        LocalAnswer::Reset => return Local::Reset,
        LocalAnswer::Http(s) => s,
        LocalAnswer::Grpc(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    let body = answer::HTTP_SUPPRESSED_BODY;
    let mut b = BytesMut::with_capacity(160);
    b.put_slice(b"HTTP/1.1 ");
    b.put_slice(status.as_str().as_bytes());
    b.put_u8(b' ');
    b.put_slice(status.canonical_reason().unwrap_or("").as_bytes());
    b.put_slice(b"\r\ncontent-type: text/plain\r\n");
    b.put_slice(RETRY_SUPPRESSED_HEADER.as_bytes());
    b.put_slice(b": ");
    b.put_slice(reason.as_str().as_bytes());
    if close {
        b.put_slice(b"\r\nconnection: close");
    }
    b.put_slice(format!("\r\ncontent-length: {}\r\n\r\n", body.len()).as_bytes());
    if !head {
        b.put_slice(body.as_bytes());
    }
    Local::Reply(b.freeze(), close)
}
