//! A connection's `HELD` entry: the request it holds, taken out when answered or sent as it
//! was (`release_entry`), and each server thread's count of what it holds (`THREAD_HELD`).

use core::{
    ffi::c_void,
    intrinsics::{AtomicOrdering, atomic_xadd},
    mem::size_of,
    ptr::{addr_of, addr_of_mut},
};

use aya_ebpf::helpers::generated;
use retry_common::{ConnKey, DataHeader, HELD_BYTES, KIND_SUMMARY, SummaryRecord, role};

use super::{NO_CONN, response::tally};
use crate::{
    emit::output,
    maps::{HELD, HELD_BLANK, THREAD_HELD, ThreadHeld},
};

/// Holds the request `h` heads (its `got` bytes at `bytes`) in connection `own`'s `HELD` entry,
/// made on its first request; false when the map is full (the request is sent as it is).
///
/// # Safety
/// `bytes` points at `got` ≤ HELD_BYTES readable bytes.
#[inline(always)]
pub(super) unsafe fn hold(own: &ConnKey, h: DataHeader, bytes: *const u8, got: u64) -> bool {
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
pub(super) fn held(key: &ConnKey) -> Option<*mut SummaryRecord> {
    let h = HELD.get_ptr_mut(key)?;
    // SAFETY: a map value, valid for this program run.
    (unsafe { (*h).kind } == KIND_SUMMARY).then_some(h)
}

/// `THREAD_HELD`'s entry of `thread` (`t`, if it has one) after it held a request on `own`.
#[inline(always)]
pub(super) fn hold_on(thread: u64, t: Option<*mut ThreadHeld>, own: ConnKey) {
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
pub(super) fn held_elsewhere(
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

/// `release` of the connection whose `HELD` entry is `h`.
#[inline(always)]
pub(super) fn release_entry(h: *mut SummaryRecord) {
    tally(h);
    // SAFETY: a map value, valid for this program run.
    if unsafe { (*h).kind } == KIND_SUMMARY {
        send_held(h);
    }
}

/// Sends the request the entry `h` holds as the record it would have been, and takes it out.
#[inline(always)]
pub(super) fn send_held(h: *mut SummaryRecord) {
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
pub(super) unsafe fn held_len(h: *const SummaryRecord) -> usize {
    // SAFETY: the caller's contract.
    let captured = unsafe { (*h).request.captured } as usize;
    (captured & (2 * HELD_BYTES - 1)).min(HELD_BYTES)
}

/// Takes the request `h` held out of its `HELD` entry (which stays for the connection's next
/// requests) and off its thread's count.
#[inline(always)]
pub(super) fn unhold(h: *mut SummaryRecord) {
    unhold_from(h, None);
}

/// `unhold`, given the `THREAD_HELD` entry of the thread that held it when the caller has it
/// (`own`: a server thread answering what it read itself), which saves looking it up again.
#[inline(always)]
pub(super) fn unhold_from(h: *mut SummaryRecord, own: Option<*mut ThreadHeld>) {
    // SAFETY: a map value, valid for this program run.
    let (server, thread) = unsafe {
        let r = &(*h).request;
        (
            r.role == role::SERVER,
            u64::from(r.pid) << 32 | u64::from(r.tid),
        )
    };
    let t = match own {
        Some(t) => Some(t),
        None if server => THREAD_HELD.get_ptr_mut(&thread),
        None => None,
    };
    if let Some(t) = t {
        // SAFETY: a map value, valid for this program run; other threads change it too.
        unsafe {
            atomic_xadd::<i64, i64, { AtomicOrdering::Relaxed }>(addr_of_mut!((*t).held), -1)
        };
    }
    // SAFETY: as above.
    unsafe { addr_of_mut!((*h).kind).write(0) };
}
