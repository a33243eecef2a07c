//! Socket plumbing for the shim: original destination, marked upstream connects, caller identity.
use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6},
    os::fd::AsRawFd,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use tokio::net::{TcpSocket, TcpStream};

use super::policy::CallerId;

/// `SO_ORIGINAL_DST` (linux/netfilter_ipv4.h) and `IP6T_SO_ORIGINAL_DST`
/// (linux/netfilter_ipv6/ip6_tables.h): both 80, at SOL_IP and SOL_IPV6.
const SO_ORIGINAL_DST: libc::c_int = 80;
const IP6T_SO_ORIGINAL_DST: libc::c_int = 80;

/// The destination the client dialled before REDIRECT rewrote it. `Err(NotFound)` when the
/// connection was not NATed (someone connected to the shim directly).
pub fn original_dst(s: &TcpStream) -> io::Result<SocketAddr> {
    let fd = s.as_raw_fd();
    match s.local_addr()? {
        SocketAddr::V4(_) => {
            // SAFETY: sockaddr_in is plain data; the kernel writes at most `len` bytes into it.
            let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            // SAFETY: valid fd, pointer and length to an owned sockaddr_in.
            let r = unsafe {
                libc::getsockopt(
                    fd,
                    libc::SOL_IP,
                    SO_ORIGINAL_DST,
                    (&raw mut sa).cast(),
                    &mut len,
                )
            };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            let ip = Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
            Ok(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sa.sin_port),
            )))
        }
        SocketAddr::V6(_) => {
            // SAFETY: as above, for sockaddr_in6.
            let mut sa: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            // SAFETY: valid fd, pointer and length to an owned sockaddr_in6.
            let r = unsafe {
                libc::getsockopt(
                    fd,
                    libc::SOL_IPV6,
                    IP6T_SO_ORIGINAL_DST,
                    (&raw mut sa).cast(),
                    &mut len,
                )
            };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            let ip = Ipv6Addr::from(sa.sin6_addr.s6_addr);
            Ok(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sa.sin6_port),
                sa.sin6_flowinfo,
                sa.sin6_scope_id,
            )))
        }
    }
}

/// The original destination: from the kernel steering's map when the shim steers by cgroup
/// programs (the accepted socket's peer is the client's end), else from netfilter.
pub fn original_dst_via(
    s: &TcpStream,
    peer: SocketAddr,
    kernel: Option<&super::cgroup::OrigDsts>,
) -> io::Result<SocketAddr> {
    match kernel {
        Some(k) => k
            .resolve(s.local_addr()?, peer)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound)),
        None => original_dst(s),
    }
}

/// Connects to `dst` with `SO_MARK = mark`, so the steering chain lets the shim's own upstream
/// connection through instead of redirecting it back to the shim.
pub async fn connect_marked(
    dst: SocketAddr,
    mark: u32,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let sock = if dst.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if mark != 0 {
        let v: libc::c_int = mark as libc::c_int;
        // SAFETY: valid fd; value is a c_int of the given size.
        let r = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_MARK,
                (&raw const v).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    sock.set_nodelay(true)?;
    let s = tokio::time::timeout(timeout, sock.connect(dst))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "upstream connect timed out"))??;
    Ok(s)
}

/// Makes the socket close with RST rather than FIN when it is dropped, so the client sees what
/// it would have seen without the shim (a refused or reset connection), not a clean empty close.
pub fn reset_ref(s: &TcpStream) {
    let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
}

