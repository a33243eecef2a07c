//! The byte tests the kernel makes on HTTP/1: a request's method, a response's status line.

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

/// Whether `p` (with `got` bytes) starts a request of a common method.
///
/// # Safety
/// `p` points at `got` readable bytes.
#[inline(always)]
pub(super) unsafe fn starts_request(p: *const u8, got: u64) -> bool {
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
pub(super) unsafe fn status_of(p: *const u8, got: u64) -> u32 {
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
