//! TCP state changes (`sock:inet_sock_set_state`): marks a pending connect() as TCP, remembers
//! server connections until accept() names them, fills in tuples (a client's remote end is
//! connect()'s argument when a cgroup program rewrote it to a loopback proxy, as the shim's
//! `--shim-steer cgroup` does: the callee is the original), and reports established,
//! failed and reset connections (it often fires outside the owner's context: `SOCKS` says whose
//! socket it is).
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};
use retry_common::{
    AF_INET, AF_INET6, ConnKey, IPPROTO_TCP, OWNER_DST_FROM_CONNECT, OWNER_ESTABLISHED,
    OWNER_FAILED, OWNER_IN_CONNECT, PeerKey, ServerEst, SockOwner, SockTuple, conn_kind, role,
    tcp_state,
};

use crate::{
    ctx::sk_err,
    emit::emit_conn,
    errno::{ECONNREFUSED, ECONNRESET},
    maps::{CONNECT_ARGS, CONNS, SERVER_EST, SERVER_EST_SK, SOCKS},
};

/// `sock:inet_sock_set_state` record after the 8-byte common header.
#[repr(C)]
#[derive(Clone, Copy)]
struct InetSockSetState {
    skaddr: u64,
    oldstate: i32,
    newstate: i32,
    sport: u16,
    dport: u16,
    family: u16,
    protocol: u16,
    saddr: [u8; 4],
    daddr: [u8; 4],
    saddr_v6: [u8; 16],
    daddr_v6: [u8; 16],
}

#[inline(always)]
fn tuple_of(a: &InetSockSetState) -> SockTuple {
    let mut t = SockTuple {
        family: a.family,
        lport: a.sport,
        rport: a.dport,
        _pad: 0,
        laddr: [0; 16],
        raddr: [0; 16],
    };
    if a.family == AF_INET6 {
        t.laddr = a.saddr_v6;
        t.raddr = a.daddr_v6;
    } else {
        t.laddr[0] = a.saddr[0];
        t.laddr[1] = a.saddr[1];
        t.laddr[2] = a.saddr[2];
        t.laddr[3] = a.saddr[3];
        t.raddr[0] = a.daddr[0];
        t.raddr[1] = a.daddr[1];
        t.raddr[2] = a.daddr[2];
        t.raddr[3] = a.daddr[3];
    }
    t
}

/// Whether a cgroup program rewrote connect()'s destination `dst` to a loopback proxy (the
/// shim's `--shim-steer cgroup`): then the callee is `dst`, not the socket's remote end.
#[inline(always)]
fn steered_to_loopback(t: &SockTuple, dst: &PeerKey) -> bool {
    if dst.family != t.family || dst.port == 0 || (dst.port == t.rport && dst.addr == t.raddr) {
        return false;
    }
    if t.family == AF_INET {
        return t.raddr[0] == 127;
    }
    let mut i = 0;
    while i < 15 {
        if t.raddr[i] != 0 {
            return false;
        }
        i += 1;
    }
    t.raddr[15] == 1
}

