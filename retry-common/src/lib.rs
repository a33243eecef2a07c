//! Types shared by kernel (retry-ebpf) and userspace (retry-agent).
//!
//! Everything here is `#[repr(C)]` and `Copy`, with explicit padding so both sides agree on the
//! layout byte for byte; `tests` pins sizes and offsets. Enumerations that cross the boundary are
//! plain `u32` constants, not Rust enums: a kernel record with an unexpected value must decode to
//! an error, never to an invalid enum discriminant.
#![no_std]

/// Upper bound on the payload prefix one event carries. The configured capture size
/// (`CaptureConfig::payload_bytes`) is clamped to this.
pub const MAX_PAYLOAD: usize = 4096;
/// Payload prefix captured when userspace configures nothing. 1 KiB rather than 256 B: HTTP/2
/// header blocks must be captured whole to keep the HPACK table (a 256 B prefix cut grpcio's
/// first HEADERS write and left every later exchange on the connection unknown), and HTTP/1 heads
/// with a few cookies or tracing headers exceed 256 B.
pub const DEFAULT_PAYLOAD: u32 = 1024;

/// Kind tag, first field of every ring-buffer record so userspace can dispatch.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Data = 1,
    Conn = 2,
    ProcessExit = 3,
    /// A process replaced its image (execve): its metadata changed. Same layout as exit.
    ProcessExec = 4,
    /// A quiet HTTP/1 exchange the kernel summarised (`SummaryRecord`).
    Summary = 5,
    /// Quiet exchanges of a connection the kernel counted and did not send
    /// (`SummaryRecord::weight`): a copy of its `HELD` entry of status 0 (the whole struct).
    Tally = 6,
}

/// `EventKind` values as raw integers, for matching on the first `u32` of a record.
pub const KIND_DATA: u32 = EventKind::Data as u32;
pub const KIND_CONN: u32 = EventKind::Conn as u32;
pub const KIND_PROCESS_EXIT: u32 = EventKind::ProcessExit as u32;
pub const KIND_PROCESS_EXEC: u32 = EventKind::ProcessExec as u32;
pub const KIND_SUMMARY: u32 = EventKind::Summary as u32;
pub const KIND_TALLY: u32 = EventKind::Tally as u32;

/// Which syscall moved the bytes (`DataHeader::syscall`).
pub mod syscall {
    pub const READ: u32 = 1;
    pub const WRITE: u32 = 2;
    pub const READV: u32 = 3;
    pub const WRITEV: u32 = 4;
    pub const SENDTO: u32 = 5;
    pub const RECVFROM: u32 = 6;
    pub const SENDMSG: u32 = 7;
    pub const RECVMSG: u32 = 8;
    pub const SENDMMSG: u32 = 9;
    pub const RECVMMSG: u32 = 10;
    /// sendfile(2) out of a file into the socket: the bytes are counted, never captured (they
    /// are a response body nginx-style servers send without copying).
    pub const SENDFILE: u32 = 11;
    /// splice(2) from a pipe into the socket / from the socket into a pipe (proxies, zero-copy
    /// servers): counted, never captured.
    pub const SPLICE_OUT: u32 = 12;
    pub const SPLICE_IN: u32 = 13;
    /// Plaintext given to / returned by OpenSSL's SSL_write / SSL_read (uprobes): the bytes of a
    /// TLS connection as the application sees them. The ciphertext syscalls made inside those
    /// calls are not reported.
    pub const SSL_WRITE: u32 = 14;
    pub const SSL_READ: u32 = 15;

    /// Whether the syscall sends (egress) rather than receives.
    pub const fn is_egress(sc: u32) -> bool {
        matches!(
            sc,
            WRITE | WRITEV | SENDTO | SENDMSG | SENDMMSG | SENDFILE | SPLICE_OUT | SSL_WRITE
        )
    }

    /// Plaintext of a TLS connection (from uprobes on the TLS library).
    pub const fn is_tls_plaintext(sc: u32) -> bool {
        matches!(sc, SSL_WRITE | SSL_READ)
    }

    /// Whether the bytes never pass through user memory (so none can be captured).
    pub const fn is_zero_copy(sc: u32) -> bool {
        matches!(sc, SENDFILE | SPLICE_OUT | SPLICE_IN)
    }
}

