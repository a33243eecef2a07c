//! The io thread's pooled connections, by original destination: which one a caller's streams
//! go on, and a connection leaving the pool when it ends.
use std::{cell::RefCell, collections::HashMap, net::SocketAddr, sync::Arc};

use tokio::net::TcpStream;

use super::{
    super::super::{Ctx, bump, net},
    mux::Mux,
};

thread_local! {
    /// This io thread's connections, by original destination.
    static POOL: RefCell<HashMap<SocketAddr, Vec<Arc<Mux>>>> = RefCell::new(HashMap::new());
}

/// A connection of the io thread's to `orig` for one more client: the pooled one with the
/// fewest, while it has fewer than the pool's callers per connection, else a new one over `dialled` (the
/// client's own, dialled before detection) or dialled now.
pub(super) async fn mux_for(
    orig: SocketAddr,
    ctx: &Ctx,
    dialled: &mut Option<TcpStream>,
) -> std::io::Result<Arc<Mux>> {
    let pooled = || {
        POOL.with(|p| {
            let mut p = p.borrow_mut();
            let conns = p.entry(orig).or_default();
            conns.retain(|m| m.usable());
            let m = conns.iter().min_by_key(|m| m.clients())?;
            (m.clients() < ctx.h2_pool.callers_per_conn).then(|| {
                m.attach();
                m.clone()
            })
        })
    };
    if let Some(m) = pooled() {
        return Ok(m);
    }
    let sock = match dialled.take() {
        Some(s) => s,
        None => net::connect_marked(orig, ctx.mark, ctx.connect_timeout).await?,
    };
    // Another client may have started one while this one dialled.
    if let Some(m) = pooled() {
        return Ok(m);
    }
    let m = Mux::start(orig, sock, ctx.h2_pool.idle);
    bump(&ctx.stats.h2_pooled);
    m.attach();
    POOL.with(|p| p.borrow_mut().entry(orig).or_default().push(m.clone()));
    Ok(m)
}

/// A connection that ended leaves the pool.
pub(super) fn forget(m: &Arc<Mux>) {
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        if let Some(conns) = p.get_mut(&m.orig()) {
            conns.retain(|v| !Arc::ptr_eq(v, m));
            if conns.is_empty() {
                p.remove(&m.orig());
            }
        }
    });
}
