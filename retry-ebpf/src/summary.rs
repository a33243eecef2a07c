//! `--capture-summarize`: a quiet HTTP/1 exchange leaves the kernel as one `SummaryRecord`
//! instead of its request's and response's records.
//!
//! A request record that starts with a common method and was captured whole is held in `HELD`
//! (per connection) instead of being sent. The response's first record decides: a 2xx or 3xx
//! status line, on a connection whose request nothing made interesting, sends the summary (the
//! two headers, the status and the request line) and leaves the rest of that response out
//! (`CONN_QUIET`); anything else sends the held request, then the response, as without this.
//! What makes an exchange interesting, so it is sent whole:
//! - its answer is not a 2xx/3xx (a failure, an upgrade, a 1xx);
//! - a server thread answered after one of its own calls failed since the request came
//!   (`HOT_THREADS`): the request a failure passed through, or was swallowed by, is judged
//!   on its whole exchange;
//! - a client called a destination that answered this node with a failure or a reset within
//!   `Config::summary_hot_ns` (`HOT_PEERS`): retries, and what they met, are seen whole;
//! - one in `Config::summary_sample` requests;
//! - Go processes with request context (`DataHeader::goroutine`), aliased fds, HTTP/2, TLS
//!   (the uprobes' records do not come here), requests captured in part or spread over
//!   several records (a body that follows its head), pipelines.
//!
//! Nothing is lost by holding: a held request goes out before anything else of its connection
//! (a second request record, a close, a reset, a response that is not summarised), and
//! before its thread's next request or answer on another connection (`THREAD_HELD`): userspace
//! sees each thread's messages in their order, and a thread with two requests in flight (an
//! event loop, a hedging or concurrent client) has both sent whole. What is
//! given up is what userspace reads from a successful exchange's headers (trace ids, hedges
//! among quiet exchanges, the sizes of summarised responses past their first record).
use core::{ffi::c_void, mem::size_of, ptr::addr_of_mut};

use aya_ebpf::helpers::generated;
use retry_common::{
    CONN_H2, CONN_HELD, CONN_QUIET, ConnInfo, ConnKey, DataHeader, HELD_BYTES, HeldRequest,
    KIND_SUMMARY, PeerKey, SUMMARY_LINE, SummaryRecord, config_flags, role, syscall,
};

use crate::{
    config::config,
    emit::{Src, copy_data, count_drop, emit_data, header, output, ring_flags, send_data},
    maps::{EVENTS, HELD, HOT_PEERS, HOT_THREADS, SCRATCH, SUMMARY_SEEN, THREAD_HELD},
};

const GET: u32 = u32::from_le_bytes(*b"GET ");
const POST: u32 = u32::from_le_bytes(*b"POST");
const PUT: u32 = u32::from_le_bytes(*b"PUT ");
const HEAD: u32 = u32::from_le_bytes(*b"HEAD");
const DELETE: u32 = u32::from_le_bytes(*b"DELE");
const PATCH: u32 = u32::from_le_bytes(*b"PATC");
const OPTIONS: u32 = u32::from_le_bytes(*b"OPTI");
/// "HTTP/1." and the version digit's place, masked out.
const HTTP1: u64 = u64::from_le_bytes(*b"HTTP/1.\0");
const HTTP1_MASK: u64 = 0x00ff_ffff_ffff_ffff;