/// Side of the connection the process is on (`ConnInfo::role`, records' `role`).
pub mod role {
    pub const UNKNOWN: u32 = 0;
    /// The process called connect().
    pub const CLIENT: u32 = 1;
    /// The process accepted the connection.
    pub const SERVER: u32 = 2;

    /// Whether bytes moving that way on that side are a response: a server's writes, a
    /// client's reads (`Config::response_bytes`). Unknown sides carry none.
    pub const fn carries_response(role: u32, egress: bool) -> bool {
        (role == SERVER && egress) || (role == CLIENT && !egress)
    }
}

/// Direction of bytes relative to the process (`DataHeader::direction`).
pub mod direction {
    pub const EGRESS: u16 = 1;
    pub const INGRESS: u16 = 2;
}

/// `DataHeader::flags`.
pub mod data_flags {
    /// A served request its thread read while it had another request unanswered, or that
    /// waited held while its thread read another (`--capture-summarize`): the kernel sends a
    /// held request late, so userspace cannot tell from the order it sees reads in that its
    /// thread served two at once (an event loop reading ahead).
    pub const INTERLEAVED: u16 = 1;
}

/// `ConnRecord::conn_kind`.
pub mod conn_kind {
    /// connect() returned; `errno` is its -ret (0, EINPROGRESS, ECONNREFUSED, ...).
    pub const CONNECT: u32 = 1;
    /// A connecting socket reached ESTABLISHED (seen in softirq context; pid/tid are the owner's).
    pub const ESTABLISHED: u32 = 2;
    /// A connect that had already returned (non-blocking) failed: SYN_SENT -> CLOSE.
    pub const FAILED: u32 = 3;
    /// accept()/accept4() returned a TCP connection.
    pub const ACCEPT: u32 = 4;
    /// The process closed a tracked fd.
    pub const CLOSE: u32 = 5;
    /// An open connection went to CLOSE without the FIN exchange (RST sent or received), or an
    /// I/O syscall failed with ECONNRESET/EPIPE.
    pub const RESET: u32 = 6;
    /// A Go uprobe bound HTTP/2 stream `ConnRecord::stream_id` of this connection to the
    /// request context `ConnRecord::context` (gRPC-go: a server stream's handler goroutine, a
    /// client stream's caller), which its frames, written by other goroutines, do not carry.
    pub const STREAM: u32 = 7;
}

/// Linux TCP states, as `sock:inet_sock_set_state` reports them.
pub mod tcp_state {
    pub const ESTABLISHED: u32 = 1;
    pub const SYN_SENT: u32 = 2;
    pub const SYN_RECV: u32 = 3;
    pub const FIN_WAIT1: u32 = 4;
    pub const FIN_WAIT2: u32 = 5;
    pub const TIME_WAIT: u32 = 6;
    pub const CLOSE: u32 = 7;
    pub const CLOSE_WAIT: u32 = 8;
    pub const LAST_ACK: u32 = 9;
    pub const LISTEN: u32 = 10;
    pub const CLOSING: u32 = 11;
    pub const NEW_SYN_RECV: u32 = 12;
}

pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;
pub const IPPROTO_TCP: u16 = 6;

/// Local and remote endpoint. Ports in host byte order; addresses in network byte order, IPv4 in
/// the first 4 bytes. `family == 0` means unknown; `lport == 0` means the local side is not yet
/// known (a connect whose port is chosen after SYN_SENT).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockTuple {
    pub family: u16,
    pub lport: u16,
    pub rport: u16,
    pub _pad: u16,
    pub laddr: [u8; 16],
    pub raddr: [u8; 16],
}

/// Header of a data record; `captured` payload bytes follow it directly in the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataHeader {
    /// `KIND_DATA`.
    pub kind: u32,
    /// `syscall::*`.
    pub syscall: u32,
    pub pid: u32,
    pub tid: u32,
    pub fd: u32,
    /// `role::*`.
    pub role: u32,
    /// `direction::*`.
    pub direction: u16,
    /// `data_flags::*`.
    pub flags: u16,
    /// Payload bytes that follow this header (≤ `len`, ≤ the configured size).
    pub captured: u32,
    /// Connection generation: CLOCK_MONOTONIC ns at connect/accept/pick-up, so fd reuse differs.
    pub generation: u64,
    /// When the I/O began as far as the kernel side saw it: an SSL call's entry for TLS
    /// plaintext; a data syscall's return (only exits are probed), so a blocking write's wait
    /// for socket buffer space counts as before it.
    pub ts_enter_ns: u64,
    pub ts_exit_ns: u64,
    /// The syscall's return value (bytes, or messages for sendmmsg/recvmmsg).
    pub ret: i64,
    /// Bytes the syscall moved (for *mmsg: those of the first message).
    pub len: u64,
    pub tuple: SockTuple,
    /// Go programs: the goroutine context of this I/O (the request goroutine it works for, see
    /// retry-ebpf's go.rs), with `GOROUTINE_ROOTED` set when the uprobes traced it to a request
    /// root; 0 elsewhere.
    pub goroutine: u64,
}

