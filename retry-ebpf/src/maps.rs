//! Every map of the object, in one place, with the kernel-only values stored in them. Shared
//! keys and records live in `retry_common`; userspace finds maps by the names in
//! `retry_common::names`.
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use core::mem::size_of;
use retry_common::{
    AcceptArgs, Config, ConnInfo, ConnKey, ConnectArgs, DataHeader, H2_RECORDS, MAX_PAYLOAD,
    PeerKey, ServerEst, SockOwner, SummaryRecord, arg_map,
};

/// Size is overridden by userspace (`CaptureConfig::ring_bytes`).
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 22, 0);
/// Records that did not fit in `EVENTS`.
#[map]
pub static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
/// Failed inserts into the per-thread argument maps below, by `retry_common::arg_map` slot.
#[map]
pub static ARG_FAILURES: PerCpuArray<u64> = PerCpuArray::with_max_entries(arg_map::COUNT, 0);

/// Counts a failed argument-map insert (the record of that syscall is lost) and passes the error on.
#[inline(always)]
pub fn arg_insert_failed(slot: u32, e: i32) -> i32 {
    if let Some(p) = ARG_FAILURES.get_ptr_mut(slot) {
        // SAFETY: per-CPU slot, only this CPU writes it while this program runs.
        unsafe { *p += 1 };
    }
    e
}

#[map]
pub static CONFIG: Array<Config> = Array::with_max_entries(1, 0);
/// Tracked TCP fds. LRU so a process that dies without close cannot fill it; userspace also
/// removes a process's entries when it exits.
#[map]
pub static CONNS: LruHashMap<ConnKey, ConnInfo> = LruHashMap::with_max_entries(65536, 0);
/// Tgids running the agent's executable (shims, CLI calls), filled by userspace; an entry goes
/// when its process exits or execs (`sched`), so a reused pid is never hidden.
#[map]
pub static AGENT_TGIDS: HashMap<u32, u8> = HashMap::with_max_entries(1024, 0);
/// `--capture-cgroup`: cgroup v2 ids (directory inodes) whose subtrees are observed.
#[map]
pub static SCOPE_CGROUPS: HashMap<u64, u8> = HashMap::with_max_entries(256, 0);
/// `--capture-netns`: network namespace inodes whose tasks are observed.
#[map]
pub static SCOPE_NETNS: HashMap<u32, u8> = HashMap::with_max_entries(256, 0);
/// `struct sock *` -> owner, for state changes seen outside the owner's context.
#[map]
pub static SOCKS: LruHashMap<u64, SockOwner> = LruHashMap::with_max_entries(65536, 0);
/// Server connections established but not yet accepted, by peer address.
#[map]
pub static SERVER_EST: LruHashMap<PeerKey, ServerEst> = LruHashMap::with_max_entries(16384, 0);
/// The same, by `struct sock *`, for accept() without a peer buffer (found by walking the fd).
#[map]
pub static SERVER_EST_SK: LruHashMap<u64, ServerEst> = LruHashMap::with_max_entries(16384, 0);
/// Syscall arguments by thread, between entry and exit, for the calls whose exit cannot read them
/// back (connect's socket, accept's peer buffer; data syscalls need none: `ctx::syscall_args`).
/// Plain (preallocated) hashes: an LRU insert on every traced syscall cost more; a thread that
/// dies inside a syscall has its entry removed by `ra_process_exit`, which fires for every thread.
/// Sizes are overridden by userspace (`CaptureConfig::arg_map_entries`); a full map's failed
/// inserts are counted in `ARG_FAILURES`.
#[map]
pub static CONNECT_ARGS: HashMap<u64, ConnectArgs> = HashMap::with_max_entries(8192, 0);
#[map]
pub static ACCEPT_ARGS: HashMap<u64, AcceptArgs> = HashMap::with_max_entries(8192, 0);

/// The connection a process accepted last (its fd and generation), by tgid: what a child it
/// forks next serves (accept-then-fork servers: busybox httpd, inetd, socketserver's
/// ForkingMixIn). Written at accept and adoption, removed at exit.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LastAccept {
    pub generation: u64,
    pub fd: u32,
    pub _pad: u32,
}

#[map]
pub static LAST_ACCEPT: LruHashMap<u32, LastAccept> = LruHashMap::with_max_entries(16384, 0);
/// The connection a fork handed down, by the new task's pid, from `sched_process_fork` (in the
/// parent, before the child can run) until the child's first return from the fork adopts it.
/// New threads get entries too (the tracepoint cannot tell them apart); they drop theirs there.
#[map]
pub static INHERITED: LruHashMap<u32, Inherited> = LruHashMap::with_max_entries(4096, 0);

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Inherited {
    pub info: ConnInfo,
    /// The tgid that forked (and accepted the connection).
    pub parent: u32,
    pub _pad: u32,
}

