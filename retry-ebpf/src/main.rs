//! Kernel side of retry-agent: syscall and TCP-state tracepoints that turn socket I/O of TCP
//! connections into ring-buffer records (`retry_common`).
//!
//! Programs are thin: `ra_*` entry points call `try_*` functions and ignore their errors (a failed
//! helper call must never affect the traced process; lost records are counted in `DROPS`).
//!
//! Filtering is the cost lever: every read/write on the node costs one hash lookup in `CONNS`
//! (tracked TCP fds) at entry; only tracked fds save arguments and produce records.
#![no_std]
#![no_main]

use core::{ffi::c_void, mem::size_of};

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_user,
        generated,
    },
    macros::{map, tracepoint, uprobe, uretprobe},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use retry_common::{
    AF_INET, AF_INET6, AcceptArgs, Config, ConnInfo, ConnKey, ConnRecord, ConnectArgs, DataHeader, DataRecord,
    IPPROTO_TCP, IoArgs, KIND_CONN, KIND_DATA, KIND_PROCESS_EXEC, KIND_PROCESS_EXIT, MAX_PAYLOAD, OWNER_ESTABLISHED, OWNER_FAILED, OWNER_IN_CONNECT, PeerKey,
    ProcessExitRecord, ServerEst, SockOwner, SockTuple, config_flags, conn_kind, direction, role, syscall, tcp_state,
};

// Both sides must agree on layouts; retry-common's tests pin them for the host, these for BPF.
const _: () = assert!(size_of::<DataHeader>() == 120);
const _: () = assert!(size_of::<DataRecord>() == 120 + MAX_PAYLOAD);
// Data records are assembled in `Scratch` (per-CPU): 4 KiB of payload does not fit the 512 B stack.
const _: () = assert!(size_of::<Scratch>() == 120 + 2 * MAX_PAYLOAD);
const _: () = assert!(size_of::<ConnRecord>() == 96);
const _: () = assert!(size_of::<ProcessExitRecord>() == 32);
const _: () = assert!(size_of::<ConnKey>() == 8);
const _: () = assert!(size_of::<ConnInfo>() == 64);
const _: () = assert!(size_of::<SockOwner>() == 72);
const _: () = assert!(size_of::<PeerKey>() == 20);
const _: () = assert!(size_of::<ServerEst>() == 48);
const _: () = assert!(size_of::<Config>() == 64);

mod go;

const ECONNRESET: i64 = 104;
const EPIPE: i64 = 32;
const EINPROGRESS: i64 = 115;
const ECONNREFUSED: i32 = 111;

/// Size is overridden by userspace (`CaptureConfig::ring_bytes`).
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 22, 0);
/// Records that did not fit in `EVENTS`.
#[map]
static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
#[map]
static CONFIG: Array<Config> = Array::with_max_entries(1, 0);
/// Tracked TCP fds. LRU so a process that dies without close cannot fill it; userspace also
/// removes a process's entries when it exits.
#[map]
static CONNS: LruHashMap<ConnKey, ConnInfo> = LruHashMap::with_max_entries(65536, 0);
/// `struct sock *` -> owner, for state changes seen outside the owner's context.
#[map]
static SOCKS: LruHashMap<u64, SockOwner> = LruHashMap::with_max_entries(65536, 0);
/// Server connections established but not yet accepted, by peer address.
#[map]
static SERVER_EST: LruHashMap<PeerKey, ServerEst> = LruHashMap::with_max_entries(16384, 0);
/// The same, by `struct sock *`, for accept() without a peer buffer (found by walking the fd).
#[map]
static SERVER_EST_SK: LruHashMap<u64, ServerEst> = LruHashMap::with_max_entries(16384, 0);
/// Syscall arguments by thread, between entry and exit. Plain (preallocated) hashes: an LRU
/// insert on every traced syscall cost more; a thread that dies inside a syscall has its entry
/// removed by `ra_process_exit`, which fires for every thread.
#[map]
static IO_ARGS: HashMap<u64, IoArgs> = HashMap::with_max_entries(16384, 0);
#[map]
static CONNECT_ARGS: HashMap<u64, ConnectArgs> = HashMap::with_max_entries(8192, 0);
#[map]
static ACCEPT_ARGS: HashMap<u64, AcceptArgs> = HashMap::with_max_entries(8192, 0);

/// Syscall tracepoint layout: 8 bytes of common header and syscall nr, then 8-byte arguments.
#[inline(always)]
fn arg(ctx: &TracePointContext, n: usize) -> Result<u64, i32> {
    // SAFETY: reads the tracepoint record through bpf_probe_read_kernel; offsets from the format files.
    unsafe { ctx.read_at::<u64>(16 + 8 * n) }
}

#[inline(always)]
fn exit_ret(ctx: &TracePointContext) -> Result<i64, i32> {
    // SAFETY: as `arg`; sys_exit_* has `long ret` at 16.
    unsafe { ctx.read_at::<i64>(16) }
}