/// Set in `DataHeader::goroutine` when the context is a request goroutine the uprobes saw
/// start serving (ServeHTTP) rather than the bare goroutine doing the I/O. Go heap addresses
/// stay far below bit 62.
pub const GOROUTINE_ROOTED: u64 = 1 << 62;

/// Per-CPU scratch in which the kernel assembles a data record (too big for the 512 B stack).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DataRecord {
    pub header: DataHeader,
    pub payload: [u8; MAX_PAYLOAD],
}

/// Largest request prefix the kernel holds back while it waits for the response
/// (`--capture-summarize`); a request that captured more is sent as it is.
pub const HELD_BYTES: usize = 512;

/// What a summary record is before its request's bytes: `kind`, `status` and the two headers.
/// A summary goes to the ring as this many bytes and the request's `captured` bytes after it.
pub const SUMMARY_HEAD: usize = 8 + 2 * size_of::<DataHeader>();

/// One HTTP/1 exchange that went quietly (`--capture-summarize`): the kernel held its request's
/// record back until the response's first bytes showed a 2xx or 3xx status, nothing around it
/// had failed, and sent this instead of the two records. `request` is the held request's
/// header and `bytes` the request as it was held (`captured` of them are valid: its head, and
/// a body that came with it), so a summarised exchange carries what a whole one's request
/// does (trace ids, retry markers, the authority a retry is matched on); `response` is the
/// header the response's first record would have had (`captured` 0); the response's later
/// records are not sent. On the ring the record ends after the request's `captured` bytes
/// (`SUMMARY_HEAD` + captured: a short request makes a short record).
///
/// It is also the value of the kernel's `HELD` map, one per connection that held a request:
/// `kind` is `KIND_SUMMARY` while it holds one (`request` and `bytes` are then the request's
/// record, as it would have gone to the ring) and 0 when it holds none, so a connection's
/// requests reuse its entry instead of adding and removing one each. Userspace reads what a
/// process that exited left there (requests that got no answer) and reports it before the exit.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SummaryRecord {
    /// `KIND_SUMMARY` (`KIND_TALLY` for a tally).
    pub kind: u32,
    /// The response's status code, as its status line says; 0 in a tally (see `weight`).
    pub status: u16,
    /// How many quiet exchanges of its connection the record stands for
    /// (`Config::summary_every`): itself and those the kernel counted without sending since
    /// the connection's last record. A tally (`KIND_TALLY`, `status` 0) stands for `weight`
    /// counted ones only, sent before anything else of the connection goes (a close, a record
    /// sent whole): its `request` and `bytes` are the connection's latest held request's (the
    /// last counted one, or one that follows them), for its identity.
    /// In the kernel's `HELD` entry, between records, the count of those counted so far.
    pub weight: u16,
    pub response: DataHeader,
    pub request: DataHeader,
    pub bytes: [u8; HELD_BYTES],
}

/// A connection lifecycle record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnRecord {
    /// `KIND_CONN`.
    pub kind: u32,
    /// `conn_kind::*`.
    pub conn_kind: u32,
    pub pid: u32,
    pub tid: u32,
    pub fd: u32,
    /// `role::*`.
    pub role: u32,
    /// Positive errno (0 when none).
    pub errno: i32,
    /// TCP states for events derived from `inet_sock_set_state` (0 otherwise).
    pub oldstate: u32,
    pub newstate: u32,
    /// For an accept adopted across fork (retry-ebpf's `syscalls::fork`): the tgid that accepted
    /// it, whose process this one was forked from. 0 otherwise.
    pub parent: u32,
    pub generation: u64,
    pub ts_ns: u64,
    pub tuple: SockTuple,
    /// `conn_kind::STREAM`: the HTTP/2 stream id (0 otherwise).
    pub stream_id: u32,
    pub _pad: u32,
    /// `conn_kind::STREAM`: the goroutine context, as in `DataHeader::goroutine`.
    pub context: u64,
}

