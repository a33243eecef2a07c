//! Go request context (targets `go`, `go-ret`): which inbound request an outbound HTTP call of a Go program belongs to.
//!
//! Go multiplexes goroutines over threads and its HTTP client writes requests on a
//! per-connection goroutine, so neither threads nor the goroutine doing the I/O tell whose call
//! it is. Uprobes on the Go program (attached per executable by userspace at function entries
//! and, for returns, at RET instructions: uretprobes are unsafe on Go's moving stacks) keep:
//!
//! - `GO_ROOT`: goroutine → the request goroutine it works for. `ServeHTTP` makes its goroutine
//!   a root; `newproc1` hands a parent's root to the goroutines it spawns (fan-out, workers),
//!   and resets a new goroutine's entries (g structs are reused, and every goroutine is made
//!   by `newproc1`). Goroutine exits are not probed: net/http starts and ends a goroutine per
//!   request (its background read), so a `goexit1` probe was a quarter of a Go server's
//!   uprobe traps; entries of ended goroutines age out of the LRU maps instead.
//! - `GO_REQ`: `*http.Request` → root, at `persistConn.roundTrip` on the caller's goroutine.
//! - `GO_WRITER`: the connection's write goroutine → the root of the request it is writing,
//!   at `Request.write` (0: a call made outside any request).
//!
//! - gRPC-go's HTTP/2 frames are read and written by per-connection goroutines, several
//!   streams to a syscall, so no syscall's goroutine says whose stream it is. Instead each
//!   stream is bound once: `(*Server).handleStream` (the stream's handler goroutine becomes a
//!   root) and the returns of `(*http2Client).NewStream` (the caller's root) follow the
//!   transport's `net.Conn` to its socket's fd (offsets from the program's DWARF in `GO_GRPC`)
//!   and emit a `conn_kind::STREAM` record: connection, stream id, context.
//!
//! The data path then tags each record of a Go process with a context: the writer's owner, else
//! the I/O goroutine's root, else the goroutine itself. In Go (register ABI, go1.17+ amd64) the
//! current g is in r14, arguments in rax, rbx, rcx, rdi, rsi, … in that order.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel, generated},
    macros::{map, uprobe},
    maps::LruHashMap,
    programs::ProbeContext,
};

use retry_common::{ConnInfo, ConnKey, GOROUTINE_ROOTED, GoGrpcOffsets};

use crate::{ctx::read_user, emit::emit_stream, maps::CONNS};

#[repr(C)]
#[derive(Clone, Copy)]
struct GoKey {
    tgid: u32,
    _pad: u32,
    addr: u64,
}

/// Processes whose syscalls carry a goroutine context (set by the first Go probe they hit).
#[map]
static GO_PROCS: LruHashMap<u32, u32> = LruHashMap::with_max_entries(16384, 0);
#[map]
static GO_ROOT: LruHashMap<GoKey, u64> = LruHashMap::with_max_entries(65536, 0);
#[map]
static GO_REQ: LruHashMap<GoKey, u64> = LruHashMap::with_max_entries(16384, 0);
#[map]
static GO_WRITER: LruHashMap<GoKey, u64> = LruHashMap::with_max_entries(16384, 0);
/// gRPC-go field offsets per tgid (filled by userspace from the program's DWARF).
#[map]
static GO_GRPC: LruHashMap<u32, GoGrpcOffsets> = LruHashMap::with_max_entries(4096, 0);
/// newproc1 entry → its returns, per thread (it runs on the system stack: no nesting).
#[map]
static GO_SPAWN: LruHashMap<u64, u64> = LruHashMap::with_max_entries(4096, 0);

#[inline(always)]
fn key(tgid: u32, addr: u64) -> GoKey {
    GoKey {
        tgid,
        _pad: 0,
        addr,
    }
}

#[inline(always)]
fn regs(ctx: &ProbeContext) -> (u64, u64, u64) {
    // SAFETY: `regs` is the probe's context (user registers at the probed instruction).
    unsafe { ((*ctx.regs).r14, (*ctx.regs).rax, (*ctx.regs).rbx) }
}

#[inline(always)]
fn get(map: &LruHashMap<GoKey, u64>, k: &GoKey) -> Option<u64> {
    // SAFETY: plain value copied out of the map.
    unsafe { map.get(k) }.copied()
}

