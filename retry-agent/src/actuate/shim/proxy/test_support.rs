//! What the relays' tests share: a shim context, a relay in front of a callee on loopback, and
//! the agent's word on that callee.
use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use tokio::net::{TcpListener, TcpStream};

use super::{ConnInfo, Ctx, ProxyError, Stats};
use crate::actuate::{
    control::ControlView,
    shim::policy::{self, CallerId},
};

pub fn ctx() -> Arc<Ctx> {
    Arc::new(Ctx {
        view: ControlView::new(),
        tracker: policy::SharedTracker::new(policy::PolicyConfig::default()),
        mark: 0,
        listen_port: 0,
        kernel_steering: None,
        connect_timeout: Duration::from_secs(5),
        detect_timeout: Duration::from_millis(100),
        stats: Stats::default(),
        h2_upstream: Default::default(),
        // Eight callers a connection, whatever the default, as the tests count them; an idle
        // close short enough to be seen within a test.
        h2_pool: super::H2Pool {
            callers_per_conn: 8,
            idle: Duration::from_millis(300),
        },
    })
}

/// A connection from a loopback caller to `orig`.
pub fn conn_to(orig: SocketAddr) -> ConnInfo {
    let peer: SocketAddr = "127.0.0.1:40000".parse().expect("addr");
    ConnInfo {
        peer,
        orig,
        caller: CallerId::Addr(peer.ip()),
    }
}

/// `relay` in front of `orig`: every connection to the returned address is relayed there.
pub async fn relay_to<F, Fut>(orig: SocketAddr, ctx: Arc<Ctx>, relay: F) -> SocketAddr
where
    F: Fn(TcpStream, Bytes, TcpStream, ConnInfo, Arc<Ctx>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), ProxyError>> + Send + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((s, peer)) = l.accept().await {
            let up = TcpStream::connect(orig).await.expect("callee");
            let info = ConnInfo {
                peer,
                orig,
                caller: CallerId::Addr(peer.ip()),
            };
            tokio::spawn(relay(s, Bytes::new(), up, info, ctx.clone()));
        }
    });
    addr
}

/// The agent says: retries to `orig` must stop (its errors are unclaimed symptoms) and the
/// callee's own errors are `claim`.
pub fn suppress(ctx: &Ctx, orig: SocketAddr, claim: &str) {
    let snap = serde_json::json!({
        "v": crate::actuate::wire::VERSION,
        "seq": 1,
        "sent_unix_ms": 0,
        "suppress": [{
            "decision_id": 1, "caller": "a", "callee": "b", "callee_addrs": [orig],
            "reason": "callee_unclaimed", "remaining_ms": 60_000
        }],
        "claims": [{ "service": "b", "addrs": [orig], "claim": claim, "remaining_ms": 60_000 }]
    });
    let snap = serde_json::from_value(snap).expect("snapshot");
    ctx.view.replace(&snap, std::time::Instant::now());
}