/// A whole process (thread group) exited (`KIND_PROCESS_EXIT`), or exec'd (`KIND_PROCESS_EXEC`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessExitRecord {
    /// `KIND_PROCESS_EXIT` or `KIND_PROCESS_EXEC`.
    pub kind: u32,
    pub pid: u32,
    pub ts_ns: u64,
    /// The task's comm (NUL-padded): a process that exits before userspace reads /proc (a
    /// short-lived `curl`) is still named by it.
    pub comm: [u8; 16],
}

/// Key of the tracked-connection map: one fd in one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ConnKey {
    pub tgid: u32,
    pub fd: u32,
}

/// Value of the tracked-connection map. Presence means "this fd is a TCP socket": every other fd
/// is filtered at syscall entry by one lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnInfo {
    pub generation: u64,
    /// Kernel `struct sock *` (0 when unknown, e.g. picked up from /proc): only an identity.
    pub skaddr: u64,
    /// `role::*`.
    pub role: u32,
    /// The fd the connection was opened as. A `dup2` alias keeps it, so records made through
    /// any alias (an inetd-style child reading fd 0 and writing fd 1) name one connection.
    pub fd: u32,
    pub tuple: SockTuple,
    /// `CONN_*` bits, set by the kernel as it learns about the connection.
    pub flags: u32,
    pub _pad: u32,
}

/// The connection carried the HTTP/2 client preface: its records are captured with the larger
/// HTTP/2 prefix, split over several records (`H2_RECORDS`), so the header blocks of a write
/// batching many streams stay whole and the HPACK table known.
pub const CONN_H2: u32 = 1;
/// `--capture-summarize`: the connection's last request record is held in the kernel's `HELD`
/// map, waiting for its response's status.
pub const CONN_HELD: u32 = 2;
/// `--capture-summarize`: the response in progress belongs to a summarised exchange: its
/// further records are not sent (until the next request).
pub const CONN_QUIET: u32 = 4;
/// `--capture-summary-every`: the connection's `HELD` entry counts quiet exchanges not sent
/// yet, which a tally sends before anything else of the connection.
pub const CONN_COUNTED: u32 = 8;
/// `--capture-summarize`: the connection has held a request, so it has a `HELD` entry (kept
/// until its close): its next requests may be read straight into it.
pub const CONN_ENTRY: u32 = 16;
/// Records one syscall of an HTTP/2 connection is split into at most, each carrying up to
/// `MAX_PAYLOAD` bytes: a syscall larger than `H2_RECORDS × MAX_PAYLOAD` still ends in a gap.
pub const H2_RECORDS: u32 = 4;

/// Set while the owning connect() syscall is still running: its return value reports the result,
/// so a SYN_SENT -> CLOSE in that window emits no separate FAILED.
pub const OWNER_IN_CONNECT: u32 = 1;
/// Set once SYN_SENT -> ESTABLISHED fired: a non-blocking connect() that returns EINPROGRESS after
/// the handshake already finished still gets its ESTABLISHED event.
pub const OWNER_ESTABLISHED: u32 = 2;
/// Set when SYN_SENT -> CLOSE fired while connect() was still running but it will return
/// EINPROGRESS (the RST was processed at release_sock): connect()'s exit reports FAILED.
pub const OWNER_FAILED: u32 = 4;
/// The remote end is connect()'s argument, not the socket's: a cgroup program (the shim's
/// `--shim-steer cgroup`) rewrote the destination to a local proxy; the callee is the original.
pub const OWNER_DST_FROM_CONNECT: u32 = 8;

/// Owner of a kernel socket, keyed by `struct sock *`: lets state changes that fire in softirq
/// context (established, reset) be attributed to the process and fd.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockOwner {
    pub pid_tgid: u64,
    pub generation: u64,
    pub fd: u32,
    pub role: u32,
    /// `OWNER_*` bits.
    pub flags: u32,
    /// errno of a failure seen while `OWNER_IN_CONNECT` (with `OWNER_FAILED`).
    pub errno: i32,
    pub tuple: SockTuple,
}

