//! Records into the ring buffer: connection records, data records with their payload prefix,
//! process records. A record that does not fit is counted in `DROPS`, never retried.
use core::{ffi::c_void, mem::size_of};

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::generated,
};
use retry_common::{
    CONN_H2, ConnInfo, ConnKey, ConnRecord, DataHeader, H2_RECORDS, KIND_CONN, KIND_DATA,
    MAX_PAYLOAD, ProcessExitRecord, SockTuple, direction, role, syscall,
};

use crate::{
    config::config,
    ctx::{now, read_user},
    maps::{CONNS, COPY, CopyState, DROPS, EVENTS, SCRATCH, SEGMENT},
};

/// Ring-buffer flags for a record of `size` bytes: a wakeup only for the record that brings
/// what waits past a multiple of `wakeup_bytes` (so a wakeup the reader missed while it was
/// busy is sent again one threshold later, not only by its poll), none otherwise (the reader
/// polls meanwhile). Forcing one for every record past the threshold until the reader caught up
/// raised an interrupt for most records in that window: 1.25 µs of eBPF time per proxied
/// request under wrk, against 0.92 µs this way.
#[inline(always)]
pub fn ring_flags(size: usize) -> u64 {
    let threshold = u64::from(config().wakeup_bytes);
    if threshold == 0 {
        return 0;
    }
    let waiting = EVENTS.query(BPF_RB_AVAIL_DATA as u64);
    if waiting / threshold != (waiting + size as u64) / threshold {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// Into the ring; a record that does not fit is counted in `DROPS`, never retried.
#[inline(always)]
pub fn output<T: ?Sized>(rec: &T) {
    if EVENTS
        .output(rec, ring_flags(core::mem::size_of_val(rec)))
        .is_err()
    {
        count_drop();
    }
}

#[inline(always)]
pub fn count_drop() {
    if let Some(p) = DROPS.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, only this CPU writes it while this program runs.
        unsafe { *p += 1 };
    }
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn emit_conn(
    kind: u32,
    pid_tgid: u64,
    fd: u32,
    role: u32,
    errno: i32,
    states: (u32, u32),
    generation: u64,
    tuple: &SockTuple,
) {
    emit_conn_from(
        kind, pid_tgid, fd, role, errno, states, generation, tuple, 0,
    );
}

/// [`emit_conn`] for a connection handed down by process `parent` (0: none).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn emit_conn_from(
    kind: u32,
    pid_tgid: u64,
    fd: u32,
    role: u32,
    errno: i32,
    states: (u32, u32),
    generation: u64,
    tuple: &SockTuple,
    parent: u32,
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
        parent,
        generation,
        ts_ns: now(),
        tuple: *tuple,
        ..ConnRecord::default()
    };
    output(&rec);
}

/// A `conn_kind::STREAM` record: HTTP/2 stream `stream_id` of the tracked connection `info`
/// serves the goroutine context `context` (retry-ebpf's go.rs).
#[inline(always)]
pub fn emit_stream(pid_tgid: u64, info: &ConnInfo, stream_id: u32, context: u64) {
    let rec = ConnRecord {
        kind: KIND_CONN,
        conn_kind: retry_common::conn_kind::STREAM,
        pid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        fd: info.fd,
        role: info.role,
        generation: info.generation,
        ts_ns: now(),
        tuple: info.tuple,
        stream_id,
        context,
        ..ConnRecord::default()
    };
    output(&rec);
}

