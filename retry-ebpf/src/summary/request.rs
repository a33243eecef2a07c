//! A request's record on a summarised connection: held, or sent whole after what its
//! connection and its thread held before it.

use core::mem::size_of;

use retry_common::{CONN_COUNTED, CONN_HELD, CONN_QUIET, DataHeader, HELD_BYTES, data_flags, role};

use super::{
    Io, NO_CONN,
    bytes::starts_request,
    held::{held_elsewhere, hold, hold_on, release_entry},
    hot_peer, release,
};
use crate::{
    config::config,
    emit::header,
    maps::{SUMMARY_SEEN, THREAD_HELD},
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
