//! One redirected connection: detect the protocol, then splice (opaque) or proxy HTTP.
//!
//! Detection favours availability: anything that is not clearly HTTP/1.x or the h2c preface
//! within the detection timeout (TLS, server-speaks-first protocols, CONNECT, Upgrade) is spliced
//! byte for byte. The upstream is dialled before detection, so a refused or unreachable callee
//! looks to the caller like a reset connection, as it would without the shim.
use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response, header};
use http_body_util::BodyExt;
use hyper::{body::Incoming, client::conn as cconn, server::conn as sconn, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf},
    net::TcpStream,
};

use self::tee::{Tee, Watch};
use super::{
    answer::{self, Local, ReqBody, RespBody},
    net,
    policy::{self, CallerId, FailureReply, RequestKey, Verdict},
};
use crate::{
    actuate::control::ControlView,
    l7::{Claim, ERROR_CLAIM_HEADER, trace_of_headers},
};

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const METHODS: [&[u8]; 8] = [
    b"GET ",
    b"HEAD ",
    b"POST ",
    b"PUT ",
    b"DELETE ",
    b"OPTIONS ",
    b"PATCH ",
    b"TRACE ",
];

/// Shared by every connection of one shim.
pub struct Ctx {
    pub view: Arc<ControlView>,
    pub tracker: policy::SharedTracker,
    pub mark: u32,
    pub listen_port: u16,
    /// `--shim-steer cgroup`: original destinations come from the kernel steering's map.
    pub kernel_steering: Option<Arc<super::cgroup::OrigDsts>>,
    pub connect_timeout: Duration,
    pub detect_timeout: Duration,
    /// HTTP/1 header names keep their case (`--shim-preserve-header-case`).
    pub preserve_header_case: bool,
    pub stats: Stats,
}

#[derive(Debug, Default)]
pub struct Stats {
    pub connections: AtomicU64,
    pub opaque: AtomicU64,
    pub http1: AtomicU64,
    pub h2: AtomicU64,
    pub requests: AtomicU64,
    pub retries_forwarded: AtomicU64,
    pub suppressed: AtomicU64,
    pub upstream_errors: AtomicU64,
    pub not_redirected: AtomicU64,
}

impl Stats {
    pub fn summary(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "connections={} opaque={} http1={} h2={} requests={} retries_forwarded={} suppressed={} upstream_errors={} not_redirected={}",
            g(&self.connections),
            g(&self.opaque),
            g(&self.http1),
            g(&self.h2),
            g(&self.requests),
            g(&self.retries_forwarded),
            g(&self.suppressed),
            g(&self.upstream_errors),
            g(&self.not_redirected)
        )
    }
}

fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detected {
    Http1,
    H2,
    Opaque,
}

/// Classifies the first bytes; `None` = not enough bytes yet to tell.
pub fn classify(buf: &[u8]) -> Option<Detected> {
    if buf.is_empty() {
        return None;
    }
    if H2_PREFACE.starts_with(buf) {
        return (buf.len() >= H2_PREFACE.len()).then_some(Detected::H2);
    }
    if buf.starts_with(H2_PREFACE) {
        return Some(Detected::H2);
    }
    for m in METHODS {
        if buf.starts_with(m) {
            // Upgrades (WebSocket) switch protocols mid-connection: splice them whole.
            return Some(if has_upgrade(buf) {
                Detected::Opaque
            } else {
                Detected::Http1
            });
        }
        if m.starts_with(buf) {
            return None;
        }
    }
    Some(Detected::Opaque)
}

fn has_upgrade(head: &[u8]) -> bool {
    head.windows(10)
        .any(|w| w.eq_ignore_ascii_case(b"\nupgrade: ") || w.eq_ignore_ascii_case(b"\nupgrade:\t"))
}

/// A stream with bytes already read from it put back in front.
pub struct Prefixed<S> {
    prefix: Bytes,
    inner: S,
}

