//! `--capture-summarize`: a quiet HTTP/1 exchange leaves the kernel as one `SummaryRecord`
//! instead of its request's and response's records.
//!
//! A request record that starts with a common method and was captured whole is held in `HELD`
//! (per connection) instead of being sent. The response's first record decides: a 2xx or 3xx
//! status line, on a connection whose request nothing made interesting, sends the summary (the
//! two headers, the status and the request as held) and leaves the rest of that response out
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
//! (a second request record, a close, a reset, a response that is not summarised). Nor is
//! what userspace reads from the order of a server thread's messages: a server thread that
//! reads a request while it holds others (an event loop reading ahead) keeps them held, and
//! the new one and the one it read last are flagged `data_flags::INTERLEAVED` (every earlier
//! one was flagged when the next was read): what l7's one-request-per-thread reading
//! (`sole_on_thread`) would have learnt from the order. A request sent whole goes after the
//! one the thread held last (unflagged if that was the only one: the order says it); so does
//! an answer to a request the thread did not hold. `THREAD_HELD` keeps each server thread's
//! last held request and how many it holds. A client's calls need no order among themselves:
//! a summary carries its request whole (up to `HELD_BYTES`), so a hedge's twin summarised
//! matches the one given up, and `correlate` takes an attempt reported after the one that
//! followed it (its out-of-order hedge).
//!
//! With `Config::summary_every` N > 1 a connection's quiet exchanges are counted in its `HELD`
//! entry (`weight`) and one in N is sent, weighted with those counted before it, while its last
//! record is within `Config::summary_window_ns` (`counted`); what is counted goes before
//! anything else of the connection, as a tally (`tally`, from `release` and `close`; a
//! connection with counts is flagged `CONN_COUNTED`, so a record sent whole finds them without a
//! lookup).
//!
//! What is given up is what a summarised response's own bytes would say: its headers and its
//! size past its first record; and, counted, what its times and threads would.
use core::{
    ffi::c_void,
    intrinsics::{AtomicOrdering, atomic_xadd},
    mem::size_of,
    ptr::{addr_of, addr_of_mut},
};

use aya_ebpf::helpers::generated;
use retry_common::{
    CONN_COUNTED, CONN_H2, CONN_HELD, CONN_QUIET, ConnInfo, ConnKey, DataHeader, HELD_BYTES,
    KIND_SUMMARY, KIND_TALLY, PeerKey, SUMMARY_HEAD, SummaryRecord, config_flags, data_flags, role,
    syscall,
};

use crate::{
    config::config,
    emit::{
        Src, copy_data, copy_payload, count_drop, emit_data, header, output, ring_flags, send_data,
    },
    maps::{
        EVENTS, HELD, HELD_BLANK, HOT_PEERS, HOT_THREADS, SCRATCH, SUMMARY_SEEN, THREAD_HELD,
        ThreadHeld,
    },
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

/// One data syscall on a tracked connection, as the programs saw it.
pub struct Io<'a> {
    pub pid_tgid: u64,
    /// The fd it was made on (an alias's own).
    pub key: &'a ConnKey,
    /// The connection's `CONNS` value (its flags are updated) and a copy of it.
    pub conn: *mut ConnInfo,
    pub info: &'a ConnInfo,
    pub sc: u32,
    pub src: Src,
    /// Return value, bytes moved.
    pub io: (i64, u64),
    pub ts: (u64, u64),
}

