//! Kernel steering for the shim (`retry-agent shim --shim-steer cgroup`): a second object, so the
//! shim loads only these programs and maps, and the capture's object stays all-tracepoints.
//!
//! - `ra_steer_connect4`/`ra_steer_connect6` (`cgroup/connect4`/`connect6`, on the workload's
//!   cgroups): a selected TCP connect is rewritten to loopback:shim port; its original
//!   destination waits in `STEER_PENDING` under the socket's cookie.
//! - `ra_steer_sock_ops` (`sockops`, same cgroups): at `TCP_CONNECT_CB` (the local port is bound,
//!   the SYN not yet sent, so before the shim can accept) the entry moves to `STEER_ORIG` under
//!   the client's local address and port: the peer address of the shim's accepted socket.
//! - `ra_steer_getpeername4`/`6` (`cgroup/getpeername4`/`6`): the client's getpeername() says
//!   the original destination, as it did under iptables REDIRECT (the cookie entry lives on,
//!   LRU-bounded, for that).
//! - `ra_steer_sk_lookup` (`sk_lookup`, on the shim's network namespace): an IPv4 or IPv6 TCP
//!   connection from another host for an inbound port (`STEER_INBOUND_PORTS`) is handed to the
//!   shim's listener of its family (`STEER_LISTENER`); its accepted socket's local address is
//!   the original destination. Connections from this host to itself (to loopback, or to its own
//!   addresses with source == destination: local clients, and the shim's own upstream connects
//!   to the service) are left alone, as iptables PREROUTING left them.
//!
//! Never steered: connects made in another network namespace than the shim's (loopback there
//! does not reach it), non-TCP sockets, sockets carrying the shim's SO_MARK (its upstream connects),
//! connects to the shim's port itself, IPv4-mapped IPv6 destinations. Userspace attaches all
//! three through bpf_links it holds and never pins: when the shim dies, however it dies, the
//! kernel detaches them and the next connect goes direct.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::BPF_SOCK_OPS_TCP_CONNECT_CB,
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie},
    macros::{cgroup_sock_addr, map, sk_lookup, sock_ops},
    maps::{Array, HashMap, LruHashMap, SockMap},
    programs::{SkLookupContext, SockAddrContext, SockOpsContext},
};
use retry_common::{
    AF_INET, AF_INET6, IPPROTO_TCP,
    steer::{LISTENER_SLOTS, LISTENER_V4, LISTENER_V6, STEER_ALL_PORTS, SteerAddr, SteerConfig},
};

const SOCK_STREAM: u32 = 1;
/// Verdict of a cgroup sock_addr program: let the (possibly rewritten) connect proceed.
const ALLOW: i32 = 1;

#[map]
static STEER_CONFIG: Array<SteerConfig> = Array::with_max_entries(1, 0);
/// Destination ports to steer (host order), unless `STEER_ALL_PORTS`.
#[map]
static STEER_PORTS: HashMap<u16, u8> = HashMap::with_max_entries(64, 0);
/// Socket cookie -> original destination, from connect() on: re-keyed at `TCP_CONNECT_CB`, and
/// read by getpeername() for the socket's life (cookies are never reused; the LRU bounds it).
#[map]
static STEER_PENDING: LruHashMap<u64, SteerAddr> = LruHashMap::with_max_entries(65536, 0);
/// Client's local end -> original destination; the shim takes (removes) the entry at accept.
#[map]
static STEER_ORIG: LruHashMap<SteerAddr, SteerAddr> = LruHashMap::with_max_entries(65536, 0);

/// The steering settings, if this connect is one to steer: TCP, not the shim's own, to a
/// selected port that is not the shim's.
/// Inbound ports (host order) whose non-loopback arrivals go to the shim.
#[map]
static STEER_INBOUND_PORTS: HashMap<u16, u8> = HashMap::with_max_entries(64, 0);
/// The shim's listeners: IPv4 in slot `LISTENER_V4`, IPv6 in `LISTENER_V6` (an IPv6 lookup can
/// only be given an IPv6 socket; an empty slot leaves that family unsteered).
#[map]
static STEER_LISTENER: SockMap = SockMap::with_max_entries(LISTENER_SLOTS, 0);

const LOOPBACK_IFINDEX: u32 = 1;
const SK_PASS: u32 = 1;

