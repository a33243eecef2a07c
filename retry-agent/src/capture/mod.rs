//! Stage 1: load and attach the eBPF programs, read the ring buffer, decode raw records into
//! owned [`Event`]s. The only stage that talks to the kernel.
pub mod event;

pub use event::{
    ConnEvent, ConnEventKind, ConnId, DataEvent, Direction, Event, ProcessInfo, Role, Syscall, Tuple,
};

/// The eBPF object embedded at build time (empty when built without `cargo xtask build-ebpf`).
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/retry-ebpf.o"));

pub mod trace;