impl Io<'_> {
    /// The connection under the fd it was opened as (what `HELD` is keyed by).
    #[inline(always)]
    fn own(&self) -> ConnKey {
        ConnKey {
            tgid: self.key.tgid,
            fd: self.info.fd,
        }
    }

    #[inline(always)]
    fn emit(&self) {
        emit_data(
            self.pid_tgid,
            self.key,
            self.info,
            self.sc,
            self.src,
            self.io,
            self.ts,
        );
    }

    /// Its bytes into the scratch slots: where they start, how many.
    #[inline(always)]
    fn copy(&self) -> Option<(*mut u8, u64)> {
        let got = copy_data(self.key, self.info, self.sc, self.src, self.io.1);
        let buf = SCRATCH.get_ptr_mut(0)? as *mut u8;
        Some((buf, got))
    }

    /// The records of the `got` bytes `copy` left, as `emit_data` sends them.
    #[inline(always)]
    fn send(&self, got: u64, flags: u16) {
        send_data(
            self.pid_tgid,
            self.info,
            (self.sc, flags),
            got,
            self.io,
            self.ts,
        );
    }

    /// What the connection counted and did not send goes before a record sent whole.
    #[inline(always)]
    fn release_counted(&self) {
        if self.info.flags & CONN_COUNTED != 0 {
            release(&self.own());
            self.set_flags(0, CONN_COUNTED);
        }
    }

    #[inline(always)]
    fn set_flags(&self, set: u32, clear: u32) {
        if self.conn.is_null() {
            return;
        }
        // SAFETY: a `CONNS` value; a concurrent update only loses a flag (a hint: `HELD`
        // decides).
        unsafe { (*self.conn).flags = ((*self.conn).flags & !clear) | set };
    }
}

/// The records of one data syscall on a tracked connection: summarised, held or sent as
/// `emit_data` sends them.
#[inline(always)]
pub fn data(io: &Io<'_>) {
    let info = io.info;
    if config().flags & config_flags::SUMMARIZE == 0
        || info.flags & CONN_H2 != 0
        || info.role == role::UNKNOWN
    {
        io.emit();
    } else if role::carries_response(info.role, syscall::is_egress(io.sc)) {
        response(io);
    } else {
        request(io);
    }
}

#[inline(always)]
fn request(io: &Io<'_>) {
    let (info, own) = (io.info, io.own());
    if info.flags & (CONN_HELD | CONN_QUIET) != 0 {
        io.set_flags(0, CONN_HELD | CONN_QUIET);
        if info.flags & CONN_HELD != 0 {
            // More of the request (a body after its head), or a pipeline: both go whole.
            release(&own);
            io.set_flags(0, CONN_COUNTED);
            io.emit();
            return;
        }
    }
    let thread = io.pid_tgid;
    let server = info.role == role::SERVER;
    // Clients' calls are not ordered among themselves (see the module's header).
    let t = if server {
        THREAD_HELD.get_ptr_mut(&thread)
    } else {
        None
    };
    // The request this server thread holds for another connection, read last.
    let prior = held_elsewhere(t, &own);
    // A server thread that holds requests (the last read, `prior`, or earlier ones) serves
    // this one among them: flagged, as they are, since userspace sees held ones late.
    // SAFETY: a map value, valid for this program run; `held` is read as a hint (an answer
    // elsewhere may take one meanwhile).
    let interleaved = server && t.is_some_and(|t| unsafe { (*t).held } > 0);
    let flags = if interleaved {
        data_flags::INTERLEAVED
    } else {
        0
    };
    let Some((buf, got)) = io.copy() else {
        return;
    };
    let (ret, total) = io.io;
    // SAFETY: the first slot's payload holds `got` bytes.
    let holdable = io.key.fd == info.fd
        && got == total
        && got <= HELD_BYTES as u64
        && unsafe { starts_request(buf.add(size_of::<DataHeader>()), got) };
    if holdable
        && !(info.role == role::CLIENT && hot_peer(info, io.ts.0))
        && crate::uprobes::go::context(io.pid_tgid) == 0
        && !sampled()
    {
        // Go request contexts are never held: this thread's goroutine context is 0.
        let h = header(
            io.pid_tgid,
            info,
            io.sc,
            (0, flags),
            (got, ret, total),
            io.ts,
        );
        // SAFETY: slot 0 of the scratch holds `got` ≤ HELD_BYTES bytes of payload.
        if unsafe { hold(&own, h, buf.add(size_of::<DataHeader>()), got) } {
            io.set_flags(CONN_HELD, 0);
            if let Some((_, ph)) = prior {
                // It waited while this one was read.
                // SAFETY: a map value, valid for this program run.
                unsafe { (*ph).request.flags |= data_flags::INTERLEAVED };
            }
            if server {
                hold_on(thread, t, own);
            }
            return;
        }
    }
    if let Some(t) = t {
        // Sent whole: what the thread read before it goes first, in its place (unflagged if
        // it was alone: userspace sees the two reads in their order).
        if let Some((_, ph)) = prior {
            release_entry(ph);
        }
        // SAFETY: a map value, valid for this program run; only this thread writes `conn`.
        unsafe { (*t).conn = NO_CONN };
    }
    io.release_counted();
    io.send(got, flags);
}

