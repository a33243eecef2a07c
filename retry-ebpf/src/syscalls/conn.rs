//! connect, accept/accept4 and close: which fds are tracked TCP connections (`CONNS`), and the
//! connection records that say so. Whether a connect() is TCP is learned from
//! `sock:inet_sock_set_state` firing inside it (`sock`); an accepted socket is found by the fd's
//! `struct sock *` (BTF) or by the peer address.
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};
use retry_common::{
    AF_INET, AF_INET6, AcceptArgs, ConnInfo, ConnKey, ConnectArgs, OWNER_ESTABLISHED, OWNER_FAILED,
    OWNER_IN_CONNECT, PeerKey, ServerEst, SockOwner, SockTuple, arg_map, conn_kind, role,
    tcp_state,
};

use crate::{
    config::{config, in_scope, is_agent},
    ctx::{arg, exit_ret, now, read_user, sock_of_fd},
    emit::emit_conn,
    errno::EINPROGRESS,
    maps::{ACCEPT_ARGS, CONNECT_ARGS, CONNS, SERVER_EST, SERVER_EST_SK, SOCKS, arg_insert_failed},
};

// ---------------------------------------------------------------------------------------------
// connect

#[inline(always)]
fn try_enter_connect(ctx: &TracePointContext) -> Result<(), i32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    if is_agent(pid_tgid) || !in_scope(&config()) {
        return Ok(());
    }
    let fd = arg(ctx, 0)? as u32;
    let dst = connect_dst(arg(ctx, 1)?, arg(ctx, 2)?);
    let args = ConnectArgs {
        ts_enter_ns: now(),
        skaddr: 0,
        fd,
        is_tcp: 0,
        dst,
        _pad: 0,
    };
    CONNECT_ARGS
        .insert(&pid_tgid, &args, 0)
        .map_err(|e| arg_insert_failed(arg_map::CONNECT, e))
}

/// `sockaddr_in`.
#[repr(C)]
#[derive(Clone, Copy)]
struct SockaddrIn {
    family: u16,
    port: u16,
    addr: [u8; 4],
    zero: [u8; 8],
}

/// The address connect() was given (family 0 when absent, short or unreadable).
#[inline(always)]
fn connect_dst(uaddr: u64, len: u64) -> PeerKey {
    let mut dst = PeerKey {
        family: 0,
        port: 0,
        addr: [0; 16],
    };
    if uaddr == 0 || len < 16 {
        return dst;
    }
    let Ok(sa) = read_user::<SockaddrIn>(uaddr) else {
        return dst;
    };
    if sa.family == AF_INET {
        dst.family = AF_INET;
        dst.port = u16::from_be(sa.port);
        dst.addr[0] = sa.addr[0];
        dst.addr[1] = sa.addr[1];
        dst.addr[2] = sa.addr[2];
        dst.addr[3] = sa.addr[3];
    } else if sa.family == AF_INET6
        && len >= 28
        && let Ok(sa6) = read_user::<SockaddrIn6>(uaddr)
    {
        dst.family = AF_INET6;
        dst.port = u16::from_be(sa6.port);
        dst.addr = sa6.addr;
    }
    dst
}