/// Remote endpoint of an accepted connection, to find the tuple the SYN_RECV -> ESTABLISHED
/// transition recorded when accept() returns the peer address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerKey {
    pub family: u16,
    pub port: u16,
    pub addr: [u8; 16],
}

/// A server-side connection that reached ESTABLISHED and waits to be accepted.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerEst {
    pub skaddr: u64,
    pub tuple: SockTuple,
}

/// connect() arguments saved at entry; the TCP state tracepoint in the same task marks it TCP.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectArgs {
    pub ts_enter_ns: u64,
    pub skaddr: u64,
    pub fd: u32,
    /// 1 once CLOSE -> SYN_SENT fired in this task during the call.
    pub is_tcp: u32,
    /// The destination connect() was asked for (family 0 if unreadable): the remote end
    /// recorded when a cgroup program rewrote it to loopback (`OWNER_DST_FROM_CONNECT`).
    pub dst: PeerKey,
    pub _pad: u32,
}

/// accept()/accept4() arguments saved at entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AcceptArgs {
    /// User pointer to the peer sockaddr (0 when the caller passed NULL).
    pub addr: u64,
    pub ts_enter_ns: u64,
    pub fd: u32,
    pub _pad: u32,
}

/// Kernel struct offsets from /sys/kernel/btf/vmlinux (Aya emits no CO-RE relocations): found
/// once by userspace, read by the programs. 0 = unknown, and each walk needs all of its links.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    /// `struct sock.sk_err`: the errno of a non-blocking connect failure or a reset, read when
    /// the socket goes to CLOSE.
    pub sk_err: u32,
    /// From the current task to the `struct sock` behind an fd, for accept() calls that pass no
    /// peer-address buffer (libuv/Node): task_struct.files, files_struct.fdt, fdtable.fd,
    /// file.private_data, socket.sk.
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdt_fd: u32,
    pub file_private_data: u32,
    pub socket_sk: u32,
    /// task → mm → exe_file → f_inode → i_ino, i_sb → s_dev: which file a process runs (all 0:
    /// only userspace recognises the agent's processes).
    pub task_mm: u32,
    pub mm_exe_file: u32,
    pub file_inode: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
    /// task → nsproxy → net_ns → ns.inum: the network namespace a task runs in (its inode, as
    /// `/proc/PID/ns/net` shows it), for `--capture-netns`; `net_ns` is `struct net.ns`, and
    /// `ns_inum` is `struct ns_common.inum` (all 0: netns scoping cannot run).
    pub task_nsproxy: u32,
    pub nsproxy_net_ns: u32,
    pub net_ns: u32,
    pub ns_inum: u32,
}

/// Settings userspace writes into the one-element `CONFIG` array before attaching.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// The agent's own tgid: never traced.
    pub agent_tgid: u32,
    /// Payload prefix size, ≤ `MAX_PAYLOAD`.
    pub payload_bytes: u32,
    /// Wake the ring reader each time another this many bytes wait (0 = on every record).
    /// Waking per record (an IPI each) cost more than the rest of the program; the reader also
    /// polls.
    pub wakeup_bytes: u32,
    /// `config_flags::*`.
    pub flags: u32,
    /// The agent's executable as the kernel names it (inode number, `s_dev` of its filesystem;
    /// 0 = unknown): a process whose `mm->exe_file` is that file is the agent's (a shim, a CLI
    /// call), however it is named, and its sockets stay untracked from connect/accept on.
    pub exe_ino: u64,
    pub exe_dev: u32,
    /// With `config_flags::SCOPE_CGROUP`: the deepest level (below the cgroup v2 root, which is
    /// level 0) of any cgroup in `SCOPE_CGROUPS`, so the ancestor walk stops there.
    pub cgroup_levels: u32,
    pub offsets: KernelOffsets,
    /// Payload prefix of a response's records (a server's writes, a client's reads) on a
    /// connection not marked HTTP/2, ≤ `MAX_PAYLOAD`: past its head a response's bytes only
    /// frame it, and copying them is a large share of what a large response costs the workload.
    pub response_bytes: u32,
    /// With `config_flags::SUMMARIZE`: one request in this many is sent whole even when it
    /// could be summarised (0: none), so figures that need whole heads keep a sample.
    pub summary_sample: u32,
    /// With `config_flags::SUMMARIZE`: how long a destination whose answer was a failure (or a
    /// reset) stays "hot" — its exchanges sent whole, so retries and their outcomes are seen.
    pub summary_hot_ns: u64,
    /// With `config_flags::SUMMARIZE`: a connection's quiet exchanges go as one summary in this
    /// many (≤ `u16::MAX`; 0 or 1: each), the summary weighted with those counted and not sent
    /// before it (`SummaryRecord::weight`), and only within `summary_window_ns` of the
    /// connection's previous record: a slow connection's quiet exchanges each go.
    pub summary_every: u32,
    pub _pad: u32,
    pub summary_window_ns: u64,
}