impl<S> Prefixed<S> {
    pub fn new(prefix: Bytes, inner: S) -> Self {
        Prefixed { prefix, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Reads until the protocol is known, EOF, or the detection timeout (then: opaque).
async fn detect(client: &mut TcpStream, timeout: Duration) -> (Bytes, Detected) {
    let mut buf = BytesMut::with_capacity(4096);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(d) = classify(&buf) {
            return (buf.freeze(), d);
        }
        if buf.len() >= H2_PREFACE.len() {
            return (buf.freeze(), Detected::Opaque);
        }
        match tokio::time::timeout_at(deadline, client.read_buf(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => continue,
            _ => return (buf.freeze(), Detected::Opaque),
        }
    }
}

/// Serves one redirected connection to completion. Never panics; errors end the connection.
pub async fn handle(client: TcpStream, peer: SocketAddr, ctx: Arc<Ctx>) {
    bump(&ctx.stats.connections);
    let orig = match net::original_dst_via(&client, peer, ctx.kernel_steering.as_deref()) {
        Ok(o)
            if !(o.port() == ctx.listen_port
                && client.local_addr().is_ok_and(|l| l.ip() == o.ip())) =>
        {
            o
        }
        _ => {
            // Not redirected: proxying it would loop back to ourselves.
            bump(&ctx.stats.not_redirected);
            tracing::debug!(%peer, "connection was not redirected; closing");
            return;
        }
    };
    let Some(upstream) = dial(&client, peer, orig, &ctx).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let mut client = client;
    let (prefix, kind) = detect(&mut client, ctx.detect_timeout).await;
    // The client's socket reached the original destination under REDIRECT, our own address
    // under kernel steering (which rewrote its connect).
    let dialled = match ctx.kernel_steering {
        Some(_) => client.local_addr().unwrap_or(orig),
        None => orig,
    };
    let conn = ConnInfo {
        peer,
        orig,
        caller: net::caller_of(peer, dialled),
    };
    let r = match kind {
        Detected::H2 => {
            bump(&ctx.stats.h2);
            relay::relay(client, prefix, upstream, conn, ctx.clone()).await
        }
        Detected::Opaque => {
            bump(&ctx.stats.opaque);
            splice(Prefixed::new(prefix, client), upstream)
                .await
                .map_err(ProxyError::Connect)
        }
        Detected::Http1 => {
            bump(&ctx.stats.http1);
            serve_http1(Prefixed::new(prefix, client), upstream, conn, ctx.clone()).await
        }
    };
    if let Err(e) = r {
        tracing::debug!(%peer, %orig, error = %e, "connection ended with an error");
    }
}

/// Connects to the original destination; on failure resets the client (`None`), as the callee
/// would have refused it.
async fn dial(
    client: &TcpStream,
    peer: SocketAddr,
    orig: SocketAddr,
    ctx: &Ctx,
) -> Option<TcpStream> {
    match net::connect_marked(orig, ctx.mark, ctx.connect_timeout).await {
        Ok(u) => Some(u),
        Err(e) => {
            bump(&ctx.stats.upstream_errors);
            tracing::debug!(%peer, %orig, error = %e, "upstream connect failed");
            net::reset_ref(client);
            None
        }
    }
}

async fn splice(mut client: Prefixed<TcpStream>, mut upstream: TcpStream) -> io::Result<()> {
    tokio::io::copy_bidirectional(&mut client, &mut upstream)
        .await
        .map(|_| ())
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("upstream: {0}")]
    Upstream(#[from] hyper::Error),
    #[error("upstream io: {0}")]
    Connect(#[from] io::Error),
    #[error("suppressed retry answered with a reset")]
    SuppressedReset,
    #[error("bad request target: {0}")]
    Uri(#[from] http::Error),
    #[error("h2c relay: {0}")]
    Relay(&'static str),
}

struct ConnInfo {
    peer: SocketAddr,
    orig: SocketAddr,
    caller: CallerId,
}

/// HTTP/1 upstream: one connection per client connection, redialled if the callee closed it
/// between requests (mirrors what the client would see from its own pool).
struct H1Upstream {
    orig: SocketAddr,
    sender: tokio::sync::Mutex<Option<cconn::http1::SendRequest<ReqBody>>>,
}

type H1Conn = cconn::http1::Connection<TokioIo<TcpStream>, ReqBody>;

async fn h1_handshake(
    s: TcpStream,
    preserve_header_case: bool,
) -> Result<(cconn::http1::SendRequest<ReqBody>, H1Conn), ProxyError> {
    Ok(cconn::http1::Builder::new()
        .preserve_header_case(preserve_header_case)
        .handshake(TokioIo::new(s))
        .await?)
}

/// Drives the client-facing and the upstream connection in one task: every wake-up of a proxied
/// request then stays on one thread (spawning the upstream side cost ~2x in throughput).
/// Ends when the client-facing side ends; the upstream side ending first is not an error.
async fn drive<S, C>(server: S, client: C) -> Result<(), ProxyError>
where
    S: std::future::Future<Output = Result<(), hyper::Error>>,
    C: std::future::Future<Output = Result<(), hyper::Error>>,
{
    tokio::pin!(server);
    tokio::pin!(client);
    let mut client_done = false;
    loop {
        tokio::select! {
            biased;
            r = &mut client, if !client_done => {
                client_done = true;
                if let Err(e) = r {
                    tracing::debug!(error = %e, "upstream connection ended");
                }
            }
            r = &mut server => return r.map_err(ProxyError::from),
        }
    }
}

async fn serve_http1(
    io: Prefixed<TcpStream>,
    upstream: TcpStream,
    info: ConnInfo,
    ctx: Arc<Ctx>,
) -> Result<(), ProxyError> {
    let keep_case = ctx.preserve_header_case;
    let (sender, upconn) = h1_handshake(upstream, keep_case).await?;
    let up = Arc::new(H1Upstream {
        orig: info.orig,
        sender: tokio::sync::Mutex::new(Some(sender)),
    });
    let info = Arc::new(info);
    let svc = service_fn(move |req: Request<Incoming>| {
        let (up, info, ctx) = (up.clone(), info.clone(), ctx.clone());
        async move {
            let ctx2 = ctx.clone();
            exchange(req, &info, &ctx, move |req| {
                let (up, ctx) = (up.clone(), ctx2.clone());
                async move {
                    let mut g = up.sender.lock().await;
                    if g.as_ref().is_none_or(|s| s.is_closed()) {
                        let s = net::connect_marked(up.orig, ctx.mark, ctx.connect_timeout).await?;
                        let (sender, conn) = h1_handshake(s, ctx.preserve_header_case).await?;
                        // Rare (the callee closed an idle connection): its own task is fine.
                        tokio::spawn(async move {
                            if let Err(e) = conn.await {
                                tracing::debug!(error = %e, "upstream http1 connection ended");
                            }
                        });
                        *g = Some(sender);
                    }
                    let Some(s) = g.as_mut() else {
                        return Err(ProxyError::SuppressedReset);
                    };
                    s.ready().await?;
                    Ok(s.send_request(req).await?)
                }
            })
            .await
        }
    });
    let server = sconn::http1::Builder::new()
        .timer(TokioTimer::new())
        .preserve_header_case(keep_case)
        // A transparent proxy adds no header the callee did not send.
        .auto_date_header(false)
        .serve_connection(TokioIo::new(io), svc);
    drive(server, upconn).await
}

fn is_grpc(h: &HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The request's key; `body` is its body digest (see [`answer::digest_body`]).
fn key_of_parts<B>(req: &Request<B>, info: &ConnInfo, body: Option<u64>) -> RequestKey {
    let authority = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_string())
        .or_else(|| {
            req.headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_string)
        })
        .unwrap_or_default();
    let target = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    RequestKey {
        body,
        ..key_of_fields(info, req.method().clone(), authority, target, req.headers())
    }
}

/// The request's key from its method, authority, target and headers, without its body.
fn key_of_fields(
    info: &ConnInfo,
    method: http::Method,
    authority: String,
    target: String,
    headers: &HeaderMap,
) -> RequestKey {
    RequestKey {
        caller: info.caller,
        method,
        dst: info.orig,
        authority,
        target,
        trace: trace_of_headers(
            headers
                .iter()
                .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())),
        ),
        body: None,
        credential: policy::credential_digest(headers),
    }
}

/// One request: classify, answer locally or forward, and remember the outcome.
async fn exchange<F, Fut>(
    req: Request<Incoming>,
    info: &ConnInfo,
    ctx: &Arc<Ctx>,
    send: F,
) -> Result<Response<RespBody>, ProxyError>
where
    F: FnOnce(Request<ReqBody>) -> Fut,
    Fut: std::future::Future<Output = Result<Response<Incoming>, ProxyError>>,
{
    bump(&ctx.stats.requests);
    // The body's first bytes are part of "the same request": another message to the same
    // method is not a retry of this one.
    let (parts, body) = req.into_parts();
    let (digest, body) = answer::digest_body(body, answer::BODY_WAIT).await;
    let req = Request::from_parts(parts, ());
    let now = Instant::now();
    let key = key_of_parts(&req, info, digest);
    let req = req.map(|()| body);
    let grpc = is_grpc(req.headers());
    let marked = policy::retry_markers(req.headers()).says_retry();
    let suppressed = ctx.view.suppression(&info.orig, now);
    let verdict = ctx.tracker.on_request(&key, marked, suppressed, now);
    match verdict {
        Verdict::Answer { reason, reply } => {
            bump(&ctx.stats.suppressed);
            // The path only: a query may carry a token.
            let path = req.uri().path();
            tracing::debug!(peer = %info.peer, orig = %info.orig, path, reason = reason.as_str(), "retry answered locally");
            return match answer::local_reply(reason, reply, grpc)? {
                Local::Reply(r) => Ok(r),
                Local::Reset => Err(ProxyError::SuppressedReset),
            };
        }
        Verdict::Forward { retry: true } => bump(&ctx.stats.retries_forwarded),
        Verdict::Forward { retry: false } => {}
    }
    let resp = match send(req).await {
        Ok(r) => r,
        Err(e) => {
            bump(&ctx.stats.upstream_errors);
            ctx.tracker.on_outcome(
                &key,
                Some((FailureReply::Reset, Claim::Missing)),
                Instant::now(),
            );
            return Err(e);
        }
    };
    let (mut parts, body) = resp.into_parts();
    let stamp = ctx.view.claim(&info.orig, now);
    // Tell a gRPC client not to retry only where retries must stop; an over-budget or
    // amplifying edge keeps its budgeted retries (the pushback would make grpcio stop them all).
    let pushback = grpc && suppressed == Some(crate::decide::Reason::CalleeUnclaimed);
    let mut grpc_status = if grpc {
        policy::grpc_status(&parts.headers)
    } else {
        None
    };
    let http_failed = policy::status_is_failure(parts.status);
    // Trailers-only gRPC responses carry the status in the headers.
    if grpc_status.is_some_and(|s| s != 0) || (!grpc && http_failed) {
        annotate_failure(&mut parts.headers, stamp, pushback);
    }
    if grpc_status.is_none() && grpc && parts.headers.contains_key("grpc-status") {
        grpc_status = Some(2); // unparseable status: UNKNOWN, a failure
    }
    let watch = grpc || http_failed;
    if !watch {
        // Success: forget any earlier failure of this request; nothing to watch in the body.
        ctx.tracker.on_outcome(&key, None, now);
    }
    let tee = Tee {
        inner: body,
        watch: watch.then(|| Watch {
            ctx: ctx.clone(),
            key,
            status: parts.status,
            grpc,
            grpc_status,
            claim: policy::claim_of(&parts.headers).unwrap_or(Claim::Missing),
            stamp,
            pushback,
        }),
        done: false,
    };
    Ok(Response::from_parts(parts, tee.boxed_unsync()))
}

/// Stamps the agent's claim (inbound side) and, on a suppressed gRPC edge, the do-not-retry
/// pushback, on a failure's headers or trailers. An existing claim header is left alone.
fn annotate_failure(h: &mut HeaderMap, stamp: Option<Claim>, pushback: bool) {
    if let Some(c) = stamp
        && !h.contains_key(ERROR_CLAIM_HEADER)
    {
        h.insert(ERROR_CLAIM_HEADER, HeaderValue::from_static(c.as_str()));
    }
    if pushback {
        h.insert("grpc-retry-pushback-ms", HeaderValue::from_static("-1"));
    }
}

mod relay;
mod tee;
#[cfg(test)]
mod tests;