/// Holds the request `h` heads (its `got` bytes at `bytes`) in connection `own`'s `HELD` entry,
/// made on its first request; false when the map is full (the request is sent as it is).
///
/// # Safety
/// `bytes` points at `got` ≤ HELD_BYTES readable bytes.
#[inline(always)]
unsafe fn hold(own: &ConnKey, h: DataHeader, bytes: *const u8, got: u64) -> bool {
    let slot = match HELD.get_ptr_mut(own) {
        Some(s) => s,
        None => {
            let Some(blank) = HELD_BLANK.get_ptr(0) else {
                return false;
            };
            // SAFETY: a map value that is never written.
            if HELD.insert(own, unsafe { &*blank }, 0).is_err() {
                return false;
            }
            let Some(s) = HELD.get_ptr_mut(own) else {
                return false;
            };
            s
        }
    };
    // SAFETY: a map value, valid for this program run; the mask restates got ≤ HELD_BYTES for
    // the verifier. `kind` is written last: what another CPU finds held is whole (stores are
    // not reordered on x86-64, the only target the programs are built for).
    unsafe {
        addr_of_mut!((*slot).request).write(h);
        // Read back opaquely: LLVM knows got ≤ HELD_BYTES from the caller and would drop the
        // mask, leaving the verifier the copy's bound (4 KiB) instead.
        let got = core::ptr::read_volatile(&got);
        let n = (got as usize & (2 * HELD_BYTES - 1)).min(HELD_BYTES);
        if generated::bpf_probe_read_kernel(
            addr_of_mut!((*slot).bytes) as *mut c_void,
            n as u32,
            bytes as *const c_void,
        ) != 0
        {
            return false;
        }
        addr_of_mut!((*slot).kind).write(KIND_SUMMARY);
    }
    true
}

/// Connection `key`'s `HELD` entry if it holds a request now.
#[inline(always)]
fn held(key: &ConnKey) -> Option<*mut SummaryRecord> {
    let h = HELD.get_ptr_mut(key)?;
    // SAFETY: a map value, valid for this program run.
    (unsafe { (*h).kind } == KIND_SUMMARY).then_some(h)
}

/// `THREAD_HELD`'s entry of `thread` (`t`, if it has one) after it held a request on `own`.
#[inline(always)]
fn hold_on(thread: u64, t: Option<*mut ThreadHeld>, own: ConnKey) {
    match t {
        Some(t) => {
            // SAFETY: a map value, valid for this program run; `held` is shared with other
            // threads' answers, hence the atomic add.
            unsafe {
                (*t).conn = own;
                if (*t).held < 0 {
                    (*t).held = 0;
                }
                atomic_xadd::<i64, i64, { AtomicOrdering::Relaxed }>(addr_of_mut!((*t).held), 1);
            }
        }
        None => {
            let entry = ThreadHeld { conn: own, held: 1 };
            let _ = THREAD_HELD.insert(&thread, &entry, 0);
        }
    }
}

/// The connection of the request `t`'s thread holds and read last, and its `HELD` entry, if
/// that is not `own` and it is still held.
#[inline(always)]
fn held_elsewhere(
    t: Option<*mut ThreadHeld>,
    own: &ConnKey,
) -> Option<(ConnKey, *mut SummaryRecord)> {
    let t = t?;
    // SAFETY: a map value, valid for this program run.
    let conn = unsafe { (*t).conn };
    if conn == NO_CONN || conn == *own {
        return None;
    }
    held(&conn).map(|h| (conn, h))
}

