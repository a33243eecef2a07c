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

mod bytes;
mod held;
mod request;
mod response;

use retry_common::{
    CONN_COUNTED, CONN_H2, ConnInfo, ConnKey, KIND_SUMMARY, PeerKey, config_flags, role, syscall,
};

use self::{
    held::{release_entry, send_held},
    request::request,
    response::{response, tally},
};
use crate::{
    config::config,
    emit::{Src, copy_data, emit_data, send_data},
    maps::{HELD, HOT_PEERS, HOT_THREADS, LAST_FAIL, SCRATCH},
};

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

    /// What the connection counted and did not send goes before a record sent whole. Read from
    /// the connection's live flags, not the syscall's copy: counts this run already sent (a
    /// failed answer releasing its entry) cleared the flag there, and need no second lookup.
    #[inline(always)]
    fn release_counted(&self) {
        if self.flags() & CONN_COUNTED != 0 {
            release(&self.own());
            self.set_flags(0, CONN_COUNTED);
        }
    }

    /// The connection's flags as they are now (`set_flags` writes them), the copy's if there is
    /// no `CONNS` value.
    #[inline(always)]
    fn flags(&self) -> u32 {
        if self.conn.is_null() {
            return self.info.flags;
        }
        // SAFETY: a `CONNS` value, valid for this program run.
        unsafe { (*self.conn).flags }
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

/// `ThreadHeld::conn` when the thread holds nothing.
const NO_CONN: ConnKey = ConnKey {
    tgid: 0,
    fd: u32::MAX,
};

/// Sends the tally of the quiet exchanges connection `key` counted and did not send, then the
/// request it holds, if any: what comes next on the connection (a close, a reset, a record
/// sent whole) must find them before it.
#[inline(always)]
pub fn release(key: &ConnKey) {
    if let Some(h) = HELD.get_ptr_mut(key) {
        release_entry(h);
    }
}

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
    if let Some(last) = LAST_FAIL.get_ptr_mut(0) {
        // SAFETY: a map value; two CPUs failing at once may leave the older stamp of the two
        // (a few nanoseconds apart), never one older than both marks' own.
        unsafe {
            if *last < now {
                *last = now;
            }
        }
    }
}

/// When any call on this node last failed: 0 when none has, `u64::MAX` (ask the maps) if the
/// slot cannot be read.
#[inline(always)]
fn last_fail() -> u64 {
    LAST_FAIL.get(0).copied().unwrap_or(u64::MAX)
}

#[inline(always)]
fn peer(info: &ConnInfo) -> PeerKey {
    PeerKey {
        family: info.tuple.family,
        port: info.tuple.rport,
        addr: info.tuple.raddr,
    }
}

/// Whether the destination of `info` failed a call within `Config::summary_hot_ns` of `now`.
#[inline(always)]
fn hot_peer(info: &ConnInfo, now: u64) -> bool {
    let hot_ns = config().summary_hot_ns;
    if now.saturating_sub(last_fail()) >= hot_ns {
        return false;
    }
    // SAFETY: plain value read.
    match unsafe { HOT_PEERS.get(&peer(info)) } {
        Some(&at) => now.saturating_sub(at) < hot_ns,
        None => false,
    }
}

/// Whether a call of thread `pid_tgid` failed at or after `since`.
#[inline(always)]
fn hot_thread(pid_tgid: u64, since: u64) -> bool {
    if last_fail() < since {
        return false;
    }
    // SAFETY: plain value read.
    unsafe { HOT_THREADS.get(&pid_tgid) }.is_some_and(|&at| at >= since)
}
