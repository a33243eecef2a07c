//! Kernel steering (`--shim-steer cgroup`): the `retry-steer` object's programs on the workload's
//! cgroup v2 directories rewrite selected TCP connects to the shim's loopback port and keep the
//! original destination in `STEER_ORIG`, keyed by the client's local address and port (the peer
//! of the socket the shim accepts); the client's getpeername() still says the original, as under
//! REDIRECT. See retry-ebpf `steer/main.rs` for what is and is not steered.
//!
//! Inbound (`--shim-inbound-port`): an `sk_lookup` program on the shim's network namespace hands
//! IPv4 and IPv6 TCP connections from other hosts for those ports to the shim's listener of
//! their family (IPv6 only when the shim listens on `[::]`); the accepted socket's local address
//! is then the original destination. The host's own connections to itself, the shim's upstream
//! among them, are left alone.
//!
//! Fail open by construction: the programs are attached through bpf_links owned by
//! [`SteerLinks`] and never pinned, so the links close with the shim's last file descriptor
//! (clean exit, SIGKILL, `cgroup.kill`, OOM) and the kernel detaches them; nothing needs a
//! survivor to clean up.
use std::{
    fs::File,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::PathBuf,
    sync::Mutex,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, MapError, SockMap},
    programs::{CgroupAttachMode, CgroupSockAddr, ProgramError, SkLookup, SockOps},
};
use retry_common::{
    AF_INET, AF_INET6, names,
    steer::{LISTENER_V4, LISTENER_V6, STEER_ALL_PORTS, SteerAddr, SteerConfig},
};

/// The steering object, embedded at build time (empty when it was not built).
pub static STEER_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/retry-steer.o"));