/// Bytes of one record's slot in `Scratch`: its header, then its payload.
pub const SEGMENT: usize = size_of::<DataHeader>() + MAX_PAYLOAD;
/// Kernel-only scratch in which one syscall's records are assembled (too big for the 512 B
/// stack): `H2_RECORDS` slots of `SEGMENT` bytes, each a header followed by up to MAX_PAYLOAD
/// bytes, so every record is one contiguous slice for the ring. A payload copy starts below
/// MAX_PAYLOAD in its slot and moves at most MAX_PAYLOAD bytes (what the verifier can prove):
/// the tail past the last slot keeps that inside the value.
#[repr(C)]
pub struct Scratch {
    pub buf: [u8; H2_RECORDS as usize * SEGMENT + MAX_PAYLOAD],
}

#[map]
pub static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// Where the copy of one syscall's bytes into `Scratch` stands (`emit::copy_payload`).
#[repr(C)]
pub struct CopyState {
    /// The iovec array, or the flat buffer (`flat` = 1).
    pub src: u64,
    pub flat: u64,
    pub want: u64,
    pub got: u64,
    /// The current iovec (valid while `loaded` = 1), the offset into it, the next one's index.
    pub base: u64,
    pub len: u64,
    pub off: u64,
    pub idx: u64,
    pub loaded: u64,
}

#[map]
pub static COPY: PerCpuArray<CopyState> = PerCpuArray::with_max_entries(1, 0);

/// An SSL call in progress on a thread (uprobes::libssl).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SslArgs {
    pub ssl: u64,
    pub buf: u64,
    /// `size_t *` the _ex variants write the byte count to.
    pub len_ptr: u64,
    pub ts_enter_ns: u64,
    /// The fd the call did I/O on (u32::MAX until a syscall inside it says, or the SSL object
    /// was seen before).
    pub fd: u32,
    pub kind: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct SslKey {
    pub tgid: u32,
    pub _pad: u32,
    pub ssl: u64,
}

/// SSL calls in progress, by thread. Read by the syscall programs too: the ciphertext syscalls
/// inside an SSL call are not reported.
#[map]
pub static SSL_ARGS: HashMap<u64, SslArgs> = HashMap::with_max_entries(16384, 0);
/// The fd each SSL object was last seen doing I/O on (a read served from OpenSSL's buffer makes
/// no syscall).
#[map]
pub static SSL_FDS: LruHashMap<SslKey, u32> = LruHashMap::with_max_entries(65536, 0);

/// Requests held back until their response's status decides (`summary`), by connection (the
/// tgid and the fd it was opened as): one entry per connection that held a request, reused by
/// its next ones (`SummaryRecord::kind` says whether it holds one now) and removed at close, so
/// holding and answering a request writes a value in place instead of adding and removing an
/// entry (the update and the delete, each under its bucket's lock, were a fifth of the
/// programs' time per summarised exchange). The value is the summary record the answer sends,
/// so it goes to the ring in one copy at its own size. Preallocated (8192 × 760 B, ~6 MiB of
/// kernel memory): a full map holds nothing more (that connection's requests are sent as they
/// are); userspace takes (and reports) the entries of a process that exited.
#[map]
pub static HELD: HashMap<ConnKey, SummaryRecord> = HashMap::with_max_entries(8192, 0);
/// Zeroes: what a connection's `HELD` entry starts as (a `HashMap` insert copies its value
/// from a map, not from a program's stack of 512 bytes).
#[map]
pub static HELD_BLANK: Array<SummaryRecord> = Array::with_max_entries(1, 0);
/// When a thread (pid_tgid) last saw one of its calls fail (a failure status, a reset): a
/// request it answers that started before is sent whole, so its verdict sees its own answer.
#[map]
pub static HOT_THREADS: LruHashMap<u64, u64> = LruHashMap::with_max_entries(16384, 0);
/// When a destination last answered a client on this node with a failure or reset it: its
/// exchanges are sent whole for `Config::summary_hot_ns`, so retries and their outcomes are seen.
#[map]
pub static HOT_PEERS: LruHashMap<PeerKey, u64> = LruHashMap::with_max_entries(8192, 0);
/// When any call on this node last failed (the latest stamp in `HOT_THREADS` and `HOT_PEERS`):
/// while it is older than what they are asked about, neither can answer yes, and the quiet path
/// skips their lookups (an array slot is read in place; a hash lookup is ~50 ns).
#[map]
pub static LAST_FAIL: Array<u64> = Array::with_max_entries(1, 0);
/// The connection whose request a server thread read last and the kernel holds, and how many
/// it holds, by thread (pid_tgid): a request it reads while it holds others is flagged
/// `data_flags::INTERLEAVED` (an event loop reading ahead), as userspace sees held requests
/// late, at their answers.
#[map]
pub static THREAD_HELD: LruHashMap<u64, ThreadHeld> = LruHashMap::with_max_entries(16384, 0);

/// A thread's entry in `THREAD_HELD`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ThreadHeld {
    /// The connection whose request it holds and read last (fd `u32::MAX`: none).
    pub conn: ConnKey,
    /// Requests of this thread in `HELD` (changed atomically: an answer on another thread, a
    /// close or a reset takes one). Below zero after an eviction of this entry: read as none.
    pub held: i64,
}

/// Per-CPU count of summarisable requests, for `Config::summary_sample`.
#[map]
pub static SUMMARY_SEEN: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);