#[inline(always)]
fn try_exit_connect(ctx: &TracePointContext) -> Result<(), i32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let c = match CONNECT_ARGS.get_ptr(&pid_tgid) {
        // SAFETY: copied out before removal.
        Some(p) => unsafe { *p },
        None => return Ok(()),
    };
    let _ = CONNECT_ARGS.remove(&pid_tgid);
    if c.is_tcp == 0 {
        return Ok(());
    }
    let ret = exit_ret(ctx)?;
    let errno = if ret < 0 { -ret } else { 0 };
    let mut tuple = SockTuple::default();
    let mut established = false;
    let mut failed = 0i32;
    if let Some(o) = SOCKS.get_ptr_mut(&c.skaddr) {
        // SAFETY: map value pointer, valid for this program run.
        unsafe {
            tuple = (*o).tuple;
            established = (*o).flags & OWNER_ESTABLISHED != 0;
            if (*o).flags & OWNER_FAILED != 0 {
                failed = (*o).errno;
            }
            (*o).flags &= !OWNER_IN_CONNECT;
        }
    }
    if errno == 0 || errno == EINPROGRESS {
        let key = ConnKey {
            tgid: (pid_tgid >> 32) as u32,
            fd: c.fd,
        };
        let info = ConnInfo {
            generation: c.ts_enter_ns,
            skaddr: c.skaddr,
            role: role::CLIENT,
            fd: c.fd,
            tuple,
            flags: 0,
            _pad: 0,
        };
        let _ = CONNS.insert(&key, &info, 0);
    }
    if failed != 0 || (errno != 0 && errno != EINPROGRESS) {
        // The socket already went to CLOSE (its entry was kept for the tuple above).
        let _ = SOCKS.remove(&c.skaddr);
    }
    emit_conn(
        conn_kind::CONNECT,
        pid_tgid,
        c.fd,
        role::CLIENT,
        errno as i32,
        (0, 0),
        c.ts_enter_ns,
        &tuple,
    );
    if errno == EINPROGRESS && established {
        // The handshake finished inside the call (loopback): report it now, it will not fire again.
        let states = (tcp_state::SYN_SENT, tcp_state::ESTABLISHED);
        emit_conn(
            conn_kind::ESTABLISHED,
            pid_tgid,
            c.fd,
            role::CLIENT,
            0,
            states,
            c.ts_enter_ns,
            &tuple,
        );
    }
    if errno == EINPROGRESS && failed != 0 {
        let states = (tcp_state::SYN_SENT, tcp_state::CLOSE);
        emit_conn(
            conn_kind::FAILED,
            pid_tgid,
            c.fd,
            role::CLIENT,
            failed,
            states,
            c.ts_enter_ns,
            &tuple,
        );
    }
    Ok(())
}

#[tracepoint(category = "syscalls", name = "sys_enter_connect")]
pub fn ra_enter_connect(ctx: TracePointContext) -> u32 {
    let _ = try_enter_connect(&ctx);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_connect")]
pub fn ra_exit_connect(ctx: TracePointContext) -> u32 {
    let _ = try_exit_connect(&ctx);
    0
}

// ---------------------------------------------------------------------------------------------
// accept / accept4

#[inline(always)]
fn try_enter_accept(ctx: &TracePointContext) -> Result<(), i32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    if is_agent(pid_tgid) {
        return Ok(());
    }
    let args = AcceptArgs {
        addr: arg(ctx, 1)?,
        ts_enter_ns: now(),
        fd: arg(ctx, 0)? as u32,
        _pad: 0,
    };
    ACCEPT_ARGS
        .insert(&pid_tgid, &args, 0)
        .map_err(|e| arg_insert_failed(arg_map::ACCEPT, e))
}

#[repr(C)]
#[derive(Clone, Copy)]
struct SockaddrIn6 {
    family: u16,
    port: u16,
    flowinfo: u32,
    addr: [u8; 16],
}