#[derive(Debug, thiserror::Error)]
pub enum CgroupSteerError {
    #[error(
        "the steering object is empty: build it with `cargo xtask build-ebpf`, then rebuild the agent"
    )]
    EmptyObject,
    #[error("loading the steering object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("cgroup {path}: {source}")]
    Cgroup {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("program {name}: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: MapError,
    },
    #[error("reading our network namespace's cookie (SO_NETNS_COOKIE, Linux 5.14+): {0}")]
    NetnsCookie(#[source] std::io::Error),
    #[error("map {0} is missing from the steering object")]
    MissingMap(&'static str),
}

/// What to steer and where to.
#[derive(Debug, Clone)]
pub struct CgroupSteering {
    /// cgroup v2 directories (filesystem paths) whose processes' connects are steered.
    pub cgroups: Vec<PathBuf>,
    pub shim_port: u16,
    /// SO_MARK of the shim's upstream sockets, never steered.
    pub mark: u32,
    /// Destination ports to steer; empty: every port.
    pub dports: Vec<u16>,
    /// Steer IPv6 connects too (to `[::1]`: only when the shim listens on `[::]`).
    pub ipv6: bool,
    /// Local ports whose connections arriving from other hosts go to the shim (IPv4, and IPv6
    /// when `attach` is given an IPv6 listener).
    pub inbound_ports: Vec<u16>,
}

/// The loaded programs and their links. Dropping it detaches them.
pub struct SteerLinks {
    _ebpf: Ebpf,
}

/// Original destinations of steered connections, taken at accept.
pub struct OrigDsts {
    map: Mutex<HashMap<MapData, SteerAddr, SteerAddr>>,
    shim_port: u16,
}

fn map<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut aya::maps::Map, CgroupSteerError> {
    ebpf.map_mut(name).ok_or(CgroupSteerError::MissingMap(name))
}

impl CgroupSteering {
    /// Loads the programs, writes the settings and attaches to every cgroup (sock_ops before
    /// connect, so a steered connect is always re-keyed). Call only once the shim listens.
    /// `listener`: the shim's IPv4 listener and, when it has one, its IPv6 listener (`[::]`,
    /// v6only), for inbound steering; without the latter, IPv6 arrivals are left alone.
    pub fn attach(
        &self,
        listener: &std::net::TcpListener,
        listener6: Option<&std::net::TcpListener>,
    ) -> Result<(SteerLinks, OrigDsts), CgroupSteerError> {
        if STEER_OBJECT.is_empty() {
            return Err(CgroupSteerError::EmptyObject);
        }
        let cgroup_fds = self
            .cgroups
            .iter()
            .map(|p| {
                File::open(p).map_err(|source| CgroupSteerError::Cgroup {
                    path: p.clone(),
                    source,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let netns_cookie = own_netns_cookie().map_err(CgroupSteerError::NetnsCookie)?;
        let mut ebpf = EbpfLoader::new().load(STEER_OBJECT)?;
        let merr = |name| move |source| CgroupSteerError::Map { name, source };
        {
            let mut cfg: Array<_, SteerConfig> =
                Array::try_from(map(&mut ebpf, names::STEER_CONFIG)?)
                    .map_err(merr(names::STEER_CONFIG))?;
            let c = SteerConfig {
                shim_port: self.shim_port,
                mark: self.mark,
                netns_cookie,
                flags: if self.dports.is_empty() {
                    STEER_ALL_PORTS
                } else {
                    0
                },
                ..SteerConfig::default()
            };
            cfg.set(0, &c, 0).map_err(merr(names::STEER_CONFIG))?;
        }
        {
            let mut ports: HashMap<_, u16, u8> =
                HashMap::try_from(map(&mut ebpf, names::STEER_PORTS)?)
                    .map_err(merr(names::STEER_PORTS))?;
            for p in &self.dports {
                ports.insert(p, &1, 0).map_err(merr(names::STEER_PORTS))?;
            }
        }
        if !self.inbound_ports.is_empty() {
            let mut ports: HashMap<_, u16, u8> =
                HashMap::try_from(map(&mut ebpf, names::STEER_INBOUND_PORTS)?)
                    .map_err(merr(names::STEER_INBOUND_PORTS))?;
            for p in &self.inbound_ports {
                ports
                    .insert(p, &1, 0)
                    .map_err(merr(names::STEER_INBOUND_PORTS))?;
            }
            let mut l: SockMap<_> = SockMap::try_from(map(&mut ebpf, names::STEER_LISTENER)?)
                .map_err(merr(names::STEER_LISTENER))?;
            l.set(LISTENER_V4, listener, 0)
                .map_err(merr(names::STEER_LISTENER))?;
            if let Some(l6) = listener6 {
                l.set(LISTENER_V6, l6, 0)
                    .map_err(merr(names::STEER_LISTENER))?;
            }
        }
        let orig = ebpf
            .take_map(names::STEER_ORIG)
            .ok_or(CgroupSteerError::MissingMap(names::STEER_ORIG))?;
        let orig = HashMap::try_from(orig).map_err(merr(names::STEER_ORIG))?;

        let perr = |name| move |source| CgroupSteerError::Program { name, source };
        // getpeername before connect too: a steered socket always reports its original peer.
        let mut programs: Vec<&'static str> = Vec::new();
        if !self.cgroups.is_empty() {
            programs.extend([
                names::STEER_SOCK_OPS,
                names::STEER_GETPEERNAME4,
                names::STEER_CONNECT4,
            ]);
            if self.ipv6 {
                programs.extend([names::STEER_GETPEERNAME6, names::STEER_CONNECT6]);
            }
        }
        if !self.inbound_ports.is_empty() {
            let name = names::STEER_SK_LOOKUP;
            let netns =
                File::open("/proc/self/ns/net").map_err(|source| CgroupSteerError::Cgroup {
                    path: "/proc/self/ns/net".into(),
                    source,
                })?;
            let p: &mut SkLookup = ebpf
                .program_mut(name)
                .ok_or(CgroupSteerError::Program {
                    name,
                    source: ProgramError::UnexpectedProgramType,
                })?
                .try_into()
                .map_err(perr(name))?;
            p.load().map_err(perr(name))?;
            p.attach(&netns).map_err(perr(name))?;
        }
        for name in programs {
            let prog = ebpf.program_mut(name).ok_or(CgroupSteerError::Program {
                name,
                source: ProgramError::UnexpectedProgramType,
            })?;
            // Links, never pinned (aya uses bpf_link_create on 5.7+): they die with the shim.
            // A cgroup link always coexists with other programs on the cgroup (ALLOW_MULTI).
            if name == names::STEER_SOCK_OPS {
                let p: &mut SockOps = prog.try_into().map_err(perr(name))?;
                p.load().map_err(perr(name))?;
                for fd in &cgroup_fds {
                    p.attach(fd, CgroupAttachMode::Single).map_err(perr(name))?;
                }
            } else {
                let p: &mut CgroupSockAddr = prog.try_into().map_err(perr(name))?;
                p.load().map_err(perr(name))?;
                for fd in &cgroup_fds {
                    p.attach(fd, CgroupAttachMode::Single).map_err(perr(name))?;
                }
            }
        }
        Ok((
            SteerLinks { _ebpf: ebpf },
            OrigDsts {
                map: Mutex::new(orig),
                shim_port: self.shim_port,
            },
        ))
    }
}

/// The cookie of the network namespace we run in (the programs compare the connecting socket's).
fn own_netns_cookie() -> std::io::Result<u64> {
    use std::os::fd::AsRawFd;
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    let mut v: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: valid fd; the kernel writes at most `len` bytes into `v`.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&raw mut v).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(v)
}

/// The map key for the client's end of a connection (as `sock_ops` writes it).
pub fn steer_key(peer: SocketAddr) -> SteerAddr {
    let mut k = SteerAddr {
        port: peer.port(),
        ..SteerAddr::default()
    };
    match peer.ip() {
        IpAddr::V4(ip) => {
            k.family = AF_INET;
            k.addr[..4].copy_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            k.family = AF_INET6;
            k.addr = ip.octets();
        }
    }
    k
}

/// The address a `STEER_ORIG` value names; `None` for an unknown family.
pub fn steer_addr(a: &SteerAddr) -> Option<SocketAddr> {
    let ip: IpAddr = match a.family {
        AF_INET => Ipv4Addr::new(a.addr[0], a.addr[1], a.addr[2], a.addr[3]).into(),
        AF_INET6 => Ipv6Addr::from(a.addr).into(),
        _ => return None,
    };
    Some(SocketAddr::new(ip, a.port))
}

impl OrigDsts {
    /// The original destination of an accepted connection: its local address when it was handed
    /// over by `sk_lookup` (only that delivers another port to our listener), else the entry
    /// the outbound programs left under the client's end.
    pub fn resolve(&self, local: SocketAddr, peer: SocketAddr) -> Option<SocketAddr> {
        if local.port() != self.shim_port {
            return Some(local);
        }
        self.take(peer)
    }

    /// Takes the original destination of the connection whose client end is `peer`.
    pub fn take(&self, peer: SocketAddr) -> Option<SocketAddr> {
        let key = steer_key(peer);
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let v = m.get(&key, 0).ok()?;
        // Consumed: a later connection reusing the port gets its own entry.
        let _ = m.remove(&key);
        steer_addr(&v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_match_the_kernel_layout() {
        for a in ["127.0.0.1:40000", "[::1]:8080", "10.1.2.3:1"] {
            let a: SocketAddr = a.parse().expect("addr");
            assert_eq!(steer_addr(&steer_key(a)), Some(a));
        }
        let k = steer_key("127.0.0.1:258".parse().expect("addr"));
        // Host-order port, address bytes in network order in the first 4 bytes.
        assert_eq!((k.family, k.port), (AF_INET, 258));
        assert_eq!(&k.addr[..5], &[127, 0, 0, 1, 0]);
        assert_eq!(
            steer_addr(&SteerAddr {
                family: 99,
                ..SteerAddr::default()
            }),
            None
        );
    }
}