#[inline(always)]
fn selected(ctx: &SockAddrContext, dport: u16) -> Option<SteerConfig> {
    let sa = ctx.sock_addr;
    // SAFETY: ctx fields the verifier lets cgroup/connect programs read.
    let (ty, proto, sk) = unsafe { ((*sa).type_, (*sa).protocol, (*sa).__bindgen_anon_1.sk) };
    if ty != SOCK_STREAM || proto != IPPROTO_TCP as u32 {
        return None;
    }
    let cfg = *STEER_CONFIG.get(0)?;
    if cfg.shim_port == 0 || dport == cfg.shim_port {
        return None;
    }
    // SAFETY: the helper takes the program's own context.
    if unsafe { bpf_get_netns_cookie(sa.cast()) } != cfg.netns_cookie {
        return None;
    }
    // SAFETY: ctx->sk is a valid socket pointer for sock_addr programs; `mark` is readable.
    if !sk.is_null() && unsafe { (*sk).mark } == cfg.mark && cfg.mark != 0 {
        return None;
    }
    // SAFETY: plain map lookup.
    if cfg.flags & STEER_ALL_PORTS == 0 && unsafe { STEER_PORTS.get(&dport) }.is_none() {
        return None;
    }
    Some(cfg)
}

#[inline(always)]
fn remember(ctx: &SockAddrContext, orig: &SteerAddr) -> bool {
    // SAFETY: the helper takes the program's own context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) };
    STEER_PENDING.insert(&cookie, orig, 0).is_ok()
}

fn try_connect4(ctx: &SockAddrContext) -> Option<()> {
    let sa = ctx.sock_addr;
    // SAFETY: ctx fields; user_port holds the port in network order in its low 16 bits.
    let (ip, port) = unsafe { ((*sa).user_ip4, (*sa).user_port) };
    let dport = u16::from_be(port as u16);
    let cfg = selected(ctx, dport)?;
    let mut orig = SteerAddr {
        family: AF_INET,
        port: dport,
        addr: [0; 16],
    };
    let b = ip.to_ne_bytes();
    orig.addr[0] = b[0];
    orig.addr[1] = b[1];
    orig.addr[2] = b[2];
    orig.addr[3] = b[3];
    // Unrecorded means unsteerable: the shim could not know where to forward.
    if !remember(ctx, &orig) {
        return None;
    }
    // SAFETY: cgroup/connect4 may rewrite the destination.
    unsafe {
        (*sa).user_ip4 = u32::from_ne_bytes([127, 0, 0, 1]);
        (*sa).user_port = cfg.shim_port.to_be() as u32;
    }
    Some(())
}

fn try_connect6(ctx: &SockAddrContext) -> Option<()> {
    let sa = ctx.sock_addr;
    // SAFETY: ctx fields, read one 32-bit word at a time as the verifier requires.
    let (w0, w1, w2, w3, port) = unsafe {
        (
            (*sa).user_ip6[0],
            (*sa).user_ip6[1],
            (*sa).user_ip6[2],
            (*sa).user_ip6[3],
            (*sa).user_port,
        )
    };
    // IPv4-mapped: the shim's [::1] would be the wrong family for it; left direct.
    if w0 == 0 && w1 == 0 && w2 == 0xffffu32.to_be() {
        return None;
    }
    let dport = u16::from_be(port as u16);
    let cfg = selected(ctx, dport)?;
    let mut orig = SteerAddr {
        family: AF_INET6,
        port: dport,
        addr: [0; 16],
    };
    let words = [w0, w1, w2, w3];
    let mut i = 0;
    while i < 4 {
        let b = words[i].to_ne_bytes();
        orig.addr[i * 4] = b[0];
        orig.addr[i * 4 + 1] = b[1];
        orig.addr[i * 4 + 2] = b[2];
        orig.addr[i * 4 + 3] = b[3];
        i += 1;
    }
    if !remember(ctx, &orig) {
        return None;
    }
    // SAFETY: cgroup/connect6 may rewrite the destination.
    unsafe {
        (*sa).user_ip6[0] = 0;
        (*sa).user_ip6[1] = 0;
        (*sa).user_ip6[2] = 0;
        (*sa).user_ip6[3] = 1u32.to_be();
        (*sa).user_port = cfg.shim_port.to_be() as u32;
    }
    Some(())
}

#[cgroup_sock_addr(connect4)]
pub fn ra_steer_connect4(ctx: SockAddrContext) -> i32 {
    let _ = try_connect4(&ctx);
    ALLOW
}

#[cgroup_sock_addr(connect6)]
pub fn ra_steer_connect6(ctx: SockAddrContext) -> i32 {
    let _ = try_connect6(&ctx);
    ALLOW
}

/// The original destination of a steered socket, for its getpeername().
#[inline(always)]
fn steered_dst(ctx: &SockAddrContext, family: u16) -> Option<SteerAddr> {
    // SAFETY: the helper takes the program's own context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) };
    // SAFETY: plain map lookup; the value is copied out.
    let orig = *unsafe { STEER_PENDING.get(&cookie) }?;
    (orig.family == family).then_some(orig)
}