#[inline(always)]
fn mark_go(tgid: u32) {
    // SAFETY: plain value read.
    if unsafe { GO_PROCS.get(&tgid) }.is_none() {
        let _ = GO_PROCS.insert(&tgid, &1, 0);
    }
}

/// `net/http.serverHandler.ServeHTTP`: this goroutine serves an inbound request.
#[uprobe(path = "go", function = "net/http.serverHandler.ServeHTTP")]
pub fn ra_go_serve(ctx: ProbeContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let (g, _, _) = regs(&ctx);
    mark_go(tgid);
    let _ = GO_ROOT.insert(&key(tgid, g), &g, 0);
    0
}

/// `net/http.(*persistConn).roundTrip(pc, treq *transportRequest)`: an outbound call starts on
/// this goroutine; `treq` embeds the `*Request` as its first field.
#[uprobe(path = "go", function = "net/http.(*persistConn).roundTrip")]
pub fn ra_go_round_trip(ctx: ProbeContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let (g, _, treq) = regs(&ctx);
    let Some(root) = get(&GO_ROOT, &key(tgid, g)) else {
        return 0;
    };
    if let Ok(req) = read_user::<u64>(treq) {
        let _ = GO_REQ.insert(&key(tgid, req), &root, 0);
    }
    0
}

/// `net/http.(*Request).write(r, …)` on the connection's write goroutine: what it writes next
/// belongs to `r`'s caller.
#[uprobe(path = "go", function = "net/http.(*Request).write")]
pub fn ra_go_request_write(ctx: ProbeContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let (g, req, _) = regs(&ctx);
    let owner = get(&GO_REQ, &key(tgid, req)).unwrap_or(0);
    let _ = GO_WRITER.insert(&key(tgid, g), &owner, 0);
    0
}

/// `runtime.newproc1(fn, callergp *g, callerpc)`: remember the parent's root for the return.
#[uprobe(path = "go", function = "runtime.newproc1")]
pub fn ra_go_newproc(ctx: ProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let (_, _, parent) = regs(&ctx);
    mark_go(tgid);
    match get(&GO_ROOT, &key(tgid, parent)) {
        Some(root) => {
            let _ = GO_SPAWN.insert(&pid_tgid, &root, 0);
        }
        None => {
            let _ = GO_SPAWN.remove(&pid_tgid);
        }
    }
    0
}

/// At each RET of `runtime.newproc1`: rax is the new goroutine, which inherits the root (or
/// has none: a reused g struct must not keep a root from its previous life).
#[uprobe(path = "go-ret", function = "runtime.newproc1")]
pub fn ra_go_newproc_ret(ctx: ProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (_, child, _) = regs(&ctx);
    if child == 0 {
        return 0;
    }
    let k = key((pid_tgid >> 32) as u32, child);
    // SAFETY: plain value copied out.
    match (unsafe { GO_SPAWN.get(&pid_tgid) }).copied() {
        Some(root) => {
            let _ = GO_SPAWN.remove(&pid_tgid);
            let _ = GO_ROOT.insert(&k, &root, 0);
        }
        None => {
            let _ = GO_ROOT.remove(&k);
        }
    }
    // A reused g struct was perhaps a connection's write goroutine in its previous life.
    let _ = GO_WRITER.remove(&k);
    0
}

/// The tracked connection behind a Go `net.Conn` interface value stored at `field`: a
/// `*net.TCPConn` (checked against its itab when known), whose `conn.fd` is a `*netFD`, whose
/// `pfd.Sysfd` follows poll.FD's 16-byte `fdMutex`. These layouts have not moved since go1.9.
#[inline(always)]
fn tcp_conn(tgid: u32, field: u64, o: &GoGrpcOffsets) -> Option<ConnInfo> {
    let itab = read_user::<u64>(field).ok()?;
    if itab == 0 || (o.tcp_conn_itab != 0 && itab != o.tcp_conn_itab) {
        return None;
    }
    let tcp = read_user::<u64>(field + 8).ok()?;
    let netfd = read_user::<u64>(tcp).ok()?;
    let fd = read_user::<i64>(netfd + 16).ok()?;
    let fd = u32::try_from(fd).ok()?;
    // SAFETY: plain value copied out; an fd that is not a tracked socket ends it here.
    unsafe { CONNS.get(&ConnKey { tgid, fd }) }.copied()
}

