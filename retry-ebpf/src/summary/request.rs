//! A request's record on a summarised connection: held, or sent whole after what its
//! connection and its thread held before it.

use core::mem::size_of;

use retry_common::{
    CONN_COUNTED, CONN_ENTRY, CONN_HELD, CONN_QUIET, ConnKey, DataHeader, HELD_BYTES, data_flags,
    role,
};

use super::{
    Io, NO_CONN,
    bytes::starts_request,
    held::{Direct, held_elsewhere, hold, hold_on, hold_user, release_entry},
    hot_peer, release,
};
use crate::{
    config::config,
    emit::{Src, header},
    maps::{SUMMARY_SEEN, THREAD_HELD, ThreadHeld},
};

#[inline(always)]
pub(super) fn request(io: &Io<'_>) {
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
    let (ret, total) = io.io;
    // What decides whether it is held, but its bytes.
    let shape = io.key.fd == info.fd && total <= HELD_BYTES as u64;
    let allowed = || {
        !(info.role == role::CLIENT && hot_peer(info, io.ts.0))
            // Go request contexts are never held: this thread's goroutine context is 0.
            && crate::uprobes::go::context(io.pid_tgid) == 0
    };
    let header_of = |got: u64| {
        header(
            io.pid_tgid,
            info,
            io.sc,
            (0, flags),
            (got, ret, total),
            io.ts,
        )
    };
    // A request in one buffer, as most are, is read from user memory into its connection's
    // entry, once it has one.
    let mut direct = Direct::Untried;
    if let Src::Flat(src) = io.src
        && info.flags & CONN_ENTRY != 0
        && shape
        && total <= u64::from(config().payload_bytes)
    {
        direct = if allowed() {
            hold_user(&own, src, total, || header_of(total), || !sampled())
        } else {
            Direct::Whole
        };
    }
    if direct == Direct::Held {
        held_now(io, own, t, prior);
        return;
    }
    let Some((buf, got)) = io.copy() else {
        return;
    };
    // SAFETY: the first slot's payload holds `got` bytes.
    let holdable = direct == Direct::Untried
        && shape
        && got == total
        && unsafe { starts_request(buf.add(size_of::<DataHeader>()), got) };
    // SAFETY: slot 0 of the scratch holds `got` ≤ HELD_BYTES bytes of payload.
    if holdable
        && allowed()
        && !sampled()
        && unsafe { hold(&own, header_of(got), buf.add(size_of::<DataHeader>()), got) }
    {
        held_now(io, own, t, prior);
        return;
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

/// Connection `own` holds the request `io` read or wrote: flagged so, the request its thread
/// (`t`) read before it (`prior`) flagged as waiting, and counted on a server thread.
#[inline(always)]
fn held_now(
    io: &Io<'_>,
    own: ConnKey,
    t: Option<*mut ThreadHeld>,
    prior: Option<(ConnKey, *mut retry_common::SummaryRecord)>,
) {
    io.set_flags(CONN_HELD | CONN_ENTRY, 0);
    if let Some((_, ph)) = prior {
        // It waited while this one was read.
        // SAFETY: a map value, valid for this program run.
        unsafe { (*ph).request.flags |= data_flags::INTERLEAVED };
    }
    if io.info.role == role::SERVER {
        hold_on(io.pid_tgid, t, own);
    }
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