#[inline(always)]
fn response(io: &Io<'_>) {
    let (info, own) = (io.info, io.own());
    // Looked up once: what follows reads it (a lookup is ~50 ns, a busy server's answer made
    // five before).
    let own_h = if info.flags & CONN_HELD != 0 {
        held(&own)
    } else {
        None
    };
    if info.role == role::SERVER
        && let Some(t) = THREAD_HELD.get_ptr_mut(&io.pid_tgid)
    {
        // SAFETY: a map value, valid for this program run; only this thread writes `conn`.
        let t = unsafe { &mut *t };
        // SAFETY: a map value, valid for this program run.
        let mine = own_h.is_some_and(|h| unsafe { (*h).request.tid } == io.pid_tgid as u32);
        if mine {
            // This answer's own request is one the thread held: one it held of another
            // connection since was flagged with it when read (and it when the next was), so
            // userspace needs no order and that one stays held. `conn` may be left naming a
            // connection no longer held: `held_elsewhere` checks.
            if t.conn == own {
                t.conn = NO_CONN;
            }
        } else {
            // What this thread holds of another connection came before this answer.
            if let Some((_, ph)) = held_elsewhere(Some(t), &own) {
                release_entry(ph);
            }
            t.conn = NO_CONN;
        }
    }
    if info.flags & CONN_HELD == 0 {
        if info.flags & CONN_QUIET != 0 {
            // The rest of a summarised response, unless a new one starts (a 408 a server sends
            // on an idle keep-alive connection before closing it): that one is sent.
            let peeked = copy_payload(io.src, STATUS_LINE.min(io.io.1));
            let Some(buf) = SCRATCH.get_ptr_mut(0) else {
                return;
            };
            // SAFETY: the first slot's payload holds `peeked` bytes.
            if unsafe { status_of((buf as *const u8).add(size_of::<DataHeader>()), peeked) } == 0 {
                return;
            }
            io.set_flags(0, CONN_QUIET);
        }
        if io.key.fd != info.fd {
            // An alias answering what the fd it was opened as read (never held, but cheap to
            // make sure: aliases are rare).
            release(&own);
        }
    }
    if info.flags & CONN_HELD != 0 {
        io.set_flags(0, CONN_HELD);
        if let Some(h) = own_h {
            // The status line alone decides: a summarised answer's other bytes are never
            // copied (a 1 KiB prefix was a fifth of nginx's eBPF time per request).
            let peeked = copy_payload(io.src, STATUS_LINE.min(io.io.1));
            // SAFETY: the first slot's payload holds `peeked` bytes; `h` is a map value, valid
            // for this program run.
            let (status, generation, start) = unsafe {
                let buf = SCRATCH
                    .get_ptr_mut(0)
                    .map_or(core::ptr::null_mut(), |b| b as *mut u8);
                let status = if buf.is_null() {
                    0
                } else {
                    status_of(buf.add(size_of::<DataHeader>()), peeked)
                };
                (status, (*h).request.generation, (*h).request.ts_enter_ns)
            };
            let quiet = (200..400).contains(&status)
                && generation == info.generation
                && (info.role == role::CLIENT || !hot_thread(io.pid_tgid, start));
            if quiet {
                if counted(h, io.ts.1) {
                    unhold(h);
                    io.set_flags(CONN_QUIET | CONN_COUNTED, 0);
                } else {
                    summarize(h, io, status);
                    unhold(h);
                    io.set_flags(CONN_QUIET, CONN_COUNTED);
                }
                return;
            }
            release_entry(h);
            io.set_flags(0, CONN_COUNTED);
        }
    }
    io.release_counted();
    let Some((buf, got)) = io.copy() else {
        return;
    };
    // SAFETY: the first slot's payload holds `got` bytes.
    let status = unsafe { status_of(buf.add(size_of::<DataHeader>()), got) };
    if info.role == role::CLIENT && status >= 400 {
        mark_failed(io.pid_tgid, info, io.ts.0);
    }
    io.send(got, 0);
}

