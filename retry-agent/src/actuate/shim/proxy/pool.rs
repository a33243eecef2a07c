//! Upstream HTTP/2 connections shared, per io thread, by every downstream h2c connection to the
//! same original destination, as HAProxy (`http-reuse`) and Envoy (connection pools) share theirs.
//!
//! One upstream connection per downstream connection cost a second socket per request: with one
//! stream in flight per downstream connection every request was its own upstream read and
//! write. Shared, the streams of many downstream connections travel in one upstream connection
//! and its reads and writes carry several at once.
//!
//! Lifetimes stay what they were without sharing: a destination's upstream connections live
//! while a downstream connection to it does ([`Lease`]), then close once their streams end (hyper
//! closes a connection when its last `SendRequest` is dropped), so no idle connection to a callee
//! outlives its callers. A connection carries at most [`STREAMS_PER_CONN`] of our streams; beyond
//! that another one is opened, so sharing never queues streams behind a callee's
//! `SETTINGS_MAX_CONCURRENT_STREAMS` that separate connections would not have queued.
use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use http::{Request, Response};
use hyper::{body::Incoming, client::conn as cconn};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use super::{Ctx, ProxyError};
use crate::actuate::shim::{answer::ReqBody, net};

/// Streams of ours one upstream connection carries before another is opened: the RFC 9113
/// recommended minimum for `SETTINGS_MAX_CONCURRENT_STREAMS`, which most servers advertise.
pub const STREAMS_PER_CONN: usize = 100;

/// Connection window of an upstream connection: with many downstream streams on it, a few slow
/// readers (each holding at most a stream window, hyper's 2 MiB) must not stall the rest.
const CONN_WINDOW: u32 = 16 << 20;

/// Destinations without a holder are pruned when the table grows past this.
const PRUNE_AT: usize = 1024;

type Sender = cconn::http2::SendRequest<ReqBody>;

struct Pooled {
    sender: Sender,
    /// Our streams open on it (held by [`InFlight`]).
    streams: Arc<AtomicUsize>,
}

#[derive(Default)]
struct Dest {
    /// Downstream connections to this destination now.
    holders: usize,
    conns: Vec<Pooled>,
}

/// One io thread's upstream h2 connections. The thread's tasks are the only users, so the lock
/// is never contended; it is a lock (not a `RefCell`) only so that futures holding a lease stay
/// `Send`.
#[derive(Default)]
pub struct H2Pool {
    dests: Mutex<HashMap<SocketAddr, Dest>>,
}

impl H2Pool {
    fn with<R>(&self, f: impl FnOnce(&mut HashMap<SocketAddr, Dest>) -> R) -> R {
        let mut g = self.dests.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// Whether an open upstream connection to `orig` exists (then a downstream connection need not
    /// dial one before it knows it speaks h2c).
    pub fn has_open(&self, orig: SocketAddr) -> bool {
        self.with(|d| {
            d.get(&orig)
                .is_some_and(|d| d.conns.iter().any(|c| !c.sender.is_closed()))
        })
    }

    /// A downstream connection to `orig` starts: the destination's connections live at least as
    /// long as the lease.
    pub fn lease(self: &Arc<Self>, orig: SocketAddr) -> Lease {
        self.with(|d| {
            if d.len() >= PRUNE_AT {
                d.retain(|_, v| v.holders > 0);
            }
            d.entry(orig).or_default().holders += 1;
        });
        Lease {
            pool: self.clone(),
            orig,
        }
    }

    /// The first open connection to `orig` with room for a stream; closed ones are dropped.
    /// First, not least busy: packed into one connection, concurrent streams share its reads
    /// and writes (spread, each stream would be a write and a read of its own again).
    fn pick(&self, orig: SocketAddr) -> Option<(Sender, Arc<AtomicUsize>)> {
        self.with(|d| {
            let dest = d.get_mut(&orig)?;
            dest.conns.retain(|c| !c.sender.is_closed());
            dest.conns
                .iter()
                .find(|c| c.streams.load(Ordering::Relaxed) < STREAMS_PER_CONN)
                .map(|c| (c.sender.clone(), c.streams.clone()))
        })
    }

    fn add(&self, orig: SocketAddr, sender: Sender) -> Arc<AtomicUsize> {
        let streams = Arc::new(AtomicUsize::new(0));
        self.with(|d| {
            // A lease exists while its connection adds; `or_default` only guards a bug.
            d.entry(orig).or_default().conns.push(Pooled {
                sender,
                streams: streams.clone(),
            })
        });
        streams
    }
}

/// A downstream connection's hold on its destination's upstream connections.
pub struct Lease {
    pool: Arc<H2Pool>,
    orig: SocketAddr,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let orig = self.orig;
        // Dropped outside the lock: closing a connection may run hyper code.
        let gone = self.pool.with(|d| {
            let dest = d.get_mut(&orig)?;
            dest.holders = dest.holders.saturating_sub(1);
            (dest.holders == 0).then(|| d.remove(&orig)).flatten()
        });
        drop(gone);
    }
}

/// One of our streams open on an upstream connection; ends with the response body.
pub struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Handshakes h2 on a connected upstream socket; the connection runs in its own task on this
/// thread (it serves several downstream connections, so none of them can drive it).
pub async fn handshake(s: TcpStream) -> Result<Sender, ProxyError> {
    let (sender, conn) = cconn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .initial_connection_window_size(CONN_WINDOW)
        .handshake(TokioIo::new(s))
        .await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "upstream h2 connection ended");
        }
    });
    Ok(sender)
}

impl Lease {
    /// Whether an open connection to the destination has room for a stream.
    pub fn has_room(&self) -> bool {
        self.pool.pick(self.orig).is_some()
    }

    /// Puts the connection dialled for this downstream connection in the pool, unless one with
    /// room opened meanwhile (downstream connections arriving together each dial one): then it
    /// is closed unused, rather than kept idle beside it.
    pub fn adopt(&self, sender: Sender) {
        if !self.has_room() {
            self.pool.add(self.orig, sender);
        }
    }

    /// Sends `req` on a shared connection, dialling a new one when none has room.
    pub async fn send(
        &self,
        req: Request<ReqBody>,
        ctx: &Ctx,
    ) -> Result<(Response<Incoming>, InFlight), ProxyError> {
        let (mut sender, streams) = match self.pool.pick(self.orig) {
            Some(p) => p,
            None => {
                let s = net::connect_marked(self.orig, ctx.mark, ctx.connect_timeout).await?;
                let sender = handshake(s).await?;
                let streams = self.pool.add(self.orig, sender.clone());
                (sender, streams)
            }
        };
        streams.fetch_add(1, Ordering::Relaxed);
        let inflight = InFlight(streams);
        sender.ready().await?;
        let resp = sender.send_request(req).await?;
        Ok((resp, inflight))
    }
}
