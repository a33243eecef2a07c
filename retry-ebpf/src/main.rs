//! Kernel side of retry-agent: syscall and TCP-state tracepoints (and, opt-in, TLS uprobes) that
//! turn socket I/O of TCP connections into ring-buffer records (`retry_common`).
//!
//! Programs are thin: `ra_*` entry points call `try_*` functions and ignore their errors (a failed
//! helper call must never affect the traced process; lost records are counted in `DROPS`).
//!
//! Filtering is the cost lever: every read/write on the node costs one hash lookup in `CONNS`
//! (tracked TCP fds) at entry; only tracked fds save arguments and produce records.
//!
//! Where a program is attached is written once, in its attribute, and userspace derives the
//! attachment from the object's sections (`capture/programs.rs`):
//! - `#[tracepoint(category = "...", name = "...")]`: attached to that tracepoint.
//! - `#[uprobe(path = "<target>", function = "<symbol>[,<symbol>…]")]` (and `#[uretprobe]`): a
//!   family of uprobes that userspace attaches per file of `<target>` (`libssl`: capture/tls.rs).
//!   A new family (say Go's crypto/tls) is a module under `uprobes/` with its own target name,
//!   and a matching target on the userspace side; an unknown target fails the load loudly.
//!
//! Module map:
//! - `maps`: every map, and the kernel-only values stored in them.
//! - `config`: the settings userspace writes (`CONFIG`), and the "is this the agent?" check.
//! - `ctx`: tracepoint argument access, time, user and kernel memory reads (BTF offsets).
//! - `emit`: records into the ring buffer (data records with their payload prefix, connection
//!   records), wakeup policy, drop counting.
//! - `syscalls::io`: read/write and friends, sendfile/splice: the data records.
//! - `syscalls::conn`: connect, accept/accept4, close: which fds are tracked TCP connections.
//! - `syscalls::fd`: fd-reuse hygiene (openat/socket/dup*): a reused fd number is forgotten.
//! - `syscalls::fork`: sockets inherited across fork (accept in a parent, serve in the child):
//!   handed over at `sched_process_fork`, adopted at the child's first return from the fork.
//! - `sock`: `sock:inet_sock_set_state`: tuples, established, failed and reset connections.
//! - `sched`: process exit and exec.
//! - `summary`: `--capture-summarize`, quiet HTTP/1 exchanges sent as one summary record.
//! - `uprobes::libssl`: OpenSSL SSL_read/SSL_write plaintext.
//!
//! A second object, `retry-steer` (`steer/main.rs`), holds the shim's kernel steering (cgroup
//! connect and sockops programs); only the shim loads it.
#![no_std]
#![no_main]
// `summary` counts a thread's held requests with an atomic add (`core::sync::atomic` has no RMW on
// this target; the kernel's XADD is what the intrinsic lowers to).
#![feature(core_intrinsics)]
#![allow(internal_features)]

mod config;
mod ctx;
mod emit;
mod maps;
mod sched;
mod sock;
mod summary;
mod syscalls;
mod uprobes;

use core::mem::size_of;

use retry_common::{
    Config, ConnInfo, ConnKey, ConnRecord, DataHeader, DataRecord, MAX_PAYLOAD, PeerKey,
    ProcessExitRecord, ServerEst, SockOwner,
};

// Both sides must agree on layouts; retry-common's tests pin them for the host, these for BPF.
const _: () = assert!(size_of::<DataHeader>() == 120);
const _: () = assert!(size_of::<DataRecord>() == 120 + MAX_PAYLOAD);
// Data records are assembled in `Scratch` (per-CPU): 4 KiB of payload does not fit the 512 B stack.
const _: () = assert!(
    size_of::<maps::Scratch>()
        == retry_common::H2_RECORDS as usize * (120 + MAX_PAYLOAD) + MAX_PAYLOAD
);
const _: () = assert!(size_of::<ConnRecord>() == 112);
const _: () = assert!(size_of::<retry_common::GoGrpcOffsets>() == 24);
const _: () = assert!(size_of::<ProcessExitRecord>() == 32);
const _: () = assert!(size_of::<ConnKey>() == 8);
const _: () = assert!(size_of::<ConnInfo>() == 72);
const _: () = assert!(size_of::<SockOwner>() == 72);
const _: () = assert!(size_of::<PeerKey>() == 20);
const _: () = assert!(size_of::<ServerEst>() == 48);
const _: () = assert!(size_of::<Config>() == 128);
const _: () =
    assert!(size_of::<retry_common::SummaryRecord>() == 8 + 2 * 120 + retry_common::HELD_BYTES);

/// errno values the programs report or compare with.
mod errno {
    pub const ECONNRESET: i64 = 104;
    pub const EPIPE: i64 = 32;
    pub const EINPROGRESS: i64 = 115;
    pub const ECONNREFUSED: i32 = 111;
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
