//! Records into the ring buffer: connection records, data records with their payload prefix,
//! process records. A record that does not fit is counted in `DROPS`, never retried.
use core::{ffi::c_void, mem::size_of};

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::generated,
};
use retry_common::{
    ConnInfo, ConnRecord, DataHeader, KIND_CONN, KIND_DATA, MAX_PAYLOAD, ProcessExitRecord, SockTuple, direction,
    syscall,
};

use crate::{
    config::config,
    ctx::{now, read_user},
    maps::{DROPS, EVENTS, SCRATCH},
};

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
    emit_conn_from(kind, pid_tgid, fd, role, errno, states, generation, tuple, 0);
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
    };
    if EVENTS.output(&rec, ring_flags()).is_err() {
        count_drop();
    }
}

/// A process record (`KIND_PROCESS_EXIT`, `KIND_PROCESS_EXEC`) for the current process.
#[inline(always)]
pub fn emit_process(kind: u32, pid_tgid: u64) {
    // The current thread's name: a process gone before userspace read /proc is named by it.
    let comm = aya_ebpf::helpers::bpf_get_current_comm().unwrap_or_default();
    let rec = ProcessExitRecord { kind, pid: (pid_tgid >> 32) as u32, ts_ns: now(), comm };
    if EVENTS.output(&rec, ring_flags()).is_err() {
        count_drop();
    }
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

/// iovecs copied at most per syscall. Most writers need one or two, but gRPC C-core (grpcio)
/// writes a frame as many small slices: with 8, an HTTP/2 header block was cut after ~84 bytes
/// and every grpcio exchange lost its HPACK state.
const MAX_IOV: u64 = 32;

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

/// One data record: the header and up to the configured prefix of the bytes at `src`.
#[inline(always)]
pub fn emit_data(pid_tgid: u64, fd: u32, info: &ConnInfo, sc: u32, src: Src, (ret, total): (i64, u64), ts_enter_ns: u64) {
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
            goroutine: crate::uprobes::go::context(pid_tgid),
        };
        let size = size_of::<DataHeader>() + n as usize;
        let bytes = core::slice::from_raw_parts(rec as *const u8, size);
        if EVENTS.output(bytes, ring_flags()).is_err() {
            count_drop();
        }
    }
}