/// Caller identity: the source address, or on loopback (where every workload is 127.0.0.1) the
/// uid owning the client's socket, `peer` → `dialled` (the address its connect reached: the
/// original destination under REDIRECT, the shim's own under kernel steering); falls back to the
/// address if that socket is not found.
///
/// The uid comes from an exact sock_diag lookup; only a kernel without sock_diag makes it read
/// /proc/net/tcp{,6} instead (a walk of every socket on the node, on the io thread).
pub fn caller_of(peer: SocketAddr, dialled: SocketAddr) -> CallerId {
    if !peer.ip().to_canonical().is_loopback() {
        return CallerId::Addr(peer.ip().to_canonical());
    }
    match super::sock_diag::uid_of(peer, dialled) {
        Ok(Some(uid)) => CallerId::Uid(uid),
        Ok(None) => CallerId::Addr(peer.ip()),
        Err(e @ super::sock_diag::DiagError::Open(_)) => {
            static WARNED: AtomicBool = AtomicBool::new(false);
            if !WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!(error = %e, "no sock_diag: loopback callers are identified from /proc/net/tcp, slowly");
            }
            caller_from_proc(peer)
        }
        Err(e) => {
            tracing::debug!(%peer, %dialled, error = %e, "sock_diag lookup failed; caller named by address");
            CallerId::Addr(peer.ip())
        }
    }
}

fn caller_from_proc(peer: SocketAddr) -> CallerId {
    let files: &[&str] = if peer.is_ipv4() {
        &["/proc/net/tcp"]
    } else {
        &["/proc/net/tcp6", "/proc/net/tcp"]
    };
    for f in files {
        if let Ok(text) = std::fs::read_to_string(f)
            && let Some(uid) = uid_in_proc_net_tcp(&text, peer)
        {
            return CallerId::Uid(uid);
        }
    }
    CallerId::Addr(peer.ip())
}

/// Finds the uid of the non-listening socket whose local address is `addr` in /proc/net/tcp
/// text. Pure, for tests.
pub fn uid_in_proc_net_tcp(text: &str, addr: SocketAddr) -> Option<u32> {
    for line in text.lines().skip(1) {
        let mut f = line.split_whitespace();
        let (_sl, local, _rem, st) = (f.next()?, f.next()?, f.next()?, f.next()?);
        if st == "0A" {
            continue;
        }
        // Columns after state: tx:rx, tr:when, retrnsmt, uid.
        let uid = f.nth(3);
        if parse_proc_addr(local) == Some(addr_canon(addr))
            && let Some(uid) = uid.and_then(|u| u.parse().ok())
        {
            return Some(uid);
        }
    }
    None
}

fn addr_canon(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// `0100007F:1F90` or the 32-hex-digit IPv6 form; each 32-bit word is in host byte order.
fn parse_proc_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip: IpAddr = match ip.len() {
        8 => Ipv4Addr::from(u32::from_str_radix(ip, 16).ok()?.to_ne_bytes()).into(),
        32 => {
            let mut b = [0u8; 16];
            for (i, chunk) in b.chunks_mut(4).enumerate() {
                let w = u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16).ok()?;
                chunk.copy_from_slice(&w.to_ne_bytes());
            }
            Ipv6Addr::from(b).to_canonical()
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_tcp_lookup() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0\n\
   1: 0100007F:A2C4 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 2 1 0 20 4 30 10 -1\n";
        let a: SocketAddr = "127.0.0.1:41668".parse().expect("addr");
        if cfg!(target_endian = "little") {
            assert_eq!(uid_in_proc_net_tcp(text, a), Some(1000));
            // The listener on 8080 is skipped.
            assert_eq!(
                uid_in_proc_net_tcp(text, "127.0.0.1:8080".parse().expect("addr")),
                None
            );
        }
        assert_eq!(uid_in_proc_net_tcp("garbage\nx y", a), None);
        assert_eq!(parse_proc_addr("zz:1"), None);
    }

    #[test]
    fn own_socket_uid_found_live() {
        // A real loopback connection: its uid must be ours.
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let c = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (me, server) = (c.local_addr().expect("addr"), l.local_addr().expect("addr"));
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        assert_eq!(caller_of(me, server), CallerId::Uid(uid));
        assert_eq!(caller_from_proc(me), CallerId::Uid(uid));
        // Not found (wrong peer): the address, as before.
        assert_eq!(
            caller_of(me, "127.0.0.1:1".parse().expect("addr")),
            CallerId::Addr(me.ip())
        );
        assert_eq!(
            caller_of("10.1.2.3:5".parse().expect("addr"), server),
            CallerId::Addr("10.1.2.3".parse().expect("ip"))
        );
    }
}