#[inline(always)]
fn try_exit_accept(ctx: &TracePointContext) -> Result<(), i32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let a = match ACCEPT_ARGS.get_ptr(&pid_tgid) {
        // SAFETY: copied out before removal.
        Some(p) => unsafe { *p },
        None => return Ok(()),
    };
    let _ = ACCEPT_ARGS.remove(&pid_tgid);
    let ret = exit_ret(ctx)?;
    if ret < 0 {
        return Ok(());
    }
    let newfd = ret as u32;
    // The socket behind the new fd, when BTF gave the offsets: exact, and works without a peer
    // buffer. Only TCP server sockets that reached ESTABLISHED are in SERVER_EST_SK.
    let sk = sock_of_fd(newfd);
    let mut found: Option<ServerEst> = None;
    if sk != 0
        && let Some(p) = SERVER_EST_SK.get_ptr(&sk)
    {
        // SAFETY: copied out before removal.
        found = Some(unsafe { *p });
        let _ = SERVER_EST_SK.remove(&sk);
    }
    let mut peer = PeerKey {
        family: 0,
        port: 0,
        addr: [0; 16],
    };
    if a.addr != 0 {
        // sockaddr_in is a prefix-compatible subset: family, port, then 4 address bytes at 4.
        let sa: SockaddrIn6 = read_user(a.addr)?;
        peer = PeerKey {
            family: sa.family,
            port: u16::from_be(sa.port),
            addr: [0; 16],
        };
        if sa.family == AF_INET {
            let b = sa.flowinfo.to_ne_bytes();
            peer.addr[0] = b[0];
            peer.addr[1] = b[1];
            peer.addr[2] = b[2];
            peer.addr[3] = b[3];
        } else if sa.family == AF_INET6 {
            peer.addr = sa.addr;
        } else {
            return Ok(());
        }
        if found.is_none()
            && let Some(p) = SERVER_EST.get_ptr(&peer)
        {
            // SAFETY: copied out before removal.
            found = Some(unsafe { *p });
        }
        let _ = SERVER_EST.remove(&peer);
    }
    let (skaddr, tuple) = match found {
        Some(e) => (e.skaddr, e.tuple),
        // A TCP peer address but no ESTABLISHED seen (e.g. it predates the agent): remote only.
        None if peer.family != 0 => (
            0,
            SockTuple {
                family: peer.family,
                lport: 0,
                rport: peer.port,
                _pad: 0,
                laddr: [0; 16],
                raddr: peer.addr,
            },
        ),
        // Neither a peer address nor a known socket: cannot tell TCP from Unix; not tracked.
        None => return Ok(()),
    };
    if found.is_some() {
        // Whichever way it was found, both index entries are consumed now.
        let key = PeerKey {
            family: tuple.family,
            port: tuple.rport,
            addr: tuple.raddr,
        };
        let _ = SERVER_EST.remove(&key);
        let _ = SERVER_EST_SK.remove(&skaddr);
    }
    // Out of scope: checked only now, so the index entries above are consumed either way.
    if !in_scope(&config()) {
        return Ok(());
    }
    let generation = now();
    let key = ConnKey {
        tgid: (pid_tgid >> 32) as u32,
        fd: newfd,
    };
    let info = ConnInfo {
        generation,
        skaddr,
        role: role::SERVER,
        fd: newfd,
        tuple,
        flags: 0,
        _pad: 0,
    };
    let _ = CONNS.insert(&key, &info, 0);
    super::fork::remember_accept(key.tgid, newfd, generation);
    if skaddr != 0 {
        let owner = SockOwner {
            pid_tgid,
            generation,
            fd: newfd,
            role: role::SERVER,
            flags: 0,
            errno: 0,
            tuple,
        };
        let _ = SOCKS.insert(&skaddr, &owner, 0);
    }
    emit_conn(
        conn_kind::ACCEPT,
        pid_tgid,
        newfd,
        role::SERVER,
        0,
        (0, 0),
        generation,
        &tuple,
    );
    Ok(())
}

#[tracepoint(category = "syscalls", name = "sys_enter_accept")]
pub fn ra_enter_accept(ctx: TracePointContext) -> u32 {
    let _ = try_enter_accept(&ctx);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_accept")]
pub fn ra_exit_accept(ctx: TracePointContext) -> u32 {
    let _ = try_exit_accept(&ctx);
    0
}

#[tracepoint(category = "syscalls", name = "sys_enter_accept4")]
pub fn ra_enter_accept4(ctx: TracePointContext) -> u32 {
    let _ = try_enter_accept(&ctx);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_accept4")]
pub fn ra_exit_accept4(ctx: TracePointContext) -> u32 {
    let _ = try_exit_accept(&ctx);
    0
}

// ---------------------------------------------------------------------------------------------
// close

/// Untracks `fd` of the current process, reporting the close if it was a tracked connection.
#[inline(always)]
pub(crate) fn forget_fd(pid_tgid: u64, fd: u32) {
    let key = ConnKey {
        tgid: (pid_tgid >> 32) as u32,
        fd,
    };
    let info = match CONNS.get_ptr(&key) {
        // SAFETY: copied out before removal.
        Some(p) => unsafe { *p },
        None => return,
    };
    let _ = CONNS.remove(&key);
    // An alias going (dup2's copy) ends nothing while the fd the connection was opened as lives.
    if info.fd != fd {
        return;
    }
    // A request that got no answer goes before the close that ends it.
    crate::summary::close(pid_tgid, &key, &info);
    emit_conn(
        conn_kind::CLOSE,
        pid_tgid,
        fd,
        info.role,
        0,
        (0, 0),
        info.generation,
        &info.tuple,
    );
}

#[inline(always)]
fn try_enter_close(ctx: &TracePointContext) -> Result<(), i32> {
    let fd = arg(ctx, 0)? as u32;
    forget_fd(bpf_get_current_pid_tgid(), fd);
    Ok(())
}

#[tracepoint(category = "syscalls", name = "sys_enter_close")]
pub fn ra_enter_close(ctx: TracePointContext) -> u32 {
    let _ = try_enter_close(&ctx);
    0
}