/// The records of one data syscall on a tracked connection: summarised, held or sent as
/// `emit_data` sends them. `conn` is the connection's `CONNS` value (its flags are updated).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn data(
    pid_tgid: u64,
    key: &ConnKey,
    conn: *mut ConnInfo,
    info: &ConnInfo,
    sc: u32,
    src: Src,
    io: (i64, u64),
    ts: (u64, u64),
) {
    let flags = config().flags;
    if flags & config_flags::SUMMARIZE == 0
        || info.flags & CONN_H2 != 0
        || info.role == role::UNKNOWN
    {
        emit_data(pid_tgid, key, info, sc, src, io, ts);
        return;
    }
    if role::carries_response(info.role, syscall::is_egress(sc)) {
        response(pid_tgid, key, conn, info, sc, src, io, ts);
    } else {
        request(pid_tgid, key, conn, info, sc, src, io, ts);
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn request(
    pid_tgid: u64,
    key: &ConnKey,
    conn: *mut ConnInfo,
    info: &ConnInfo,
    sc: u32,
    src: Src,
    (ret, total): (i64, u64),
    ts: (u64, u64),
) {
    let own = ConnKey {
        tgid: key.tgid,
        fd: info.fd,
    };
    if info.flags & (CONN_HELD | CONN_QUIET) != 0 {
        set_flags(conn, 0, CONN_HELD | CONN_QUIET);
        if info.flags & CONN_HELD != 0 {
            // More of the request (a body after its head), or a pipeline: both go whole.
            release(&own);
            emit_data(pid_tgid, key, info, sc, src, (ret, total), ts);
            return;
        }
    }
    // A thread with a request held on another connection has two in flight: an event loop
    // serving both, a client hedging or calling concurrently. That one goes now, in its place
    // among the thread's messages, and this one whole.
    let overlapping = release_other(pid_tgid, &own);
    let got = copy_data(key, info, sc, src, total);
    let Some(buf) = SCRATCH.get_ptr_mut(0) else {
        return;
    };
    let buf = buf as *mut u8;
    // SAFETY: the first slot's payload holds `got` bytes.
    let holdable = !overlapping
        && key.fd == info.fd
        && got == total
        && got <= HELD_BYTES as u64
        && unsafe { starts_request(buf.add(size_of::<DataHeader>()), got) };
    if holdable
        && !(info.role == role::CLIENT && hot_peer(info, ts.0))
        && crate::uprobes::go::context(pid_tgid) == 0
        && !sampled()
    {
        let h = header(pid_tgid, info, sc, (got, ret, total), ts);
        // SAFETY: slot 0 of the scratch starts with a header and HELD_BYTES ≤ MAX_PAYLOAD of
        // payload; a `HeldRequest` is that prefix of it.
        let held = unsafe {
            core::ptr::write_unaligned(buf as *mut DataHeader, h);
            HELD.insert(&own, &*(buf as *const HeldRequest), 0).is_ok()
        };
        if held {
            set_flags(conn, CONN_HELD, 0);
            let _ = THREAD_HELD.insert(&pid_tgid, &own, 0);
            return;
        }
    }
    send_data(pid_tgid, info, sc, got, (ret, total), ts);
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn response(
    pid_tgid: u64,
    key: &ConnKey,
    conn: *mut ConnInfo,
    info: &ConnInfo,
    sc: u32,
    src: Src,
    (ret, total): (i64, u64),
    ts: (u64, u64),
) {
    let own = ConnKey {
        tgid: key.tgid,
        fd: info.fd,
    };
    // What this thread holds of another connection came before this answer.
    release_other(pid_tgid, &own);
    if info.flags & CONN_HELD == 0 {
        if info.flags & CONN_QUIET != 0 {
            // The rest of a summarised response.
            return;
        }
        if key.fd != info.fd {
            // An alias answering what the fd it was opened as read (never held, but cheap to
            // make sure: aliases are rare).
            release(&own);
        }
    }
    let got = copy_data(key, info, sc, src, total);
    let Some(buf) = SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: the first slot's payload holds `got` bytes.
    let status = unsafe { status_of((buf as *const u8).add(size_of::<DataHeader>()), got) };
    if info.role == role::CLIENT && status >= 400 {
        mark_failed(pid_tgid, info, ts.0);
    }
    if info.flags & CONN_HELD != 0 {
        set_flags(conn, 0, CONN_HELD);
        if let Some(h) = HELD.get_ptr(&own) {
            // SAFETY: a map value, valid for this program run.
            let (generation, start) = unsafe { ((*h).header.generation, (*h).header.ts_enter_ns) };
            let quiet = (200..400).contains(&status)
                && generation == info.generation
                && (info.role == role::CLIENT || !hot_thread(pid_tgid, start));
            if quiet {
                summarize(h, pid_tgid, info, sc, status, (ret, total), ts);
                let _ = HELD.remove(&own);
                set_flags(conn, CONN_QUIET, 0);
                return;
            }
            release(&own);
        }
    }
    send_data(pid_tgid, info, sc, got, (ret, total), ts);
}

/// Sends the request held for connection `key`, if any: what comes next on the connection
/// (a close, a reset, an answer that is not summarised) must find it before it.
#[inline(always)]
pub fn release(key: &ConnKey) {
    let Some(h) = HELD.get_ptr(key) else {
        return;
    };
    // SAFETY: a map value of `size_of::<HeldRequest>()` bytes, valid for this program run; the mask
    // restates captured ≤ HELD_BYTES for the verifier.
    unsafe {
        let captured = (*h).header.captured as usize;
        let size = size_of::<DataHeader>() + (captured & (2 * HELD_BYTES - 1)).min(HELD_BYTES);
        output(core::slice::from_raw_parts(h as *const u8, size));
    }
    let _ = HELD.remove(key);
}

/// Sends the request thread `pid_tgid` holds for a connection other than `own`, if it still
/// holds one; whether it did. The thread's entry goes either way.
#[inline(always)]
fn release_other(pid_tgid: u64, own: &ConnKey) -> bool {
    // SAFETY: plain value read, copied out.
    let Some(other) = (unsafe { THREAD_HELD.get(&pid_tgid) }).copied() else {
        return false;
    };
    let _ = THREAD_HELD.remove(&pid_tgid);
    if other == *own || HELD.get_ptr(&other).is_none() {
        return false;
    }
    release(&other);
    true
}

/// With `--capture-summarize`: what a reset or close of connection `key` must send first.
#[inline(always)]
pub fn release_if_on(key: &ConnKey) {
    if config().flags & config_flags::SUMMARIZE != 0 {
        release(key);
    }
}

/// A call of this thread failed (failure status, reset): requests it answers after are sent
/// whole, and so are the exchanges with that destination for a while.
#[inline(always)]
pub fn mark_failed(pid_tgid: u64, info: &ConnInfo, now: u64) {
    if config().flags & config_flags::SUMMARIZE == 0 {
        return;
    }
    let _ = HOT_THREADS.insert(&pid_tgid, &now, 0);
    if info.role == role::CLIENT {
        let _ = HOT_PEERS.insert(&peer(info), &now, 0);
    }
}

#[inline(always)]
fn summarize(
    h: *const HeldRequest,
    pid_tgid: u64,
    info: &ConnInfo,
    sc: u32,
    status: u32,
    (ret, total): (i64, u64),
    ts: (u64, u64),
) {
    let size = size_of::<SummaryRecord>();
    let Some(mut e) = EVENTS.reserve::<SummaryRecord>(0) else {
        count_drop();
        return;
    };
    let r = e.as_mut_ptr();
    // SAFETY: `r` is the reserved record; every field is written before it is submitted (the
    // request header and line by one copy of the held value's start, which has that layout).
    unsafe {
        addr_of_mut!((*r).kind).write(KIND_SUMMARY);
        addr_of_mut!((*r).status).write(status);
        addr_of_mut!((*r).response).write(header(pid_tgid, info, sc, (0, ret, total), ts));
        let req = addr_of_mut!((*r).request);
        if generated::bpf_probe_read_kernel(
            req as *mut c_void,
            (size_of::<DataHeader>() + SUMMARY_LINE) as u32,
            h as *const c_void,
        ) != 0
        {
            e.discard(0);
            count_drop();
            return;
        }
        if (*req).captured > SUMMARY_LINE as u32 {
            (*req).captured = SUMMARY_LINE as u32;
        }
    }
    e.submit(ring_flags(size));
}

/// Whether `p` (with `got` bytes) starts a request of a common method.
///
/// # Safety
/// `p` points at `got` readable bytes.
#[inline(always)]
unsafe fn starts_request(p: *const u8, got: u64) -> bool {
    if got < 4 {
        return false;
    }
    // SAFETY: 4 bytes are readable (caller's contract).
    let w = unsafe { core::ptr::read_unaligned(p as *const u32) };
    matches!(w, GET | POST | PUT | HEAD | DELETE | PATCH | OPTIONS)
}

/// The status code of the HTTP/1 status line `p` starts with, 0 when it is not one.
///
/// # Safety
/// `p` points at `got` readable bytes.
#[inline(always)]
unsafe fn status_of(p: *const u8, got: u64) -> u32 {
    if got < 12 {
        return 0;
    }
    // SAFETY: 12 bytes are readable (caller's contract).
    unsafe {
        if core::ptr::read_unaligned(p as *const u64) & HTTP1_MASK != HTTP1 || *p.add(8) != b' ' {
            return 0;
        }
        let mut code = 0u32;
        for i in 9..12 {
            let d = *p.add(i);
            if !d.is_ascii_digit() {
                return 0;
            }
            code = code * 10 + (d - b'0') as u32;
        }
        code
    }
}

#[inline(always)]
fn peer(info: &ConnInfo) -> PeerKey {
    PeerKey {
        family: info.tuple.family,
        port: info.tuple.rport,
        addr: info.tuple.raddr,
    }
}

#[inline(always)]
fn hot_peer(info: &ConnInfo, now: u64) -> bool {
    // SAFETY: plain value read.
    match unsafe { HOT_PEERS.get(&peer(info)) } {
        Some(&at) => now.saturating_sub(at) < config().summary_hot_ns,
        None => false,
    }
}

#[inline(always)]
fn hot_thread(pid_tgid: u64, since: u64) -> bool {
    // SAFETY: plain value read.
    unsafe { HOT_THREADS.get(&pid_tgid) }.is_some_and(|&at| at >= since)
}

/// One in `Config::summary_sample` summarisable requests is sent whole.
#[inline(always)]
fn sampled() -> bool {
    let every = config().summary_sample;
    if every == 0 {
        return false;
    }
    let Some(p) = SUMMARY_SEEN.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: per-CPU slot, only this CPU writes it while this program runs.
    unsafe {
        *p = (*p).wrapping_add(1);
        *p % every == 0
    }
}

#[inline(always)]
fn set_flags(conn: *mut ConnInfo, set: u32, clear: u32) {
    if conn.is_null() {
        return;
    }
    // SAFETY: a `CONNS` value; a concurrent update only loses a flag (a hint: `HELD` decides).
    unsafe { (*conn).flags = ((*conn).flags & !clear) | set };
}