#[inline(always)]
fn now() -> u64 {
    // SAFETY: no preconditions.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
fn config() -> Config {
    CONFIG.get(0).copied().unwrap_or_default()
}

/// Ring-buffer flags for one record: no wakeup until `wakeup_bytes` wait (the reader polls
/// meanwhile), then force one.
#[inline(always)]
fn ring_flags() -> u64 {
    let threshold = config().wakeup_bytes as u64;
    if threshold == 0 {
        return 0;
    }
    if EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= threshold {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

#[inline(always)]
fn count_drop() {
    if let Some(p) = DROPS.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, only this CPU writes it while this program runs.
        unsafe { *p += 1 };
    }
}

/// The agent itself, or a process of its binary (a shim, a CLI call): a proxy hop is not a
/// service, and observing it would put a fake one between every caller and callee it steers.
#[inline(always)]
fn is_agent(pid_tgid: u64) -> bool {
    let c = config();
    if c.agent_tgid != 0 && (pid_tgid >> 32) as u32 == c.agent_tgid {
        return true;
    }
    if c.ignore_comm[0] == 0 || c.task_group_leader == 0 || c.task_comm == 0 {
        return false;
    }
    // The main thread's name: worker threads carry their own (tokio-runtime-w).
    // SAFETY: kernel reads through the checked helper; offsets from BTF.
    let leader: u64 = match unsafe { bpf_probe_read_kernel((bpf_get_current_task() + c.task_group_leader as u64) as *const u64) } {
        Ok(l) => l,
        Err(_) => return false,
    };
    // SAFETY: as above.
    let comm: [u8; 16] = match unsafe { bpf_probe_read_kernel((leader + c.task_comm as u64) as *const [u8; 16]) } {
        Ok(x) => x,
        Err(_) => return false,
    };
    let mut i = 0;
    while i < 16 {
        if comm[i] != c.ignore_comm[i] {
            return false;
        }
        if comm[i] == 0 {
            return true;
        }
        i += 1;
    }
    true
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn emit_conn(
    kind: u32,
    pid_tgid: u64,
    fd: u32,
    role: u32,
    errno: i32,
    states: (u32, u32),
    generation: u64,
    tuple: &SockTuple,
) {
    let rec = ConnRecord {
        kind: KIND_CONN,
        conn_kind: kind,
        pid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        fd,
        role,
        errno,
        oldstate: states.0,
        newstate: states.1,
        _pad: 0,
        generation,
        ts_ns: now(),
        tuple: *tuple,
    };
    if EVENTS.output(&rec, ring_flags()).is_err() {
        count_drop();
    }
}

// ---------------------------------------------------------------------------------------------
// Data syscalls

#[inline(always)]
fn try_enter_io(ctx: &TracePointContext, sc: u32) -> Result<(), i32> {
    let fd = arg(ctx, 0)? as u32;
    let pid_tgid = bpf_get_current_pid_tgid();
    let key = ConnKey { tgid: (pid_tgid >> 32) as u32, fd };
    if CONNS.get_ptr(&key).is_none() {
        return Ok(());
    }
    let tls = config().flags & config_flags::TLS != 0;
    if let Some(p) = if tls { SSL_ARGS.get_ptr_mut(&pid_tgid) } else { None } {
        // SAFETY: this thread's own entry; only this thread writes it.
        let (ssl, since) = unsafe { ((*p).ssl, (*p).ts_enter_ns) };
        if now().saturating_sub(since) < SSL_CALL_STALE_NS {
            // Inside SSL_read/SSL_write/a handshake: ciphertext. Not reported (the uretprobe
            // reports the plaintext); it tells which fd this SSL object talks over.
            // SAFETY: as above.
            unsafe { (*p).fd = fd };
            let _ = SSL_FDS.insert(&SslKey { tgid: key.tgid, _pad: 0, ssl }, &fd, 0);
            return Ok(());
        }
        // A call whose return never came (its thread was torn down mid-call and the tid
        // reused): forget it rather than hide this thread's plaintext I/O.
        let _ = SSL_ARGS.remove(&pid_tgid);
    }
    let args = IoArgs { buf: arg(ctx, 1)?, ts_enter_ns: now(), fd, syscall: sc };
    IO_ARGS.insert(&pid_tgid, &args, 0).map_err(|e| e as i32)
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Iovec {
    base: u64,
    len: u64,
}

#[inline(always)]
pub(crate) fn read_user<T>(addr: u64) -> Result<T, i32> {
    // SAFETY: bpf_probe_read_user validates the user address; failure is an error, not a fault.
    unsafe { bpf_probe_read_user(addr as *const T) }.map_err(|e| e as i32)
}

/// Where the bytes are: one buffer, an iovec array, or nowhere a program can read (zero-copy).
#[derive(Clone, Copy)]
enum Src {
    Flat(u64),
    Iov(u64),
    None,
}

/// iovecs copied at most per syscall. Most writers need one or two, but gRPC C-core (grpcio)
/// writes a frame as many small slices: with 8, an HTTP/2 header block was cut after ~84 bytes
/// and every grpcio exchange lost its HPACK state.
const MAX_IOV: u64 = 32;

/// Where the bytes are and how many the syscall moved in total.
#[inline(always)]
fn payload_source(a: &IoArgs, ret: i64) -> Result<(Src, u64), i32> {
    let total = ret as u64;
    match a.syscall {
        syscall::READV | syscall::WRITEV => Ok((Src::Iov(a.buf), total)),
        // struct user_msghdr: msg_iov at 16.
        syscall::SENDMSG | syscall::RECVMSG => Ok((Src::Iov(read_user(a.buf + 16)?), total)),
        syscall::SENDMMSG | syscall::RECVMMSG => {
            // struct mmsghdr: msg_hdr (56 bytes) then msg_len; only the first message is reported.
            let msg_len: u32 = read_user(a.buf + 56)?;
            Ok((Src::Iov(read_user(a.buf + 16)?), msg_len as u64))
        }
        syscall::SENDFILE | syscall::SPLICE_OUT | syscall::SPLICE_IN => Ok((Src::None, total)),
        _ => Ok((Src::Flat(a.buf), total)),
    }
}

/// Kernel-only scratch: twice the payload so that "offset < MAX_PAYLOAD, length ≤ MAX_PAYLOAD"
/// (what the verifier can prove for each iovec copy) always stays inside the value.
#[repr(C)]
struct Scratch {
    header: DataHeader,
    payload: [u8; 2 * MAX_PAYLOAD],
}

#[map]
static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// Copies up to `want` (≤ MAX_PAYLOAD) bytes from user memory into `dst`; returns how many.
///
/// # Safety
/// `dst` must point at a buffer of at least 2 × MAX_PAYLOAD bytes.
#[inline(always)]
unsafe fn copy_payload(dst: *mut u8, src: Src, want: u64) -> u32 {
    let read = |off: u64, n: u64, from: u64| -> bool {
        // Masks restate bounds the verifier cannot infer: off < MAX_PAYLOAD, n ≤ MAX_PAYLOAD.
        let off = off & (MAX_PAYLOAD as u64 - 1);
        let n = if n > MAX_PAYLOAD as u64 { MAX_PAYLOAD as u64 } else { n };
        // SAFETY: dst + off + n ≤ dst + 2 × MAX_PAYLOAD (caller's contract); user memory is read
        // through the checked helper.
        unsafe { generated::bpf_probe_read_user(dst.add(off as usize) as *mut c_void, n as u32, from as *const c_void) == 0 }
    };
    match src {
        Src::None => 0,
        Src::Flat(p) => {
            if want > 0 && read(0, want, p) { want as u32 } else { 0 }
        }
        Src::Iov(iovp) => {
            let mut got: u64 = 0;
            for i in 0..MAX_IOV {
                if got >= want {
                    break;
                }
                let Ok(iov) = read_user::<Iovec>(iovp + 16 * i) else { break };
                let mut n = want - got;
                if iov.len < n {
                    n = iov.len;
                }
                if n > 0 && !read(got, n, iov.base) {
                    break;
                }
                got += n;
            }
            got as u32
        }
    }
}

#[inline(always)]
fn try_exit_io(ctx: &TracePointContext) -> Result<(), i32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let a = match IO_ARGS.get_ptr(&pid_tgid) {
        // SAFETY: the value is copied out before the entry is removed.
        Some(p) => unsafe { *p },
        None => return Ok(()),
    };
    let _ = IO_ARGS.remove(&pid_tgid);
    let ret = exit_ret(ctx)?;
    let key = ConnKey { tgid: (pid_tgid >> 32) as u32, fd: a.fd };
    let info = match CONNS.get_ptr(&key) {
        // SAFETY: copied out; a concurrent close only makes this record slightly stale.
        Some(p) => unsafe { *p },
        None => return Ok(()),
    };
    if ret <= 0 {
        if ret == -ECONNRESET || ret == -EPIPE {
            let states = (0, 0);
            emit_conn(conn_kind::RESET, pid_tgid, a.fd, info.role, (-ret) as i32, states, info.generation, &info.tuple);
        }
        return Ok(());
    }
    let (src, total) = payload_source(&a, ret)?;
    emit_data(pid_tgid, a.fd, &info, a.syscall, src, (ret, total), a.ts_enter_ns);
    Ok(())
}

/// One data record: the header and up to the configured prefix of the bytes at `src`.
#[inline(always)]
fn emit_data(pid_tgid: u64, fd: u32, info: &ConnInfo, sc: u32, src: Src, (ret, total): (i64, u64), ts_enter_ns: u64) {
    let rec = match SCRATCH.get_ptr_mut(0) {
        Some(r) => r,
        None => return,
    };
    let cap = config().payload_bytes as u64;
    let mut want = total;
    if cap < want {
        want = cap;
    }
    if want > MAX_PAYLOAD as u64 {
        want = MAX_PAYLOAD as u64;
    }
    // SAFETY: `rec` points at this CPU's scratch value, whose payload is 2 × MAX_PAYLOAD.
    unsafe {
        let mut n = copy_payload((*rec).payload.as_mut_ptr(), src, want);
        if n > MAX_PAYLOAD as u32 {
            n = MAX_PAYLOAD as u32;
        }
        (*rec).header = DataHeader {
            kind: KIND_DATA,
            syscall: sc,
            pid: (pid_tgid >> 32) as u32,
            tid: pid_tgid as u32,
            fd,
            role: info.role,
            direction: if syscall::is_egress(sc) { direction::EGRESS } else { direction::INGRESS },
            captured: n,
            generation: info.generation,
            ts_enter_ns,
            ts_exit_ns: now(),
            ret,
            len: total,
            tuple: info.tuple,
            goroutine: go::context(pid_tgid),
        };
        let size = size_of::<DataHeader>() + n as usize;
        let bytes = core::slice::from_raw_parts(rec as *const u8, size);
        if EVENTS.output(bytes, ring_flags()).is_err() {
            count_drop();
        }
    }
}

macro_rules! io_programs {
    ($($enter:ident, $exit:ident, $tp_enter:literal, $tp_exit:literal, $sc:expr;)*) => {$(
        #[tracepoint(category = "syscalls", name = $tp_enter)]
        pub fn $enter(ctx: TracePointContext) -> u32 {
            let _ = try_enter_io(&ctx, $sc);
            0
        }
        #[tracepoint(category = "syscalls", name = $tp_exit)]
        pub fn $exit(ctx: TracePointContext) -> u32 {
            let _ = try_exit_io(&ctx);
            0
        }
    )*};
}

io_programs! {
    ra_enter_sendfile, ra_exit_sendfile, "sys_enter_sendfile64", "sys_exit_sendfile64", syscall::SENDFILE;
    ra_enter_read, ra_exit_read, "sys_enter_read", "sys_exit_read", syscall::READ;
    ra_enter_write, ra_exit_write, "sys_enter_write", "sys_exit_write", syscall::WRITE;
    ra_enter_readv, ra_exit_readv, "sys_enter_readv", "sys_exit_readv", syscall::READV;
    ra_enter_writev, ra_exit_writev, "sys_enter_writev", "sys_exit_writev", syscall::WRITEV;
    ra_enter_sendto, ra_exit_sendto, "sys_enter_sendto", "sys_exit_sendto", syscall::SENDTO;
    ra_enter_recvfrom, ra_exit_recvfrom, "sys_enter_recvfrom", "sys_exit_recvfrom", syscall::RECVFROM;
    ra_enter_sendmsg, ra_exit_sendmsg, "sys_enter_sendmsg", "sys_exit_sendmsg", syscall::SENDMSG;
    ra_enter_recvmsg, ra_exit_recvmsg, "sys_enter_recvmsg", "sys_exit_recvmsg", syscall::RECVMSG;
    ra_enter_sendmmsg, ra_exit_sendmmsg, "sys_enter_sendmmsg", "sys_exit_sendmmsg", syscall::SENDMMSG;
    ra_enter_recvmmsg, ra_exit_recvmmsg, "sys_enter_recvmmsg", "sys_exit_recvmmsg", syscall::RECVMMSG;
}

/// splice(fd_in, off_in, fd_out, off_out, len, flags): whichever end is a tracked socket (a
/// socket-to-socket splice goes through a pipe, so one end is a pipe).
#[inline(always)]
fn try_enter_splice(ctx: &TracePointContext) -> Result<(), i32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let fd_out = arg(ctx, 2)? as u32;
    let fd_in = arg(ctx, 0)? as u32;
    let (fd, sc) = if CONNS.get_ptr(&ConnKey { tgid, fd: fd_out }).is_some() {
        (fd_out, syscall::SPLICE_OUT)
    } else if CONNS.get_ptr(&ConnKey { tgid, fd: fd_in }).is_some() {
        (fd_in, syscall::SPLICE_IN)
    } else {
        return Ok(());
    };
    let args = IoArgs { buf: 0, ts_enter_ns: now(), fd, syscall: sc };
    IO_ARGS.insert(&pid_tgid, &args, 0).map_err(|e| e as i32)
}

#[tracepoint(category = "syscalls", name = "sys_enter_splice")]
pub fn ra_enter_splice(ctx: TracePointContext) -> u32 {
    let _ = try_enter_splice(&ctx);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_splice")]
pub fn ra_exit_splice(ctx: TracePointContext) -> u32 {
    let _ = try_exit_io(&ctx);
    0
}

// ---------------------------------------------------------------------------------------------
// TLS: uprobes on OpenSSL (libssl). The plaintext an application hands to SSL_write or gets from
// SSL_read is reported on the connection of the fd the library does its I/O on; the ciphertext
// syscalls inside those calls (and inside handshakes) are not reported.

/// An SSL call in progress on a thread.
#[repr(C)]
#[derive(Clone, Copy)]
struct SslArgs {
    ssl: u64,
    buf: u64,
    /// `size_t *` the _ex variants write the byte count to.
    len_ptr: u64,
    ts_enter_ns: u64,
    /// The fd the call did I/O on (u32::MAX until a syscall inside it says, or the SSL object
    /// was seen before).
    fd: u32,
    kind: u32,
}

const SSL_WRITE: u32 = 1;
const SSL_READ: u32 = 2;
const SSL_WRITE_EX: u32 = 3;
const SSL_READ_EX: u32 = 4;
const SSL_HANDSHAKE: u32 = 5;
/// An SSL call makes its syscalls right after it is entered (a blocking read waits inside one
/// syscall): a syscall this long after the entry means the entry is stale.
const SSL_CALL_STALE_NS: u64 = 10_000_000_000;

#[repr(C)]
#[derive(Clone, Copy)]
struct SslKey {
    tgid: u32,
    _pad: u32,
    ssl: u64,
}

#[map]
static SSL_ARGS: HashMap<u64, SslArgs> = HashMap::with_max_entries(16384, 0);
/// The fd each SSL object was last seen doing I/O on (a read served from OpenSSL's buffer makes
/// no syscall).
#[map]
static SSL_FDS: LruHashMap<SslKey, u32> = LruHashMap::with_max_entries(65536, 0);

#[inline(always)]
fn try_ssl_enter(ctx: &ProbeContext, kind: u32) -> Result<(), i32> {
    // No is_agent check (two kernel reads per SSL call): the agent's own sockets are never
    // tracked, so its SSL calls can produce nothing anyway.
    let pid_tgid = bpf_get_current_pid_tgid();
    let ssl: u64 = ctx.arg(0).ok_or(-1)?;
    let (buf, len_ptr) = match kind {
        SSL_HANDSHAKE => (0, 0),
        SSL_WRITE_EX | SSL_READ_EX => (ctx.arg(1).ok_or(-1)?, ctx.arg(3).ok_or(-1)?),
        _ => (ctx.arg(1).ok_or(-1)?, 0),
    };
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: plain value copied out of the map.
    let fd = unsafe { SSL_FDS.get(&SslKey { tgid, _pad: 0, ssl }) }.copied().unwrap_or(u32::MAX);
    let args = SslArgs { ssl, buf, len_ptr, ts_enter_ns: now(), fd, kind };
    SSL_ARGS.insert(&pid_tgid, &args, 0).map_err(|e| e as i32)
}

#[inline(always)]
fn try_ssl_exit(ctx: &RetProbeContext) -> Result<(), i32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let a = match SSL_ARGS.get_ptr(&pid_tgid) {
        // SAFETY: the value is copied out before the entry is removed.
        Some(p) => unsafe { *p },
        None => return Ok(()),
    };
    let _ = SSL_ARGS.remove(&pid_tgid);
    // Both return an int: SSL_read/SSL_write the byte count (≤ 0: nothing moved), the _ex
    // variants 1 on success with the count behind `len_ptr`.
    let ret = ctx.ret::<i64>() as i32;
    let n: u64 = match a.kind {
        SSL_WRITE | SSL_READ if ret > 0 => ret as u64,
        SSL_WRITE_EX | SSL_READ_EX if ret == 1 => read_user::<u64>(a.len_ptr)?,
        _ => return Ok(()),
    };
    if n == 0 || a.fd == u32::MAX {
        return Ok(());
    }
    let key = ConnKey { tgid: (pid_tgid >> 32) as u32, fd: a.fd };
    let info = match CONNS.get_ptr(&key) {
        // SAFETY: copied out.
        Some(p) => unsafe { *p },
        None => return Ok(()),
    };
    let sc = if matches!(a.kind, SSL_WRITE | SSL_WRITE_EX) { syscall::SSL_WRITE } else { syscall::SSL_READ };
    emit_data(pid_tgid, a.fd, &info, sc, Src::Flat(a.buf), (n as i64, n), a.ts_enter_ns);
    Ok(())
}

macro_rules! ssl_programs {
    ($($enter:ident, $kind:expr;)*) => {$(
        #[uprobe]
        pub fn $enter(ctx: ProbeContext) -> u32 {
            let _ = try_ssl_enter(&ctx, $kind);
            0
        }
    )*};
}

ssl_programs! {
    ra_ssl_write, SSL_WRITE;
    ra_ssl_read, SSL_READ;
    ra_ssl_write_ex, SSL_WRITE_EX;
    ra_ssl_read_ex, SSL_READ_EX;
    ra_ssl_handshake, SSL_HANDSHAKE;
}

/// One return probe for every SSL function (the entry recorded which one it was).
#[uretprobe]
pub fn ra_ssl_ret(ctx: RetProbeContext) -> u32 {
    let _ = try_ssl_exit(&ctx);
    0
}

// ---------------------------------------------------------------------------------------------
// connect / accept / close

#[inline(always)]
fn try_enter_connect(ctx: &TracePointContext) -> Result<(), i32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    if is_agent(pid_tgid) {
        return Ok(());
    }
    let fd = arg(ctx, 0)? as u32;
    let args = ConnectArgs { ts_enter_ns: now(), skaddr: 0, fd, is_tcp: 0 };
    CONNECT_ARGS.insert(&pid_tgid, &args, 0).map_err(|e| e as i32)
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
        let key = ConnKey { tgid: (pid_tgid >> 32) as u32, fd: c.fd };
        let info = ConnInfo { generation: c.ts_enter_ns, skaddr: c.skaddr, role: role::CLIENT, _pad: 0, tuple };
        let _ = CONNS.insert(&key, &info, 0);
    }
    if failed != 0 || (errno != 0 && errno != EINPROGRESS) {
        // The socket already went to CLOSE (its entry was kept for the tuple above).
        let _ = SOCKS.remove(&c.skaddr);
    }
    emit_conn(conn_kind::CONNECT, pid_tgid, c.fd, role::CLIENT, errno as i32, (0, 0), c.ts_enter_ns, &tuple);
    if errno == EINPROGRESS && established {
        // The handshake finished inside the call (loopback): report it now, it will not fire again.
        let states = (tcp_state::SYN_SENT, tcp_state::ESTABLISHED);
        emit_conn(conn_kind::ESTABLISHED, pid_tgid, c.fd, role::CLIENT, 0, states, c.ts_enter_ns, &tuple);
    }
    if errno == EINPROGRESS && failed != 0 {
        let states = (tcp_state::SYN_SENT, tcp_state::CLOSE);
        emit_conn(conn_kind::FAILED, pid_tgid, c.fd, role::CLIENT, failed, states, c.ts_enter_ns, &tuple);
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

#[inline(always)]
fn try_enter_accept(ctx: &TracePointContext) -> Result<(), i32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    if is_agent(pid_tgid) {
        return Ok(());
    }
    let args = AcceptArgs { addr: arg(ctx, 1)?, ts_enter_ns: now(), fd: arg(ctx, 0)? as u32, _pad: 0 };
    ACCEPT_ARGS.insert(&pid_tgid, &args, 0).map_err(|e| e as i32)
}

#[repr(C)]
#[derive(Clone, Copy)]
struct SockaddrIn6 {
    family: u16,
    port: u16,
    flowinfo: u32,
    addr: [u8; 16],
}

/// `struct sock *` behind `fd` of the current task, via BTF offsets from userspace (0 if unknown).
#[inline(always)]
fn sock_of_fd(fd: u32) -> u64 {
    let c = config();
    if c.task_files == 0 || c.files_fdt == 0 || c.fdt_fd == 0 || c.file_private_data == 0 {
        return 0;
    }
    let read = |addr: u64| -> u64 {
        if addr == 0 {
            return 0;
        }
        // SAFETY: bpf_probe_read_kernel tolerates bad addresses (returns an error).
        unsafe { bpf_probe_read_kernel(addr as *const u64) }.unwrap_or(0)
    };
    // SAFETY: no preconditions; the pointer is only used through probe reads.
    let task = unsafe { bpf_get_current_task() };
    let files = read(task + c.task_files as u64);
    let fdt = read(files + c.files_fdt as u64);
    let fds = read(fdt + c.fdt_fd as u64);
    if fds == 0 {
        return 0;
    }
    let file = read(fds + 8 * fd as u64);
    let socket = read(file + c.file_private_data as u64);
    read(socket + c.socket_sk as u64)
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
    if sk != 0 {
        if let Some(p) = SERVER_EST_SK.get_ptr(&sk) {
            // SAFETY: copied out before removal.
            found = Some(unsafe { *p });
            let _ = SERVER_EST_SK.remove(&sk);
        }
    }
    let mut peer = PeerKey { family: 0, port: 0, addr: [0; 16] };
    if a.addr != 0 {
        // sockaddr_in is a prefix-compatible subset: family, port, then 4 address bytes at 4.
        let sa: SockaddrIn6 = read_user(a.addr)?;
        peer = PeerKey { family: sa.family, port: u16::from_be(sa.port), addr: [0; 16] };
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
        if found.is_none() {
            if let Some(p) = SERVER_EST.get_ptr(&peer) {
                // SAFETY: copied out before removal.
                found = Some(unsafe { *p });
            }
        }
        let _ = SERVER_EST.remove(&peer);
    }
    let (skaddr, tuple) = match found {
        Some(e) => (e.skaddr, e.tuple),
        // A TCP peer address but no ESTABLISHED seen (e.g. it predates the agent): remote only.
        None if peer.family != 0 => (
            0,
            SockTuple { family: peer.family, lport: 0, rport: peer.port, _pad: 0, laddr: [0; 16], raddr: peer.addr },
        ),
        // Neither a peer address nor a known socket: cannot tell TCP from Unix; not tracked.
        None => return Ok(()),
    };
    if found.is_some() {
        // Whichever way it was found, both index entries are consumed now.
        let key = PeerKey { family: tuple.family, port: tuple.rport, addr: tuple.raddr };
        let _ = SERVER_EST.remove(&key);
        let _ = SERVER_EST_SK.remove(&skaddr);
    }
    let generation = now();
    let key = ConnKey { tgid: (pid_tgid >> 32) as u32, fd: newfd };
    let info = ConnInfo { generation, skaddr, role: role::SERVER, _pad: 0, tuple };
    let _ = CONNS.insert(&key, &info, 0);
    if skaddr != 0 {
        let owner = SockOwner { pid_tgid, generation, fd: newfd, role: role::SERVER, flags: 0, errno: 0, tuple };
        let _ = SOCKS.insert(&skaddr, &owner, 0);
    }
    emit_conn(conn_kind::ACCEPT, pid_tgid, newfd, role::SERVER, 0, (0, 0), generation, &tuple);
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

#[inline(always)]
fn try_enter_close(ctx: &TracePointContext) -> Result<(), i32> {
    let fd = arg(ctx, 0)? as u32;
    let pid_tgid = bpf_get_current_pid_tgid();
    let key = ConnKey { tgid: (pid_tgid >> 32) as u32, fd };
    let info = match CONNS.get_ptr(&key) {
        // SAFETY: copied out before removal.
        Some(p) => unsafe { *p },
        None => return Ok(()),
    };
    let _ = CONNS.remove(&key);
    emit_conn(conn_kind::CLOSE, pid_tgid, fd, info.role, 0, (0, 0), info.generation, &info.tuple);
    Ok(())
}

#[tracepoint(category = "syscalls", name = "sys_enter_close")]
pub fn ra_enter_close(ctx: TracePointContext) -> u32 {
    let _ = try_enter_close(&ctx);
    0
}

// ---------------------------------------------------------------------------------------------
// fd reuse hygiene: an fd closed behind our back (close_range, exec, a missed close) must not
// keep its CONNS entry, or the file/pipe that reuses the number would be traced as TCP.

#[inline(always)]
fn forget_fd(pid_tgid: u64, fd: u32) {
    let key = ConnKey { tgid: (pid_tgid >> 32) as u32, fd };
    let info = match CONNS.get_ptr(&key) {
        // SAFETY: copied out before removal.
        Some(p) => unsafe { *p },
        None => return,
    };
    let _ = CONNS.remove(&key);
    emit_conn(conn_kind::CLOSE, pid_tgid, fd, info.role, 0, (0, 0), info.generation, &info.tuple);
}

#[inline(always)]
fn try_exit_new_fd(ctx: &TracePointContext) -> Result<(), i32> {
    let ret = exit_ret(ctx)?;
    if ret >= 0 {
        forget_fd(bpf_get_current_pid_tgid(), ret as u32);
    }
    Ok(())
}

macro_rules! new_fd_programs {
    ($($prog:ident, $tp:literal;)*) => {$(
        #[tracepoint(category = "syscalls", name = $tp)]
        pub fn $prog(ctx: TracePointContext) -> u32 {
            let _ = try_exit_new_fd(&ctx);
            0
        }
    )*};
}

new_fd_programs! {
    ra_exit_openat, "sys_exit_openat";
    ra_exit_socket, "sys_exit_socket";
    ra_exit_dup, "sys_exit_dup";
}

/// dup2/dup3(oldfd, newfd): newfd is closed first; if oldfd is tracked, newfd becomes the same
/// connection (inetd-style redirection).
#[inline(always)]
fn try_enter_dup2(ctx: &TracePointContext) -> Result<(), i32> {
    let oldfd = arg(ctx, 0)? as u32;
    let newfd = arg(ctx, 1)? as u32;
    if oldfd == newfd {
        return Ok(());
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    forget_fd(pid_tgid, newfd);
    let tgid = (pid_tgid >> 32) as u32;
    if let Some(p) = CONNS.get_ptr(&ConnKey { tgid, fd: oldfd }) {
        // SAFETY: copied out of the map value.
        let info = unsafe { *p };
        let _ = CONNS.insert(&ConnKey { tgid, fd: newfd }, &info, 0);
    }
    Ok(())
}

#[tracepoint(category = "syscalls", name = "sys_enter_dup2")]
pub fn ra_enter_dup2(ctx: TracePointContext) -> u32 {
    let _ = try_enter_dup2(&ctx);
    0
}

#[tracepoint(category = "syscalls", name = "sys_enter_dup3")]
pub fn ra_enter_dup3(ctx: TracePointContext) -> u32 {
    let _ = try_enter_dup2(&ctx);
    0
}

// ---------------------------------------------------------------------------------------------
// TCP state changes

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
    let mut t = SockTuple { family: a.family, lport: a.sport, rport: a.dport, _pad: 0, laddr: [0; 16], raddr: [0; 16] };
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

#[inline(always)]
fn sk_err(skaddr: u64) -> i32 {
    let off = config().sk_err_offset;
    if off == 0 || off > 4096 {
        return 0;
    }
    // SAFETY: bpf_probe_read_kernel tolerates a bad address (returns an error).
    unsafe { bpf_probe_read_kernel((skaddr + off as u64) as *const i32) }.unwrap_or(0)
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
    let tuple = tuple_of(&a);

    if old == tcp_state::CLOSE && new == tcp_state::SYN_SENT {
        // Runs in the connecting task: marks its pending connect() as TCP.
        let pid_tgid = bpf_get_current_pid_tgid();
        if let Some(c) = CONNECT_ARGS.get_ptr_mut(&pid_tgid) {
            // SAFETY: map value pointer, valid for this program run.
            let (generation, fd) = unsafe {
                (*c).is_tcp = 1;
                (*c).skaddr = a.skaddr;
                ((*c).ts_enter_ns, (*c).fd)
            };
            let owner =
                SockOwner { pid_tgid, generation, fd, role: role::CLIENT, flags: OWNER_IN_CONNECT, errno: 0, tuple };
            let _ = SOCKS.insert(&a.skaddr, &owner, 0);
        }
        return Ok(());
    }
    if old == tcp_state::SYN_RECV && new == tcp_state::ESTABLISHED {
        // Server side: remember the full tuple until accept() names the peer.
        let peer = PeerKey { family: a.family, port: a.dport, addr: tuple.raddr };
        let est = ServerEst { skaddr: a.skaddr, tuple };
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
        if tuple.lport != 0 {
            (*o).tuple = tuple;
        }
        *o
    };
    let in_connect = owner.flags & OWNER_IN_CONNECT != 0;
    if old == tcp_state::SYN_SENT && new == tcp_state::ESTABLISHED {
        // SAFETY: map value pointer, valid for this program run.
        unsafe { (*o).flags |= OWNER_ESTABLISHED };
        let key = ConnKey { tgid: (owner.pid_tgid >> 32) as u32, fd: owner.fd };
        if let Some(info) = CONNS.get_ptr_mut(&key) {
            // SAFETY: map value pointer; generation check so a reused fd is not overwritten.
            unsafe {
                if (*info).generation == owner.generation {
                    (*info).tuple = tuple;
                }
            }
        }
        if !in_connect {
            emit_conn(conn_kind::ESTABLISHED, owner.pid_tgid, owner.fd, owner.role, 0, (old, new), owner.generation, &tuple);
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
        emit_conn(conn_kind::FAILED, owner.pid_tgid, owner.fd, owner.role, errno, (old, new), owner.generation, &tuple);
    } else if old == tcp_state::ESTABLISHED || old == tcp_state::CLOSE_WAIT || old == tcp_state::SYN_RECV {
        // Straight to CLOSE from an open state: RST received or sent (abortive close).
        let mut errno = sk_err(a.skaddr);
        if errno == 0 {
            errno = ECONNRESET as i32;
        }
        emit_conn(conn_kind::RESET, owner.pid_tgid, owner.fd, owner.role, errno, (old, new), owner.generation, &tuple);
    }
    let _ = SOCKS.remove(&a.skaddr);
    Ok(())
}

#[tracepoint(category = "sock", name = "inet_sock_set_state")]
pub fn ra_sock_state(ctx: TracePointContext) -> u32 {
    let _ = try_sock_state(&ctx);
    0
}

#[inline(always)]
fn try_process_exit(ctx: &TracePointContext) -> Result<(), i32> {
    // Every exiting thread: drop what a syscall it never returned from left behind.
    let tid_key = bpf_get_current_pid_tgid();
    let _ = IO_ARGS.remove(&tid_key);
    let _ = CONNECT_ARGS.remove(&tid_key);
    let _ = ACCEPT_ARGS.remove(&tid_key);
    let _ = SSL_ARGS.remove(&tid_key);
    // SAFETY: `bool group_dead` at 32 in sched_process_exit's format.
    let group_dead: u8 = unsafe { ctx.read_at(32)? };
    if group_dead == 0 {
        return Ok(());
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    // The last thread's name: a process gone before userspace read /proc is named by it.
    let comm = bpf_get_current_comm().unwrap_or_default();
    let rec = ProcessExitRecord { kind: KIND_PROCESS_EXIT, pid: (pid_tgid >> 32) as u32, ts_ns: now(), comm };
    if EVENTS.output(&rec, ring_flags()).is_err() {
        count_drop();
    }
    Ok(())
}

#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn ra_process_exit(ctx: TracePointContext) -> u32 {
    let _ = try_process_exit(&ctx);
    0
}

/// exec replaces comm/exe: userspace re-reads the metadata of processes it already described.
#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn ra_process_exec(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let comm = bpf_get_current_comm().unwrap_or_default();
    let rec = ProcessExitRecord { kind: KIND_PROCESS_EXEC, pid: (pid_tgid >> 32) as u32, ts_ns: now(), comm };
    if EVENTS.output(&rec, ring_flags()).is_err() {
        count_drop();
    }
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