/// Sends the tally of the quiet exchanges connection `key` counted and did not send, then the
/// request it holds, if any: what comes next on the connection (a close, a reset, a record
/// sent whole) must find them before it.
#[inline(always)]
pub fn release(key: &ConnKey) {
    if let Some(h) = HELD.get_ptr_mut(key) {
        release_entry(h);
    }
}

/// `release` of the connection whose `HELD` entry is `h`.
#[inline(always)]
fn release_entry(h: *mut SummaryRecord) {
    tally(h);
    // SAFETY: a map value, valid for this program run.
    if unsafe { (*h).kind } == KIND_SUMMARY {
        send_held(h);
    }
}

/// Sends the request the entry `h` holds as the record it would have been, and takes it out.
#[inline(always)]
fn send_held(h: *mut SummaryRecord) {
    // SAFETY: a map value of `size_of::<SummaryRecord>()` bytes, valid for this program run,
    // whose request record (header, then bytes) starts at `request`.
    unsafe {
        let size = size_of::<DataHeader>() + held_len(h);
        output(core::slice::from_raw_parts(
            addr_of!((*h).request) as *const u8,
            size,
        ));
    }
    unhold(h);
}

/// How many request bytes the entry `h` holds, the mask restating captured ≤ HELD_BYTES for
/// the verifier.
///
/// # Safety
/// `h` is a `HELD` value, valid for this program run.
#[inline(always)]
unsafe fn held_len(h: *const SummaryRecord) -> usize {
    // SAFETY: the caller's contract.
    let captured = unsafe { (*h).request.captured } as usize;
    (captured & (2 * HELD_BYTES - 1)).min(HELD_BYTES)
}

/// Takes the request `h` held out of its `HELD` entry (which stays for the connection's next
/// requests) and off its thread's count.
#[inline(always)]
fn unhold(h: *mut SummaryRecord) {
    // SAFETY: a map value, valid for this program run.
    let (server, thread) = unsafe {
        let r = &(*h).request;
        (
            r.role == role::SERVER,
            u64::from(r.pid) << 32 | u64::from(r.tid),
        )
    };
    if server && let Some(t) = THREAD_HELD.get_ptr_mut(&thread) {
        // SAFETY: a map value, valid for this program run; other threads change it too.
        unsafe {
            atomic_xadd::<i64, i64, { AtomicOrdering::Relaxed }>(addr_of_mut!((*t).held), -1)
        };
    }
    // SAFETY: as above.
    unsafe { addr_of_mut!((*h).kind).write(0) };
}

/// Bytes of an answer read to decide on its held request: "HTTP/1.1 200".
const STATUS_LINE: u64 = 12;
/// `ThreadHeld::conn` when the thread holds nothing.
const NO_CONN: ConnKey = ConnKey {
    tgid: 0,
    fd: u32::MAX,
};

/// With `--capture-summarize`: what a reset or close of connection `key` must send first.
#[inline(always)]
pub fn release_if_on(key: &ConnKey) {
    if config().flags & config_flags::SUMMARIZE != 0 {
        release(key);
    }
}

