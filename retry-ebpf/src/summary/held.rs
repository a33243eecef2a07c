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

/// Connection `own`'s `HELD` entry, made on its first request; None when the map is full.
#[inline(always)]
fn entry(own: &ConnKey) -> Option<*mut SummaryRecord> {
    if let Some(s) = HELD.get_ptr_mut(own) {
        return Some(s);
    }
    // SAFETY: a map value that is never written.
    let blank = unsafe { &*HELD_BLANK.get_ptr(0)? };
    HELD.insert(own, blank, 0).ok()?;
    HELD.get_ptr_mut(own)
}

/// `got` masked for the verifier: LLVM knows got ≤ HELD_BYTES from the callers and would drop
/// a plain mask, leaving the verifier the copy's bound (4 KiB) instead, hence the opaque read.
#[inline(always)]
fn held_bound(got: u64) -> u32 {
    // SAFETY: a read of a local.
    let got = unsafe { core::ptr::read_volatile(&got) };
    (got as usize & (2 * HELD_BYTES - 1)).min(HELD_BYTES) as u32
}

/// Holds the request `h` heads (its `got` bytes at `bytes`) in connection `own`'s `HELD` entry;
/// false when the map is full (the request is sent as it is).
///
/// # Safety
/// `bytes` points at `got` ≤ HELD_BYTES readable bytes.
#[inline(always)]
pub(super) unsafe fn hold(own: &ConnKey, h: DataHeader, bytes: *const u8, got: u64) -> bool {
    let Some(slot) = entry(own) else {
        return false;
    };
    // SAFETY: a map value, valid for this program run. `kind` is written last: what another
    // CPU finds held is whole (stores are not reordered on x86-64, the only target the
    // programs are built for).
    unsafe {
        addr_of_mut!((*slot).request).write(h);
        if generated::bpf_probe_read_kernel(
            addr_of_mut!((*slot).bytes) as *mut c_void,
            held_bound(got),
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

/// What [`hold_user`] did.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Direct {
    /// The request is held.
    Held,
    /// It goes as it is: its bytes do not start a request (a body, a preface, another
    /// protocol), or `keep` said so.
    Whole,
    /// Not tried, or the read failed: the copy through the scratch decides.
    Untried,
}

/// `hold`, reading the request's `got` bytes from user memory at `src` straight into the
/// connection's entry (one copy instead of two: user memory → scratch → entry), when they
/// start a request (`header` makes its record's header) and `keep` says it is held. Only into
/// an entry the connection has (it held before, `CONN_ENTRY`): one is never made for bytes not
/// known to be a request, so connections that never hold (other protocols) take no `HELD`
/// entry and no second copy. Untried when there is none, or it holds a request already (its
/// `CONN_HELD` flag was lost to a concurrent update: reading into it would spoil that
/// request's bytes).
///
/// The entry's request names the route of the exchanges it counted (`weight`, sent as a
/// tally): what is read into it and not held is still a request with its own header (a tally
/// going now names that one, as it would a held one that followed them), or it is not, and
/// the entry names none (`captured` 0: its counts go on no route).
#[inline(always)]
pub(super) fn hold_user(
    own: &ConnKey,
    src: u64,
    got: u64,
    header: impl FnOnce() -> DataHeader,
    keep: impl FnOnce() -> bool,
) -> Direct {
    let Some(slot) = HELD.get_ptr_mut(own) else {
        return Direct::Untried;
    };
    // SAFETY: a map value, valid for this program run; the helper checks the user address
    // and fails cleanly. The bytes are written before `kind` says the entry holds them.
    unsafe {
        if (*slot).kind == KIND_SUMMARY {
            return Direct::Untried;
        }
        let n = held_bound(got);
        let read = generated::bpf_probe_read_user(
            addr_of_mut!((*slot).bytes) as *mut c_void,
            n,
            src as *const c_void,
        );
        // A failed read zeroes what it was to fill.
        if read != 0
            || !super::bytes::starts_request(addr_of!((*slot).bytes) as *const u8, u64::from(n))
        {
            addr_of_mut!((*slot).request.captured).write(0);
            return if read != 0 {
                Direct::Untried
            } else {
                Direct::Whole
            };
        }
        addr_of_mut!((*slot).request).write(header());
        if !keep() {
            return Direct::Whole;
        }
        addr_of_mut!((*slot).kind).write(KIND_SUMMARY);
    }
    Direct::Held
}