#[inline(always)]
fn try_sock_state(ctx: &TracePointContext) -> Result<(), i32> {
    // SAFETY: reads the tracepoint record; layout from its format file.
    let a: InetSockSetState = unsafe { ctx.read_at(8)? };
    if a.protocol != IPPROTO_TCP {
        return Ok(());
    }
    let old = a.oldstate as u32;
    let new = a.newstate as u32;
    let mut tuple = tuple_of(&a);

    if old == tcp_state::CLOSE && new == tcp_state::SYN_SENT {
        // Runs in the connecting task: marks its pending connect() as TCP.
        let pid_tgid = bpf_get_current_pid_tgid();
        if let Some(c) = CONNECT_ARGS.get_ptr_mut(&pid_tgid) {
            // SAFETY: map value pointer, valid for this program run.
            let (generation, fd, dst) = unsafe {
                (*c).is_tcp = 1;
                (*c).skaddr = a.skaddr;
                ((*c).ts_enter_ns, (*c).fd, (*c).dst)
            };
            let mut flags = OWNER_IN_CONNECT;
            if steered_to_loopback(&tuple, &dst) {
                tuple.rport = dst.port;
                tuple.raddr = dst.addr;
                flags |= OWNER_DST_FROM_CONNECT;
            }
            let owner = SockOwner {
                pid_tgid,
                generation,
                fd,
                role: role::CLIENT,
                flags,
                errno: 0,
                tuple,
            };
            let _ = SOCKS.insert(&a.skaddr, &owner, 0);
        }
        return Ok(());
    }
    if old == tcp_state::SYN_RECV && new == tcp_state::ESTABLISHED {
        // Server side: remember the full tuple until accept() names the peer.
        let peer = PeerKey {
            family: a.family,
            port: a.dport,
            addr: tuple.raddr,
        };
        let est = ServerEst {
            skaddr: a.skaddr,
            tuple,
        };
        let _ = SERVER_EST.insert(&peer, &est, 0);
        let _ = SERVER_EST_SK.insert(&a.skaddr, &est, 0);
        return Ok(());
    }
    let o = match SOCKS.get_ptr_mut(&a.skaddr) {
        Some(o) => o,
        None => return Ok(()),
    };
    // SAFETY: map value pointer, valid for this program run.
    let owner = unsafe {
        if (*o).flags & OWNER_DST_FROM_CONNECT != 0 {
            tuple.rport = (*o).tuple.rport;
            tuple.raddr = (*o).tuple.raddr;
        }
        if tuple.lport != 0 {
            (*o).tuple = tuple;
        }
        *o
    };
    let in_connect = owner.flags & OWNER_IN_CONNECT != 0;
    // The owner's connection event for this transition.
    let emit = |kind: u32, errno: i32| {
        emit_conn(
            kind,
            owner.pid_tgid,
            owner.fd,
            owner.role,
            errno,
            (old, new),
            owner.generation,
            &tuple,
        )
    };
    if old == tcp_state::SYN_SENT && new == tcp_state::ESTABLISHED {
        // SAFETY: map value pointer, valid for this program run.
        unsafe { (*o).flags |= OWNER_ESTABLISHED };
        let key = ConnKey {
            tgid: (owner.pid_tgid >> 32) as u32,
            fd: owner.fd,
        };
        if let Some(info) = CONNS.get_ptr_mut(&key) {
            // SAFETY: map value pointer; generation check so a reused fd is not overwritten.
            unsafe {
                if (*info).generation == owner.generation {
                    (*info).tuple = tuple;
                }
            }
        }
        if !in_connect {
            emit(conn_kind::ESTABLISHED, 0);
        }
        return Ok(());
    }
    if new != tcp_state::CLOSE {
        return Ok(());
    }
    if old == tcp_state::SYN_SENT {
        if in_connect {
            // connect() reports it: as its errno, or (returning EINPROGRESS because the RST was
            // processed at release_sock) as FAILED with this errno. It also removes the entry.
            let mut errno = sk_err(a.skaddr);
            if errno == 0 {
                errno = ECONNREFUSED;
            }
            // SAFETY: map value pointer, valid for this program run.
            unsafe {
                (*o).flags |= OWNER_FAILED;
                (*o).errno = errno;
            }
            return Ok(());
        }
        let errno = sk_err(a.skaddr);
        emit(conn_kind::FAILED, errno);
    } else if old == tcp_state::ESTABLISHED
        || old == tcp_state::CLOSE_WAIT
        || old == tcp_state::SYN_RECV
    {
        // Straight to CLOSE from an open state: RST received or sent (abortive close).
        let mut errno = sk_err(a.skaddr);
        if errno == 0 {
            errno = ECONNRESET as i32;
        }
        // A request held for its answer goes before the reset that ends it.
        crate::summary::release_if_on(&retry_common::ConnKey {
            tgid: (owner.pid_tgid >> 32) as u32,
            fd: owner.fd,
        });
        emit(conn_kind::RESET, errno);
    }
    let _ = SOCKS.remove(&a.skaddr);
    Ok(())
}

#[tracepoint(category = "sock", name = "inet_sock_set_state")]
pub fn ra_sock_state(ctx: TracePointContext) -> u32 {
    let _ = try_sock_state(&ctx);
    0
}
