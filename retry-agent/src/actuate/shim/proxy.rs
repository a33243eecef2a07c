//! One redirected connection: detect the protocol, then splice (opaque) or relay HTTP (`h1`,
//! `h2`).
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
    time::Duration,
};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, header};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf},
    net::TcpStream,
};

use super::{
    net,
    policy::{self, CallerId, FailureReply, RequestKey},
};
use crate::{
    actuate::control::ControlView,
    l7::{Claim, trace_of_headers},
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
    pub stats: Stats,
    /// h2c: each client connection relayed over its own upstream connection, or its streams
    /// multiplexed onto the io thread's pooled ones.
    pub h2_upstream: H2Upstream,
    pub h2_pool: H2Pool,
}

/// The pooled h2c connections of `--shim-h2-upstream shared`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct H2Pool {
    /// Client connections one pooled connection carries before the next client gets a new
    /// one. Behind a Service VIP kube-proxy picks a pod per connection: one connection per
    /// destination would send all of a node's calls to one pod per io thread; this keeps them
    /// spread over callers / this many pods. Sixteen: the bench's 32 callers on two io threads
    /// then share one connection per thread, which met HAProxy's p99 in three runs
    /// (0.97–1.08×) where eight (two per thread) gave 1.04–1.18× over four; HAProxy itself
    /// caps nothing.
    pub callers_per_conn: usize,
    /// A pooled connection no caller used for this long is closed (HAProxy's
    /// `pool-purge-delay`): a node's shim does not keep one open to every destination it saw.
    pub idle: Duration,
}

impl Default for H2Pool {
    fn default() -> Self {
        H2Pool {
            callers_per_conn: 16,
            idle: Duration::from_secs(10),
        }
    }
}

/// How h2c reaches the callee (`--shim-h2-upstream`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum H2Upstream {
    /// One upstream connection per client connection, frames relayed as the two ends sent
    /// them (`h2`): the callee sees its callers' connections and settings.
    Own,
    /// HTTP/2 terminated frame by frame on both sides, client streams multiplexed onto the io
    /// thread's pooled connections to the destination, sixteen callers per connection by
    /// default (`h2/pooled`), as HAProxy's `http-reuse always` and Envoy's connection pools
    /// do: the default, since a callee serving a few busy connections instead of one per
    /// caller is where the proxies' h2c latency comes from.
    #[default]
    Shared,
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
    /// Pooled h2c connections dialled (`shared`).
    pub h2_pooled: AtomicU64,
    /// h2c streams refused toward their callers (REFUSED_STREAM: the callee never saw them,
    /// after its GOAWAY or a lost pooled connection; the caller may send them again).
    pub h2_refused: AtomicU64,
}

impl Stats {
    pub fn summary(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "connections={} opaque={} http1={} h2={} requests={} retries_forwarded={} suppressed={} upstream_errors={} not_redirected={} h2_pooled={} h2_refused={}",
            g(&self.connections),
            g(&self.opaque),
            g(&self.http1),
            g(&self.h2),
            g(&self.requests),
            g(&self.retries_forwarded),
            g(&self.suppressed),
            g(&self.upstream_errors),
            g(&self.not_redirected),
            g(&self.h2_pooled),
            g(&self.h2_refused)
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
        Detected::H2 if ctx.h2_upstream == H2Upstream::Shared => {
            bump(&ctx.stats.h2);
            h2::pooled::relay(client, prefix, upstream, conn, ctx.clone()).await
        }
        Detected::H2 => {
            bump(&ctx.stats.h2);
            h2::relay(client, prefix, upstream, conn, ctx.clone()).await
        }
        Detected::Opaque => {
            bump(&ctx.stats.opaque);
            splice(Prefixed::new(prefix, client), upstream)
                .await
                .map_err(ProxyError::Connect)
        }
        Detected::Http1 => {
            bump(&ctx.stats.http1);
            h1::relay(client, prefix, upstream, conn, ctx.clone()).await
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

fn is_grpc(h: &HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
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

/// What a response's end tells the tracker: `None` for a success, else how it failed and its
/// claim. `failed`: the status (or gRPC status) says failure; `reset`: the response was cut.
fn outcome(
    status: Option<http::StatusCode>,
    grpc_status: Option<u32>,
    failed: bool,
    reset: bool,
    claim: Claim,
) -> Option<(FailureReply, Claim)> {
    match status {
        Some(status) if !reset && failed => Some((
            FailureReply::Response {
                status,
                grpc_status,
            },
            claim,
        )),
        Some(_) if !reset => None,
        _ => Some((FailureReply::Reset, claim)),
    }
}

/// The claim to stamp on a failure the callee did not claim itself: the agent's, as it stands
/// now (one published while the request was in flight is the one its caller's retry must see).
fn stamp(ctx: &Ctx, info: &ConnInfo, failed: bool, has_claim: bool) -> Option<Claim> {
    (failed && !has_claim)
        .then(|| ctx.view.claim(&info.orig, std::time::Instant::now()))
        .flatten()
}

mod h1;
mod h2;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