#[cgroup_sock_addr(getpeername4)]
pub fn ra_steer_getpeername4(ctx: SockAddrContext) -> i32 {
    if let Some(o) = steered_dst(&ctx, AF_INET) {
        let sa = ctx.sock_addr;
        // SAFETY: cgroup/getpeername4 may rewrite the reported address.
        unsafe {
            (*sa).user_ip4 = u32::from_ne_bytes([o.addr[0], o.addr[1], o.addr[2], o.addr[3]]);
            (*sa).user_port = o.port.to_be() as u32;
        }
    }
    ALLOW
}

#[cgroup_sock_addr(getpeername6)]
pub fn ra_steer_getpeername6(ctx: SockAddrContext) -> i32 {
    if let Some(o) = steered_dst(&ctx, AF_INET6) {
        let sa = ctx.sock_addr;
        let w =
            |i: usize| u32::from_ne_bytes([o.addr[i], o.addr[i + 1], o.addr[i + 2], o.addr[i + 3]]);
        // SAFETY: cgroup/getpeername6 may rewrite the reported address.
        unsafe {
            (*sa).user_ip6[0] = w(0);
            (*sa).user_ip6[1] = w(4);
            (*sa).user_ip6[2] = w(8);
            (*sa).user_ip6[3] = w(12);
            (*sa).user_port = o.port.to_be() as u32;
        }
    }
    ALLOW
}

fn try_sock_ops(ctx: &SockOpsContext) -> Option<()> {
    if ctx.op() != BPF_SOCK_OPS_TCP_CONNECT_CB {
        return None;
    }
    // SAFETY: the helper takes the program's own context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.ops.cast()) };
    // SAFETY: plain map lookup; the value is copied out.
    let orig = *unsafe { STEER_PENDING.get(&cookie) }?;
    let mut key = SteerAddr {
        family: 0,
        port: ctx.local_port() as u16,
        addr: [0; 16],
    };
    if ctx.family() == AF_INET as u32 {
        key.family = AF_INET;
        let b = ctx.local_ip4().to_ne_bytes();
        key.addr[0] = b[0];
        key.addr[1] = b[1];
        key.addr[2] = b[2];
        key.addr[3] = b[3];
    } else {
        key.family = AF_INET6;
        let words = ctx.local_ip6();
        let mut i = 0;
        while i < 4 {
            let b = words[i].to_ne_bytes();
            key.addr[i * 4] = b[0];
            key.addr[i * 4 + 1] = b[1];
            key.addr[i * 4 + 2] = b[2];
            key.addr[i * 4 + 3] = b[3];
            i += 1;
        }
    }
    let _ = STEER_ORIG.insert(&key, &orig, 0);
    Some(())
}

fn try_sk_lookup(ctx: &SkLookupContext) -> Option<()> {
    let l = ctx.lookup;
    // SAFETY: ctx fields an sk_lookup program may read; local_port is in host order.
    let (family, proto, port, ifindex) = unsafe {
        (
            (*l).family,
            (*l).protocol,
            (*l).local_port,
            (*l).ingress_ifindex,
        )
    };
    if proto != IPPROTO_TCP as u32 || ifindex == LOOPBACK_IFINDEX {
        return None;
    }
    // A connection from this host to one of its own addresses: the kernel reports the address's
    // device as the ingress (not loopback), but picks the destination as the source. So the
    // shim's own upstream connects (and local clients) are told apart by source == destination.
    let slot = match family {
        f if f == AF_INET as u32 => {
            // SAFETY: ctx fields an sk_lookup program may read.
            if unsafe { (*l).remote_ip4 == (*l).local_ip4 } {
                return None;
            }
            LISTENER_V4
        }
        f if f == AF_INET6 as u32 => {
            // SAFETY: ctx fields, one 32-bit word at a time as the verifier requires.
            let same = unsafe {
                (*l).remote_ip6[0] == (*l).local_ip6[0]
                    && (*l).remote_ip6[1] == (*l).local_ip6[1]
                    && (*l).remote_ip6[2] == (*l).local_ip6[2]
                    && (*l).remote_ip6[3] == (*l).local_ip6[3]
            };
            if same {
                return None;
            }
            LISTENER_V6
        }
        _ => return None,
    };
    // SAFETY: plain map lookup.
    unsafe { STEER_INBOUND_PORTS.get(&(port as u16)) }?;
    STEER_LISTENER.redirect_sk_lookup(ctx, slot, 0).ok()
}

/// Passes in every case: without an assignment the normal lookup (the service) proceeds.
#[sk_lookup]
pub fn ra_steer_sk_lookup(ctx: SkLookupContext) -> u32 {
    let _ = try_sk_lookup(&ctx);
    SK_PASS
}

#[sock_ops]
pub fn ra_steer_sock_ops(ctx: SockOpsContext) -> u32 {
    let _ = try_sock_ops(&ctx);
    1
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
