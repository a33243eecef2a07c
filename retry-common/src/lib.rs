//! Types shared by kernel (retry-ebpf) and userspace (retry-agent).
//!
//! Everything here is `#[repr(C)]` and `Copy`, with explicit padding so both sides agree on the
//! layout byte for byte; `tests` pins sizes and offsets.
#![no_std]

/// Upper bound on the payload prefix one event carries. The configured capture size
/// (`CaptureConfig::payload_bytes`) is clamped to this.
pub const MAX_PAYLOAD: usize = 4096;

/// Kind tag, first field of every ring-buffer record so userspace can dispatch.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Data = 1,
    Conn = 2,
    ProcessExit = 3,
}

/// Placeholder proving the build path; the capture work replaces it with the real records.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Probe {
    pub pid: u32,
    pub tid: u32,
    pub ts_ns: u64,
}

#[cfg(feature = "user")]
// SAFETY: Probe is repr(C), Copy, and has no padding or pointers.
unsafe impl aya::Pod for Probe {}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn probe_layout() {
        assert_eq!(size_of::<Probe>(), 16);
        assert_eq!(offset_of!(Probe, ts_ns), 8);
    }
}