/// `Config::flags`.
pub mod config_flags {
    /// The TLS uprobes are attached: tracked syscalls must check for an SSL call in progress
    /// (without them that lookup would be paid on every tracked syscall for nothing).
    pub const TLS: u32 = 1;
    /// Only tasks inside a cgroup v2 subtree listed in `SCOPE_CGROUPS` get their sockets
    /// tracked (checked at connect/accept; other sockets stay untracked and cheap).
    pub const SCOPE_CGROUP: u32 = 2;
    /// Only tasks in a network namespace listed in `SCOPE_NETNS` get their sockets tracked.
    /// With both scopes a task must be in both.
    pub const SCOPE_NETNS: u32 = 4;
    /// The Go uprobes are on: data records look up the goroutine a Go process did the I/O for
    /// (without them that lookup would be paid on every record for nothing).
    pub const GO: u32 = 8;
    /// Quiet HTTP/1 exchanges are summarised in the kernel (`SummaryRecord`) instead of being
    /// sent as their request's and response's records.
    pub const SUMMARIZE: u32 = 16;
}

/// Where a gRPC-go program keeps what its stream probes read (value of the Go object's
/// `GO_GRPC` map, per tgid; from the executable's DWARF, filled by userspace). Byte offsets.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GoGrpcOffsets {
    /// `transport.Stream.id` (uint32).
    pub stream_id: u32,
    /// `transport.Stream.ct` (*http2Client).
    pub stream_client: u32,
    /// `transport.http2Server.conn` (net.Conn).
    pub server_conn: u32,
    /// `transport.http2Client.conn` (net.Conn).
    pub client_conn: u32,
    /// Address of the `*net.TCPConn, net.Conn` itab: a conn whose itab differs (TLS, a
    /// wrapper) is not followed to a socket. 0: unknown (stripped binary), not checked.
    pub tcp_conn_itab: u64,
}

/// Deepest cgroup level the kernel walks for `config_flags::SCOPE_CGROUP` (a bounded loop).
pub const MAX_CGROUP_LEVELS: u32 = 16;

/// Kernel steering for the shim (`retry-steer`, a second object): the workload's connects are
/// rewritten to the shim's loopback port by `cgroup/connect4`/`connect6` programs, and the
/// original destination waits in `names::STEER_ORIG` under the client's end of the connection,
/// which the shim sees as its accepted socket's peer.
pub mod steer {
    /// One end of a connection: family, port (host order), address (IPv4 in the first 4 bytes,
    /// network order). Key (client's local end) and value (original destination) of `STEER_ORIG`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct SteerAddr {
        pub family: u16,
        pub port: u16,
        pub addr: [u8; 16],
    }

    /// What the shim writes to `STEER_CONFIG[0]`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct SteerConfig {
        /// The shim's listening port (host order); connects are rewritten to loopback:port.
        pub shim_port: u16,
        pub _pad: u16,
        /// SO_MARK of the shim's own upstream sockets: never steered.
        pub mark: u32,
        /// `STEER_ALL_PORTS`: steer every TCP destination port, not only those in `STEER_PORTS`.
        pub flags: u32,
        pub _pad2: u32,
        /// The shim's network namespace (`SO_NETNS_COOKIE`): a connect made in another one is
        /// left alone, since loopback there does not reach the shim.
        pub netns_cookie: u64,
    }

    pub const STEER_ALL_PORTS: u32 = 1;

    /// Slots of `STEER_LISTENER` (sk_lookup can hand a connection only to a socket of its own
    /// family): the shim's IPv4 listener, and its IPv6 one (`[::]`, v6only).
    pub const LISTENER_V4: u32 = 0;
    pub const LISTENER_V6: u32 = 1;
    pub const LISTENER_SLOTS: u32 = 2;
}