#[inline(always)]
fn grpc_offsets(tgid: u32) -> Option<GoGrpcOffsets> {
    // SAFETY: plain value copied out.
    unsafe { GO_GRPC.get(&tgid) }.copied()
}

/// `grpc.(*Server).handleStream(s, t ServerTransport, stream *Stream, trInfo)`: this goroutine
/// serves `stream` (one goroutine per stream, or a worker serving one at a time). Registers:
/// s rax, t (itab rbx, data rcx), stream rdi.
#[uprobe(
    path = "go",
    function = "google.golang.org/grpc.(*Server).handleStream"
)]
pub fn ra_go_grpc_serve(ctx: ProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: `regs` is the probe's context (user registers at the probed instruction).
    let (g, transport, stream) = unsafe { ((*ctx.regs).r14, (*ctx.regs).rcx, (*ctx.regs).rdi) };
    mark_go(tgid);
    let _ = GO_ROOT.insert(&key(tgid, g), &g, 0);
    let Some(o) = grpc_offsets(tgid) else {
        return 0;
    };
    let Some(conn) = tcp_conn(tgid, transport + u64::from(o.server_conn), &o) else {
        return 0;
    };
    if let Ok(id) = read_user::<u32>(stream + u64::from(o.stream_id)) {
        emit_stream(pid_tgid, &conn, id, g | GOROUTINE_ROOTED);
    }
    0
}

/// At each RET of `transport.(*http2Client).NewStream`: rax is the new `*Stream` (nil on
/// error), whose id was assigned on this goroutine before its HEADERS were queued. Its
/// context is this goroutine's root (the bare goroutine for a call outside any request).
#[uprobe(
    path = "go-ret",
    function = "google.golang.org/grpc/internal/transport.(*http2Client).NewStream"
)]
pub fn ra_go_grpc_stream_ret(ctx: ProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let (g, stream, _) = regs(&ctx);
    if stream == 0 {
        return 0;
    }
    let Some(o) = grpc_offsets(tgid) else {
        return 0;
    };
    let Ok(client) = read_user::<u64>(stream + u64::from(o.stream_client)) else {
        return 0;
    };
    let Some(conn) = tcp_conn(tgid, client + u64::from(o.client_conn), &o) else {
        return 0;
    };
    let context = get(&GO_ROOT, &key(tgid, g)).map_or(g, |root| root | GOROUTINE_ROOTED);
    if let Ok(id) = read_user::<u32>(stream + u64::from(o.stream_id)) {
        emit_stream(pid_tgid, &conn, id, context);
    }
    0
}

/// The goroutine context of the current syscall of a Go process (0: not a Go process). Read
/// from r14 as the syscall saved it, so it is exact whichever thread runs the goroutine.
/// `GOROUTINE_ROOTED` marks a context traced to a request root.
#[inline(always)]
pub fn context(pid_tgid: u64) -> u64 {
    if crate::config::config().flags & retry_common::config_flags::GO == 0 {
        return 0;
    }
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: plain value read.
    if unsafe { GO_PROCS.get(&tgid) }.is_none() {
        return 0;
    }
    // SAFETY: the helpers take the current task; the pt_regs address they return is read with
    // bpf_probe_read_kernel, which fails cleanly on a bad address.
    let g: u64 = unsafe {
        let regs = generated::bpf_task_pt_regs(generated::bpf_get_current_task_btf())
            as *const aya_ebpf::bindings::pt_regs;
        match bpf_probe_read_kernel(core::ptr::addr_of!((*regs).r14)) {
            Ok(g) => g,
            Err(_) => return 0,
        }
    };
    if g == 0 {
        return 0;
    }
    let k = key(tgid, g);
    match get(&GO_WRITER, &k) {
        Some(owner) if owner != 0 => owner | GOROUTINE_ROOTED,
        // A call made outside any request: its own goroutine, which no inbound request has.
        Some(_) => g,
        None => get(&GO_ROOT, &k).map_or(g, |root| root | GOROUTINE_ROOTED),
    }
}