/// Connection `key` (the fd it was opened as, `info`) closes: what it counted and held goes
/// first, and its `HELD` entry goes. A client closing on a request that got no answer gave up
/// on it: a failure of its thread and of that destination (`mark_failed`), so what the thread
/// answers next and the retry that may follow are read whole, not counted.
#[inline(always)]
pub fn close(pid_tgid: u64, key: &ConnKey, info: &ConnInfo) {
    if config().flags & config_flags::SUMMARIZE == 0 {
        return;
    }
    // A connection that never held has no entry: no delete (a bucket lock) for it.
    let Some(h) = HELD.get_ptr_mut(key) else {
        return;
    };
    tally(h);
    // SAFETY: a map value, valid for this program run.
    if unsafe { (*h).kind } == KIND_SUMMARY {
        send_held(h);
        if info.role == role::CLIENT {
            mark_failed(pid_tgid, info, crate::ctx::now());
        }
    }
    let _ = HELD.remove(key);
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

/// Sends the summary of the exchange whose request `h` holds, its answer's first record `io`
/// showing `status`: written into the entry (which has the record's layout) and sent from
/// there at its request's size.
#[inline(always)]
fn summarize(h: *mut SummaryRecord, io: &Io<'_>, status: u32) {
    // SAFETY: a map value of `size_of::<SummaryRecord>()` bytes, valid for this program run;
    // `kind` says KIND_SUMMARY already (it holds).
    unsafe {
        // A status that made the exchange quiet (2xx/3xx) fits.
        addr_of_mut!((*h).status).write(status as u16);
        // Itself and those counted since the connection's last record.
        let weight = (*h).weight;
        addr_of_mut!((*h).weight).write(weight.saturating_add(1));
        addr_of_mut!((*h).response).write(header(
            io.pid_tgid,
            io.info,
            io.sc,
            (crate::uprobes::go::context(io.pid_tgid), 0),
            (0, io.io.0, io.io.1),
            io.ts,
        ));
        let size = SUMMARY_HEAD + held_len(h);
        output(core::slice::from_raw_parts(h as *const u8, size));
        addr_of_mut!((*h).weight).write(0);
    }
}

/// Whether the quiet exchange whose request `h` holds, answered at `now`, is counted in its
/// entry instead of sent (`Config::summary_every`): while its connection's last record
/// (`response`'s time, that of the last summary or tally; none in a new entry) is recent and
/// fewer than `summary_every - 1` wait. An interleaved one may be counted too: what its
/// overlap says of a failed request on its thread, that request says itself (the kernel
/// flags every request read while another was held, and the one held last), and a server
/// thread's answers after one of its calls failed go whole (`HOT_THREADS`).
#[inline(always)]
fn counted(h: *mut SummaryRecord, now: u64) -> bool {
    let cfg = config();
    if cfg.summary_every <= 1 {
        return false;
    }
    // SAFETY: a map value, valid for this program run.
    unsafe {
        let weight = u32::from((*h).weight);
        let last = (*h).response.ts_exit_ns;
        if last == 0
            || now.saturating_sub(last) >= cfg.summary_window_ns
            || weight + 1 >= cfg.summary_every
        {
            return false;
        }
        addr_of_mut!((*h).weight).write((weight + 1) as u16);
    }
    true
}

/// Sends what entry `h` counted and did not send as a tally: a copy of the entry, of kind
/// `KIND_TALLY` and status 0, whose `weight` says how many, timed now (which starts the
/// connection's window again). A copy, because the entry may hold the request that follows
/// them (which goes after), whose `kind` says so: its request is then that one.
#[inline(always)]
fn tally(h: *mut SummaryRecord) {
    // SAFETY: a map value of `size_of::<SummaryRecord>()` bytes, valid for this program run;
    // the ring's entry is as large, written before it is submitted.
    unsafe {
        if (*h).weight == 0 {
            return;
        }
        let now = crate::ctx::now();
        let size = size_of::<SummaryRecord>();
        let Some(mut e) = EVENTS.reserve::<SummaryRecord>(0) else {
            count_drop();
            return;
        };
        let t = e.as_mut_ptr();
        if generated::bpf_probe_read_kernel(t as *mut c_void, size as u32, h as *const c_void) != 0
        {
            e.discard(0);
            return;
        }
        addr_of_mut!((*t).kind).write(KIND_TALLY);
        addr_of_mut!((*t).status).write(0);
        addr_of_mut!((*t).response.ts_enter_ns).write(now);
        addr_of_mut!((*t).response.ts_exit_ns).write(now);
        e.submit(ring_flags(size));
        addr_of_mut!((*h).weight).write(0);
        addr_of_mut!((*h).response.ts_exit_ns).write(now);
    }
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
