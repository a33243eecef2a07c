//! The transparent retry-suppression shim: iptables steering (`iptables`), SO_ORIGINAL_DST
//! (`net`), a loopback caller's uid by an exact sock_diag lookup (`sock_diag`), or kernel steering by cgroup eBPF programs that die with the shim (`cgroup`), the proxy (`proxy`, hyper; unknown protocols spliced), retry recognition and budgets
//! (`policy`), and the io threads that carry connections. `retry-agent shim` (`cmd::shim`) owns
//! its lifecycle: listeners, control socket, rules, watchdog.
use std::{net::SocketAddr, sync::Arc, time::Duration};

use tokio::net::TcpListener;

pub mod answer;
pub mod cgroup;
pub mod iptables;
pub mod net;
pub mod policy;
pub mod proxy;
pub mod sock_diag;

/// One io thread on `listeners` (bound with [`bind_reuseport`]): its own current-thread runtime,
/// so a connection and its upstream live on one thread (no work-stealing hops), as in HAProxy.
pub fn spawn_io_thread(
    i: usize,
    listeners: Vec<std::net::TcpListener>,
    ctx: Arc<proxy::Ctx>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(format!("shim-io-{i}"))
        .spawn(move || serve_thread(listeners, ctx))?;
    Ok(())
}

/// A listening socket every io thread binds on the same address (SO_REUSEPORT spreads accepts).
pub fn bind_reuseport(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let dom = if addr.is_ipv4() {
        socket2::Domain::IPV4
    } else {
        socket2::Domain::IPV6
    };
    let s = socket2::Socket::new(dom, socket2::Type::STREAM, None)?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    Ok(s.into())
}

/// One io thread: its listeners, its connections, until the process exits.
fn serve_thread(listeners: Vec<std::net::TcpListener>, ctx: Arc<proxy::Ctx>) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "io thread has no runtime; its share of connections will queue");
            return;
        }
    };
    rt.block_on(async move {
        let mut loops = Vec::new();
        for l in listeners {
            match TcpListener::from_std(l) {
                Ok(l) => loops.push(tokio::spawn(accept_loop(l, ctx.clone()))),
                Err(e) => tracing::error!(error = %e, "cannot register a listener"),
            }
        }
        for l in loops {
            let _ = l.await;
        }
    });
}

async fn accept_loop(l: TcpListener, ctx: Arc<proxy::Ctx>) {
    loop {
        match l.accept().await {
            Ok((s, peer)) => {
                tokio::spawn(proxy::handle(s, peer, ctx.clone()));
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