/// A process record (`KIND_PROCESS_EXIT`, `KIND_PROCESS_EXEC`) for the current process.
#[inline(always)]
pub fn emit_process(kind: u32, pid_tgid: u64) {
    // The current thread's name: a process gone before userspace read /proc is named by it.
    let comm = aya_ebpf::helpers::bpf_get_current_comm().unwrap_or_default();
    let rec = ProcessExitRecord {
        kind,
        pid: (pid_tgid >> 32) as u32,
        ts_ns: now(),
        comm,
    };
    output(&rec);
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Iovec {
    base: u64,
    len: u64,
}

/// Where the bytes are: one buffer, an iovec array, or nowhere a program can read (zero-copy).
#[derive(Clone, Copy)]
pub enum Src {
    Flat(u64),
    Iov(u64),
    None,
}

/// iovecs followed at most per syscall. Most writers need one or two, but gRPC C-core (grpcio)
/// writes a frame as many small slices (~14 bytes each): with 8, an HTTP/2 header block was cut
/// after ~84 bytes; with 32, a write batching several streams' frames (2 KiB, ~150 slices) was
/// cut after 452 bytes and every later exchange on the channel lost its HPACK state; with 256, a
/// 4 KiB write of ~10-byte slices was. 1024 is the kernel's own limit (UIO_MAXIOV).
const MAX_IOV: u64 = 1024;
/// Copy steps per syscall: one per iovec, plus one per slot boundary or page-sized piece of a
/// large buffer.
const MAX_STEPS: u64 = MAX_IOV + 2 * H2_RECORDS as u64;

/// One step of the copy (`bpf_loop` callback, state in `COPY`): loads the next iovec or copies
/// one piece, up to the end of the iovec, of the current slot and of what is wanted. Returns 1
/// to stop. The state lives in a map, not on the stack, so the verifier sees unknown values at
/// every entry and the callback's states converge at once; on the stack each step's precise
/// values made it walk all MAX_STEPS of them, past its instruction limit.
unsafe extern "C" fn copy_step(_index: u64, _ctx: *mut c_void) -> i64 {
    let (Some(c), Some(buf)) = (COPY.get_ptr_mut(0), SCRATCH.get_ptr_mut(0)) else {
        return 1;
    };
    // SAFETY: this CPU's values; only this program uses them while it runs.
    let c = unsafe { &mut *c };
    let buf = buf as *mut u8;
    if c.got >= c.want {
        return 1;
    }
    if c.loaded == 0 {
        if c.idx >= MAX_IOV {
            return 1;
        }
        let Ok(iov) = read_user::<Iovec>(c.src + 16 * c.idx) else {
            return 1;
        };
        c.base = iov.base;
        c.len = iov.len;
        c.off = 0;
        c.loaded = 1;
        c.idx += 1;
    }
    if c.off >= c.len {
        if c.flat != 0 {
            return 1;
        }
        c.loaded = 0;
        return 0;
    }
    // Within this slot: up to its end, the iovec's end and what is still wanted.
    let inner = c.got & (MAX_PAYLOAD as u64 - 1);
    let mut n = MAX_PAYLOAD as u64 - inner;
    if c.len - c.off < n {
        n = c.len - c.off;
    }
    if c.want - c.got < n {
        n = c.want - c.got;
    }
    // Masks restate bounds the verifier cannot infer: slot < H2_RECORDS, inner < MAX_PAYLOAD,
    // n ≤ MAX_PAYLOAD; the scratch tail covers the largest end.
    let slot = (c.got / MAX_PAYLOAD as u64) & (H2_RECORDS as u64 - 1);
    let at = slot * SEGMENT as u64 + size_of::<DataHeader>() as u64 + inner;
    let n = if n > MAX_PAYLOAD as u64 {
        MAX_PAYLOAD as u64
    } else {
        n
    };
    // SAFETY: at + n ≤ (H2_RECORDS - 1) × SEGMENT + 120 + 2 × MAX_PAYLOAD ≤ size of Scratch.
    let ok = unsafe {
        generated::bpf_probe_read_user(
            buf.add(at as usize) as *mut c_void,
            n as u32,
            (c.base + c.off) as *const c_void,
        ) == 0
    };
    if !ok {
        return 1;
    }
    c.got += n;
    c.off += n;
    0
}

/// Copies up to `want` bytes of the syscall's source into the payload parts of the scratch
/// slots, MAX_PAYLOAD bytes per slot; returns how many were copied, contiguous from the start
/// (fewer: the iovecs, the steps or readable memory ended). One flat buffer that fits one slot
/// (read, write, send, recv: most calls) is one helper call; so is an iovec array whose first
/// iovec holds all that is wanted (a status line peeked in a `writev`'s headers), after reading
/// that iovec; the rest take the `bpf_loop` walk.
#[inline(always)]
pub fn copy_payload(src: Src, want: u64) -> u64 {
    match src {
        Src::Flat(p) if want <= MAX_PAYLOAD as u64 => copy_flat(p, want),
        Src::Iov(p) if want <= MAX_PAYLOAD as u64 => match read_user::<[u64; 2]>(p) {
            // struct iovec { iov_base, iov_len }: the walk's setup and its callbacks were most of
            // nginx's answer (a `writev` of headers and file).
            Ok([base, len]) if len >= want => copy_flat(base, want),
            _ => copy_walk(src, want),
        },
        _ => copy_walk(src, want),
    }
}

#[inline(always)]
fn copy_flat(src: u64, want: u64) -> u64 {
    let Some(buf) = SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // The mask restates want ≤ MAX_PAYLOAD for the verifier.
    let n = (want as usize & (2 * MAX_PAYLOAD - 1)).min(MAX_PAYLOAD);
    // SAFETY: the first slot's payload part holds MAX_PAYLOAD bytes; the helper checks the user
    // address and fails cleanly (nothing copied: the record says so).
    let ok = unsafe {
        let at = (buf as *mut u8).add(size_of::<DataHeader>());
        generated::bpf_probe_read_user(at as *mut c_void, n as u32, src as *const c_void) == 0
    };
    if ok { n as u64 } else { 0 }
}

/// The general copy: iovec arrays and buffers larger than a slot, step by step (`copy_step`).
#[inline(always)]
fn copy_walk(src: Src, want: u64) -> u64 {
    let (flat, src) = match src {
        Src::None => return 0,
        Src::Flat(p) => (1, p),
        Src::Iov(p) => (0, p),
    };
    let Some(c) = COPY.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's value; only this program uses it while it runs.
    unsafe {
        // A flat buffer is one iovec of all the syscall's bytes, already loaded.
        *c = CopyState {
            src,
            flat,
            want,
            got: 0,
            base: src,
            len: u64::MAX,
            off: 0,
            idx: 0,
            loaded: flat,
        };
    }
    copy_run()
}

#[inline(always)]
fn copy_run() -> u64 {
    // SAFETY: the callback takes its state from COPY; no context pointer is passed.
    unsafe {
        generated::bpf_loop(
            MAX_STEPS as u32,
            copy_step as *mut c_void,
            core::ptr::null_mut(),
            0,
        );
    }
    // SAFETY: this CPU's value, as above.
    COPY.get_ptr_mut(0).map_or(0, |c| unsafe { (*c).got })
}

/// The HTTP/2 client preface starts "PRI * HT" (as a little-endian u64).
const PREFACE_HEAD: u64 = u64::from_le_bytes(*b"PRI * HT");
const PREFACE_TAIL: [u8; 16] = *b"TP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether the captured bytes begin with the whole HTTP/2 client preface.
///
/// # Safety
/// `p` points at `n` readable bytes of scratch.
#[inline(always)]
unsafe fn is_preface(p: *const u8, n: u64) -> bool {
    if n < 24 {
        return false;
    }
    // SAFETY: n ≥ 24 bytes are readable (caller's contract).
    unsafe {
        if core::ptr::read_unaligned(p as *const u64) != PREFACE_HEAD {
            return false;
        }
        for (i, b) in PREFACE_TAIL.iter().enumerate() {
            if *p.add(8 + i) != *b {
                return false;
            }
        }
    }
    true
}

/// Marks the tracked connection as HTTP/2: its next syscalls take the HTTP/2 capture size.
#[inline(always)]
fn mark_h2(key: &ConnKey) {
    if let Some(p) = CONNS.get_ptr_mut(key) {
        // SAFETY: a map value; a concurrent update only loses the flag until the next preface.
        unsafe { (*p).flags |= CONN_H2 };
    }
}

/// The data records of one syscall: the header and up to the configured prefix of the bytes at
/// `src`, in one record. On an HTTP/2 connection (`CONN_H2`, set when its preface goes by) the
/// prefix is `H2_RECORDS × MAX_PAYLOAD` bytes, cut into records of MAX_PAYLOAD that follow each
/// other (the last covers the rest of the syscall, its uncaptured tail a gap): header blocks a
/// writer batched behind other streams' frames are still captured, so the HPACK table stays known.
///
/// `(ts_enter_ns, ts_exit_ns)`: when the call began and returned, both read by the caller. An
/// exit program runs once the call has returned, so its own start is the return time; a second
/// clock read after the copy would only add the program's own time (and ~25 ns per record here).
#[inline(always)]
pub fn emit_data(
    pid_tgid: u64,
    key: &ConnKey,
    info: &ConnInfo,
    sc: u32,
    src: Src,
    (ret, total): (i64, u64),
    ts: (u64, u64),
) {
    let got = copy_data(key, info, sc, src, total);
    send_data(pid_tgid, info, (sc, 0), got, (ret, total), ts);
}

/// The first step of [`emit_data`]: up to the configured prefix of the syscall's bytes into the
/// scratch slots (the HTTP/2 prefix once the connection is, or just became, HTTP/2); returns
/// how many were copied. The bytes start at `payload()`.
#[inline(always)]
pub fn copy_data(key: &ConnKey, info: &ConnInfo, sc: u32, src: Src, total: u64) -> u64 {
    let Some(buf) = SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    let buf = buf as *mut u8;
    let h2 = info.flags & CONN_H2 != 0;
    let egress = syscall::is_egress(sc);
    let prefix = if role::carries_response(info.role, egress) {
        config().response_bytes
    } else {
        config().payload_bytes
    };
    let mut want = if h2 {
        H2_RECORDS as u64 * MAX_PAYLOAD as u64
    } else {
        prefix as u64
    };
    if !h2 && want > MAX_PAYLOAD as u64 {
        want = MAX_PAYLOAD as u64;
    }
    if total < want {
        want = total;
    }
    let mut got = copy_payload(src, want);
    // SAFETY: the first slot's payload holds `got` bytes when got ≤ MAX_PAYLOAD, and more
    // than 24 otherwise.
    if !h2 && unsafe { is_preface(buf.add(size_of::<DataHeader>()), got) } {
        mark_h2(key);
        // The preface's own syscall often carries the first streams too (a server's first read
        // of a busy channel: 32 calls' header blocks behind it): capture it as HTTP/2 already.
        if got == want && total > got {
            let mut more = H2_RECORDS as u64 * MAX_PAYLOAD as u64;
            if total < more {
                more = total;
            }
            // Once per connection: copied again from the start, as HTTP/2.
            got = copy_walk(src, more);
        }
    }
    got
}

/// The header of a data record of this syscall carrying `captured` of its `len` bytes;
/// `goroutine`: `uprobes::go::context` of the thread, read once per syscall by the caller;
/// `flags`: `data_flags::*`.
#[inline(always)]
pub fn header(
    pid_tgid: u64,
    info: &ConnInfo,
    sc: u32,
    (goroutine, flags): (u64, u16),
    (captured, ret, len): (u64, i64, u64),
    (ts_enter_ns, ts_exit_ns): (u64, u64),
) -> DataHeader {
    DataHeader {
        kind: KIND_DATA,
        syscall: sc,
        pid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        fd: info.fd,
        role: info.role,
        direction: if syscall::is_egress(sc) {
            direction::EGRESS
        } else {
            direction::INGRESS
        },
        flags,
        captured: captured as u32,
        generation: info.generation,
        ts_enter_ns,
        ts_exit_ns,
        ret,
        len,
        tuple: info.tuple,
        goroutine,
    }
}

/// The second step of [`emit_data`]: the records of the `got` bytes [`copy_data`] left in the
/// scratch slots, each behind its header (with `flags`, `data_flags::*`).
#[inline(always)]
pub fn send_data(
    pid_tgid: u64,
    info: &ConnInfo,
    (sc, flags): (u32, u16),
    got: u64,
    (ret, total): (i64, u64),
    ts: (u64, u64),
) {
    let buf = match SCRATCH.get_ptr_mut(0) {
        Some(r) => r as *mut u8,
        None => return,
    };
    // Once per syscall, not per record: a map lookup (and a register read) for Go processes.
    let goroutine = crate::uprobes::go::context(pid_tgid);
    let mut done: u64 = 0;
    for slot in 0..H2_RECORDS as u64 {
        let captured = if got > done + MAX_PAYLOAD as u64 {
            MAX_PAYLOAD as u64
        } else {
            got - done
        };
        // A full slot with more bytes after it covers just its own bytes; the last one the rest.
        let more =
            captured == MAX_PAYLOAD as u64 && got > done + captured && slot + 1 < H2_RECORDS as u64;
        let len = if more { captured } else { total - done };
        let at = slot * SEGMENT as u64;
        // SAFETY: slot < H2_RECORDS: the header and `captured` ≤ MAX_PAYLOAD bytes lie in the value.
        unsafe {
            let rec = buf.add(at as usize);
            let header = header(
                pid_tgid,
                info,
                sc,
                (goroutine, flags),
                (captured, ret, len),
                ts,
            );
            core::ptr::write_unaligned(rec as *mut DataHeader, header);
            let size = size_of::<DataHeader>()
                + (captured as usize & (2 * MAX_PAYLOAD - 1)).min(MAX_PAYLOAD);
            let bytes = core::slice::from_raw_parts(rec as *const u8, size);
            output(bytes);
        }
        if !more {
            return;
        }
        done += captured;
    }
}
