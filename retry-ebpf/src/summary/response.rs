//! An answer's first record decides on its held request: summarised, counted or released;
//! and what is counted goes as a tally.

use core::{ffi::c_void, mem::size_of, ptr::addr_of_mut};

use aya_ebpf::helpers::generated;
use retry_common::{
    CONN_COUNTED, CONN_HELD, CONN_QUIET, DataHeader, KIND_TALLY, SUMMARY_HEAD, SummaryRecord, role,
};

use super::{
    Io, NO_CONN,
    bytes::status_of,
    held::{held, held_elsewhere, held_len, release_entry, unhold_from},
    hot_thread, mark_failed, release,
};
use crate::{
    config::config,
    emit::{copy_payload, count_drop, header, output, ring_flags},
    maps::{EVENTS, SCRATCH, THREAD_HELD},
};

/// Bytes of an answer read to decide on its held request: "HTTP/1.1 200".
const STATUS_LINE: u64 = 12;

#[inline(always)]
pub(super) fn response(io: &Io<'_>) {
    let (info, own) = (io.info, io.own());
    // Looked up once: what follows reads it (a lookup is ~50 ns, a busy server's answer made
    // five before).
    let own_h = if info.flags & CONN_HELD != 0 {
        held(&own)
    } else {
        None
    };
    // This thread's `THREAD_HELD` entry when the request answered is one it held itself.
    let mut mine_t = None;
    if info.role == role::SERVER
        && let Some(tp) = THREAD_HELD.get_ptr_mut(&io.pid_tgid)
    {
        // SAFETY: a map value, valid for this program run; only this thread writes `conn`.
        let t = unsafe { &mut *tp };
        // SAFETY: a map value, valid for this program run.
        let mine = own_h.is_some_and(|h| unsafe { (*h).request.tid } == io.pid_tgid as u32);
        if mine {
            mine_t = Some(tp);
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
                    unhold_from(h, mine_t);
                    io.set_flags(CONN_QUIET | CONN_COUNTED, 0);
                } else {
                    summarize(h, io, status);
                    unhold_from(h, mine_t);
                    io.set_flags(CONN_QUIET, CONN_COUNTED);
                }
                return;
            }
            // Its tally goes with it: the connection's counts are sent.
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
pub(super) fn tally(h: *mut SummaryRecord) {
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