/// Names of the maps and programs, used by both sides.
pub mod names {
    pub const EVENTS: &str = "EVENTS";
    pub const DROPS: &str = "DROPS";
    pub const CONFIG: &str = "CONFIG";
    pub const CONNS: &str = "CONNS";
    /// gRPC-go field offsets per tgid (`GoGrpcOffsets`), for the Go object's stream probes.
    pub const GO_GRPC: &str = "GO_GRPC";
    /// Processes running the agent's own executable (shims, CLI calls), found by userspace by
    /// the file's identity: their sockets are left untracked from connect/accept on.
    pub const AGENT_TGIDS: &str = "AGENT_TGIDS";
    /// Per-CPU counts of failed inserts into the per-thread argument maps, by [`super::arg_map`].
    pub const ARG_FAILURES: &str = "ARG_FAILURES";
    /// The per-thread argument maps, by `arg_map` slot (their size is a capture setting).
    pub const ARG_MAPS: [&str; super::arg_map::COUNT as usize] =
        ["CONNECT_ARGS", "ACCEPT_ARGS", "SSL_ARGS"];
    /// cgroup v2 ids (the directory's inode number) whose subtrees are in scope.
    pub const SCOPE_CGROUPS: &str = "SCOPE_CGROUPS";
    /// Network namespace inodes in scope.
    pub const SCOPE_NETNS: &str = "SCOPE_NETNS";
    /// Requests held for their answer's status (`--capture-summarize`), by connection.
    pub const HELD: &str = "HELD";
    /// The steering object's (`retry-steer`) maps and programs.
    pub const STEER_CONFIG: &str = "STEER_CONFIG";
    pub const STEER_PORTS: &str = "STEER_PORTS";
    pub const STEER_PENDING: &str = "STEER_PENDING";
    pub const STEER_ORIG: &str = "STEER_ORIG";
    pub const STEER_CONNECT4: &str = "ra_steer_connect4";
    pub const STEER_CONNECT6: &str = "ra_steer_connect6";
    pub const STEER_SOCK_OPS: &str = "ra_steer_sock_ops";
    pub const STEER_INBOUND_PORTS: &str = "STEER_INBOUND_PORTS";
    pub const STEER_LISTENER: &str = "STEER_LISTENER";
    pub const STEER_SK_LOOKUP: &str = "ra_steer_sk_lookup";
    pub const STEER_GETPEERNAME4: &str = "ra_steer_getpeername4";
    pub const STEER_GETPEERNAME6: &str = "ra_steer_getpeername6";
}

/// Slots of `ARG_FAILURES`: one per per-thread argument map. A failed insert (the map is full:
/// more threads inside traced syscalls at once than it holds) loses that syscall's record.
pub mod arg_map {
    pub const CONNECT: u32 = 0;
    pub const ACCEPT: u32 = 1;
    pub const SSL: u32 = 2;
    /// Slots in the map.
    pub const COUNT: u32 = 3;
    /// Metric label of each slot, by index.
    pub const LABELS: [&str; COUNT as usize] = ["connect", "accept", "ssl"];
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY (all): repr(C), Copy, only integer fields and byte arrays, explicit padding fields so
    // no byte is uninitialised; the layout tests below pin that.
    unsafe impl aya::Pod for SockTuple {}
    unsafe impl aya::Pod for DataHeader {}
    unsafe impl aya::Pod for SummaryRecord {}
    unsafe impl aya::Pod for ConnRecord {}
    unsafe impl aya::Pod for GoGrpcOffsets {}
    unsafe impl aya::Pod for ProcessExitRecord {}
    unsafe impl aya::Pod for ConnKey {}
    unsafe impl aya::Pod for ConnInfo {}
    unsafe impl aya::Pod for SockOwner {}
    unsafe impl aya::Pod for PeerKey {}
    unsafe impl aya::Pod for ServerEst {}
    unsafe impl aya::Pod for ConnectArgs {}
    unsafe impl aya::Pod for AcceptArgs {}
    unsafe impl aya::Pod for Config {}
    unsafe impl aya::Pod for steer::SteerAddr {}
    unsafe impl aya::Pod for steer::SteerConfig {}
}

#[cfg(test)]
mod tests;
