//! Stage 1: load and attach the eBPF programs, read the ring buffer, decode raw records into
//! owned [`Event`]s. The only stage that talks to the kernel.
//!
//! ```text
//! tracepoints ──RINGBUF──▶ reader task ──decode──▶ bounded mpsc ──▶ Capture::events()
//!                                 └─ /proc metadata: Event::Process once per pid, first
//! ```
//! The reader never blocks on the channel: a full channel counts a drop. Dropping [`Capture`]
//! stops the reader and detaches every program (nothing is pinned).
pub mod decode;
pub mod event;
pub mod procfs;
pub mod trace;

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    programs::{ProgramError, TracePoint},
};
use retry_common::{Config, ConnInfo, ConnKey, MAX_PAYLOAD, config_flags, names};
use tokio::{io::unix::AsyncFd, sync::mpsc, task::JoinHandle};

pub use event::{
    ConnEvent, ConnEventKind, ConnId, DataEvent, Direction, Event, ProcessInfo, Role, Syscall, Tuple,
};

/// The eBPF object embedded at build time (empty when built without `cargo xtask build-ebpf`).
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/retry-ebpf.o"));

/// Capture settings.
#[derive(clap::Args, Debug, Clone)]
pub struct CaptureConfig {
    /// Kernel ring buffer size in bytes (a power of two, at least one page).
    #[arg(long, env = "RETRY_AGENT_RING_BYTES", default_value_t = 16 << 20)]
    pub ring_bytes: u32,
    /// Payload prefix captured per syscall, in bytes (at most 4096).
    #[arg(long, env = "RETRY_AGENT_PAYLOAD_BYTES", default_value_t = retry_common::DEFAULT_PAYLOAD)]
    pub payload_bytes: u32,
    /// Capacity of the channel between the ring reader and the pipeline, in events.
    #[arg(long, env = "RETRY_AGENT_CHANNEL_CAPACITY", default_value_t = 65536)]
    pub channel_capacity: usize,
    /// Where to read process metadata and pre-existing connections.
    #[arg(long, env = "RETRY_AGENT_PROC_ROOT", default_value = "/proc")]
    pub proc_root: PathBuf,
    /// The kernel wakes the ring reader only once this many bytes wait (0: on every record,
    /// which costs an interrupt per syscall); below that the reader polls.
    #[arg(long, env = "RETRY_AGENT_RING_WAKEUP_BYTES", default_value_t = 256 << 10)]
    pub wakeup_bytes: u32,
    /// How often the reader looks at the ring without a wakeup, in milliseconds (the most a
    /// record waits when traffic is light).
    #[arg(long, env = "RETRY_AGENT_RING_POLL_MS", default_value_t = 10)]
    pub poll_ms: u64,
    /// Read TLS plaintext with uprobes on the shared OpenSSL (libssl) processes map. Off by
    /// default: every SSL_read/SSL_write then takes two uprobe traps in the calling process
    /// (`cargo xtask bench capture --tls`: a 100k req/s TLS loop on loopback ran at 0.11x with
    /// them, 0.5x with the syscall tracepoints alone); turn it on where TLS calls are not that hot.
    #[arg(long, env = "RETRY_AGENT_TLS", default_value_t = false, action = clap::ArgAction::Set)]
    pub tls: bool,
    /// libssl files to instrument (repeatable, or comma-separated in the env var); default: the
    /// distribution's usual locations that exist.
    #[arg(long = "tls-lib", env = "RETRY_AGENT_TLS_LIBS", value_delimiter = ',')]
    pub tls_libs: Vec<PathBuf>,
    /// How often to look for libssl files new processes map (new pods' images), in seconds
    /// (0: only at start).
    #[arg(long, env = "RETRY_AGENT_TLS_RESCAN_SECS", default_value_t = 30)]
    pub tls_rescan_secs: u64,
    /// Link a Go program's outbound HTTP calls to the inbound request they serve with uprobes on
    /// net/http and the Go scheduler (goroutine ancestry), in every Go executable the node runs.
    #[arg(long = "capture-go", env = "RETRY_AGENT_CAPTURE_GO", default_value_t = true, action = clap::ArgAction::Set)]
    pub go: bool,
    /// How often to look for new Go executables among the node's processes, in milliseconds.
    #[arg(long = "capture-go-rescan-ms", env = "RETRY_AGENT_CAPTURE_GO_RESCAN_MS", default_value_t = 1000)]
    pub go_rescan_ms: u64,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        Self {
            ring_bytes: 16 << 20,
            payload_bytes: retry_common::DEFAULT_PAYLOAD,
            channel_capacity: 65536,
            proc_root: PathBuf::from("/proc"),
            wakeup_bytes: 256 << 10,
            poll_ms: 10,
            tls: false,
            tls_libs: Vec::new(),
            tls_rescan_secs: 30,
            go: true,
            go_rescan_ms: 1000,
        }
    }
}

impl CaptureConfig {
    /// Every problem with the settings at once.
    pub fn validate(&self) -> Result<(), CaptureError> {
        let mut problems = Vec::new();
        if !self.ring_bytes.is_power_of_two() || self.ring_bytes < 4096 {
            problems.push(format!("ring bytes {} must be a power of two ≥ 4096", self.ring_bytes));
        }
        if self.payload_bytes as usize > MAX_PAYLOAD {
            problems.push(format!("payload bytes {} exceeds {MAX_PAYLOAD}", self.payload_bytes));
        }
        if self.poll_ms == 0 || self.poll_ms > 1000 {
            problems.push(format!("ring poll interval {} ms must be 1..=1000", self.poll_ms));
        }
        if self.go && self.go_rescan_ms == 0 {
            problems.push("Go rescan interval must be at least 1 ms".to_string());
        }
        if self.channel_capacity == 0 {
            problems.push("channel capacity must be at least 1".to_string());
        }
        if problems.is_empty() { Ok(()) } else { Err(CaptureError::Config(problems.join("; "))) }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("invalid capture settings: {0}")]
    Config(String),
    #[error(
        "missing capability {0}: the agent loads eBPF programs; run it as root or grant CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN)"
    )]
    MissingCapability(&'static str),
    #[error("tracefs is not mounted at /sys/kernel/tracing and mounting it failed; run: mount -t tracefs nodev /sys/kernel/tracing")]
    TracefsNotMounted,
    #[error("kernel {0} is too old: the ring buffer needs Linux 5.8 or newer")]
    KernelTooOld(String),
    #[error("the embedded eBPF object is empty: run `cargo xtask build-ebpf` and rebuild the agent")]
    EmptyObject,
    #[error("capture must be started inside a tokio runtime")]
    NoRuntime,
    #[error("loading the eBPF object")]
    Load(#[source] aya::EbpfError),
    #[error("the verifier rejected program {program}: {source}\nverifier log:\n{log}")]
    Verifier {
        program: String,
        log: String,
        #[source]
        source: ProgramError,
    },
    #[error("program {program}")]
    Program {
        program: String,
        #[source]
        source: ProgramError,
    },
    #[error("the eBPF object has no map {0}")]
    MissingMap(&'static str),
    #[error("map {map}")]
    Map {
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("polling the ring buffer")]
    Poll(#[source] std::io::Error),
}

/// Counters readable at any time from any thread.
#[derive(Debug, Default)]
pub struct StatsInner {
    events: AtomicU64,
    kernel_drops: AtomicU64,
    channel_drops: AtomicU64,
    decode_errors: AtomicU64,
}

/// A snapshot of the capture counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CaptureStats {
    /// Records decoded from the ring buffer (and /proc pick-ups).
    pub events: u64,
    /// Records the kernel could not put into a full ring buffer (refreshed about once a second).
    pub kernel_drops: u64,
    /// Decoded events dropped because the pipeline's channel was full.
    pub channel_drops: u64,
    /// Malformed records.
    pub decode_errors: u64,
}

/// Shared handle to the counters (clone it into metrics).
#[derive(Clone, Debug, Default)]
pub struct StatsHandle(Arc<StatsInner>);

impl StatsHandle {
    pub fn snapshot(&self) -> CaptureStats {
        let s = &self.0;
        CaptureStats {
            events: s.events.load(Ordering::Relaxed),
            kernel_drops: s.kernel_drops.load(Ordering::Relaxed),
            channel_drops: s.channel_drops.load(Ordering::Relaxed),
            decode_errors: s.decode_errors.load(Ordering::Relaxed),
        }
    }
}

/// This process's name (what its shims and CLI calls share).
fn own_comm() -> String {
    std::fs::read_to_string("/proc/self/comm").map(|c| c.trim_end().to_string()).unwrap_or_default()
}

/// A comm as the kernel stores it: at most 15 bytes, NUL-padded to 16.
fn comm_bytes(comm: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (o, b) in out.iter_mut().zip(comm.bytes().take(15)) {
        *o = b;
    }
    out
}

/// Every program: (name in the object, tracepoint category, tracepoint name).
const PROGRAMS: &[(&str, &str, &str)] = &[
    ("ra_enter_read", "syscalls", "sys_enter_read"),
    ("ra_exit_read", "syscalls", "sys_exit_read"),
    ("ra_enter_write", "syscalls", "sys_enter_write"),
    ("ra_exit_write", "syscalls", "sys_exit_write"),
    ("ra_enter_readv", "syscalls", "sys_enter_readv"),
    ("ra_exit_readv", "syscalls", "sys_exit_readv"),
    ("ra_enter_writev", "syscalls", "sys_enter_writev"),
    ("ra_exit_writev", "syscalls", "sys_exit_writev"),
    ("ra_enter_sendto", "syscalls", "sys_enter_sendto"),
    ("ra_exit_sendto", "syscalls", "sys_exit_sendto"),
    ("ra_enter_recvfrom", "syscalls", "sys_enter_recvfrom"),
    ("ra_exit_recvfrom", "syscalls", "sys_exit_recvfrom"),
    ("ra_enter_sendmsg", "syscalls", "sys_enter_sendmsg"),
    ("ra_exit_sendmsg", "syscalls", "sys_exit_sendmsg"),
    ("ra_enter_recvmsg", "syscalls", "sys_enter_recvmsg"),
    ("ra_exit_recvmsg", "syscalls", "sys_exit_recvmsg"),
    ("ra_enter_sendmmsg", "syscalls", "sys_enter_sendmmsg"),
    ("ra_exit_sendmmsg", "syscalls", "sys_exit_sendmmsg"),
    ("ra_enter_recvmmsg", "syscalls", "sys_enter_recvmmsg"),
    ("ra_exit_recvmmsg", "syscalls", "sys_exit_recvmmsg"),
    ("ra_enter_sendfile", "syscalls", "sys_enter_sendfile64"),
    ("ra_exit_sendfile", "syscalls", "sys_exit_sendfile64"),
    ("ra_enter_splice", "syscalls", "sys_enter_splice"),
    ("ra_exit_splice", "syscalls", "sys_exit_splice"),
    ("ra_enter_connect", "syscalls", "sys_enter_connect"),
    ("ra_exit_connect", "syscalls", "sys_exit_connect"),
    ("ra_enter_accept", "syscalls", "sys_enter_accept"),
    ("ra_exit_accept", "syscalls", "sys_exit_accept"),
    ("ra_enter_accept4", "syscalls", "sys_enter_accept4"),
    ("ra_exit_accept4", "syscalls", "sys_exit_accept4"),
    ("ra_enter_close", "syscalls", "sys_enter_close"),
    ("ra_exit_openat", "syscalls", "sys_exit_openat"),
    ("ra_exit_socket", "syscalls", "sys_exit_socket"),
    ("ra_exit_dup", "syscalls", "sys_exit_dup"),
    ("ra_enter_dup2", "syscalls", "sys_enter_dup2"),
    ("ra_enter_dup3", "syscalls", "sys_enter_dup3"),
    ("ra_sock_state", "sock", "inet_sock_set_state"),
    ("ra_process_exit", "sched", "sched_process_exit"),
    ("ra_process_exec", "sched", "sched_process_exec"),
];

/// A running capture: programs attached, reader task running.
pub struct Capture {
    guard: CaptureGuard,
    rx: mpsc::Receiver<Event>,
    stats: StatsHandle,
    tls: Option<TlsState>,
    go: Option<GoState>,
}

/// What a Go rescan needs.
struct GoState {
    probes: golang::GoProbes,
    proc_root: PathBuf,
}

/// What a TLS rescan needs.
struct TlsState {
    probes: tls::TlsProbes,
    configured: Vec<PathBuf>,
    proc_root: PathBuf,
}

/// Keeps the programs attached and the ring reader running; dropping it stops the reader and
/// detaches and unloads every program (nothing is pinned).
pub struct CaptureGuard {
    ebpf: Ebpf,
    reader: JoinHandle<()>,
}

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Capture {
    /// Checks the environment, loads and attaches every program, picks up existing connections
    /// from /proc and starts the ring reader. Must be called inside a tokio runtime.
    pub fn load(cfg: &CaptureConfig) -> Result<Capture, CaptureError> {
        cfg.validate()?;
        let rt = tokio::runtime::Handle::try_current().map_err(|_| CaptureError::NoRuntime)?;
        preflight()?;
        if EBPF_OBJECT.is_empty() {
            return Err(CaptureError::EmptyObject);
        }
        raise_memlock();
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(names::EVENTS, cfg.ring_bytes)
            .load(EBPF_OBJECT)
            .map_err(CaptureError::Load)?;

        let agent_tgid = std::process::id();
        let own_comm = own_comm();
        let off = btf::kernel_offsets();
        let config = Config {
            agent_tgid,
            payload_bytes: cfg.payload_bytes.min(MAX_PAYLOAD as u32),
            sk_err_offset: off.sk_err,
            task_files: off.task_files,
            files_fdt: off.files_fdt,
            fdt_fd: off.fdt_fd,
            file_private_data: off.file_private_data,
            socket_sk: off.socket_sk,
            wakeup_bytes: cfg.wakeup_bytes.min(cfg.ring_bytes / 2),
            task_group_leader: off.task_group_leader,
            task_comm: off.task_comm,
            ignore_comm: comm_bytes(&own_comm),
            flags: if cfg.tls { config_flags::TLS } else { 0 },
        };
        {
            let map = ebpf.map_mut(names::CONFIG).ok_or(CaptureError::MissingMap(names::CONFIG))?;
            let mut arr: Array<&mut MapData, Config> =
                Array::try_from(map).map_err(|source| CaptureError::Map { map: names::CONFIG, source })?;
            arr.set(0, &config, 0).map_err(|source| CaptureError::Map { map: names::CONFIG, source })?;
        }

        for (prog, category, tp) in PROGRAMS {
            attach(&mut ebpf, prog, category, tp)?;
        }
        let mut tls_probes = cfg.tls.then(tls::TlsProbes::default);
        if let Some(t) = tls_probes.as_mut() {
            let n = t.instrument(&mut ebpf, &tls::candidates(&cfg.tls_libs, &cfg.proc_root));
            if n == 0 {
                tracing::info!("no libssl instrumented: TLS connections stay opaque until one is found");
            }
        }

        let go = cfg.go.then(|| {
            let mut probes = golang::GoProbes::default();
            probes.scan(&mut ebpf, &cfg.proc_root, agent_tgid);
            GoState { probes, proc_root: cfg.proc_root.clone() }
        });

        let ring = take_map(&mut ebpf, names::EVENTS)?;
        let ring = RingBuf::try_from(ring).map_err(|source| CaptureError::Map { map: names::EVENTS, source })?;
        let drops = take_map(&mut ebpf, names::DROPS)?;
        let drops: PerCpuArray<MapData, u64> =
            PerCpuArray::try_from(drops).map_err(|source| CaptureError::Map { map: names::DROPS, source })?;
        let conns = take_map(&mut ebpf, names::CONNS)?;
        let mut conns: BpfHashMap<MapData, ConnKey, ConnInfo> =
            BpfHashMap::try_from(conns).map_err(|source| CaptureError::Map { map: names::CONNS, source })?;

        // Attached before the scan, so a connection opened meanwhile is seen by one or the other.
        let initial = pick_up_existing(&cfg.proc_root, agent_tgid, &mut conns);

        let stats = StatsHandle::default();
        let (tx, rx) = mpsc::channel(cfg.channel_capacity);
        let reader = {
            let _guard = rt.enter();
            // SAFETY: the RingBuf owns its map fd, which stays open and the same for as long as
            // the AsyncFd owns the RingBuf.
            let async_ring = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
                .map_err(|e| CaptureError::Poll(std::io::Error::other(e.to_string())))?;
            let state = Reader {
                tx,
                stats: stats.clone(),
                drops,
                conns,
                proc_root: cfg.proc_root.clone(),
                poll_interval: Duration::from_millis(cfg.poll_ms.max(1)),
                seen: HashMap::new(),
                ignored: HashSet::new(),
                nameless: HashSet::new(),
                own_comm,
            };
            rt.spawn(state.run(async_ring, initial))
        };
        tracing::info!(programs = PROGRAMS.len(), payload_bytes = config.payload_bytes, "capture attached");
        let tls = tls_probes.map(|probes| TlsState { probes, configured: cfg.tls_libs.clone(), proc_root: cfg.proc_root.clone() });
        Ok(Capture { guard: CaptureGuard { ebpf, reader }, rx, stats, tls, go })
    }

    /// Instruments the libssl files processes started since the last scan brought (a new pod's
    /// image); returns how many were added. Blocking /proc reads: call it off the hot path.
    pub fn rescan_tls(&mut self) -> usize {
        let Some(t) = self.tls.as_mut() else { return 0 };
        let libs = tls::candidates(&t.configured, &t.proc_root);
        t.probes.instrument(&mut self.guard.ebpf, &libs)
    }

    /// Instruments the Go executables of processes started since the last scan; returns how
    /// many were added. Blocking /proc and file reads (only new executables are read).
    pub fn rescan_go(&mut self) -> usize {
        let Some(g) = self.go.as_mut() else { return 0 };
        g.probes.scan(&mut self.guard.ebpf, &g.proc_root, std::process::id())
    }

    /// Go executables instrumented so far, and those that could not be.
    pub fn go_programs(&self) -> (usize, usize) {
        self.go.as_ref().map_or((0, 0), |g| (g.probes.instrumented, g.probes.failed))
    }

    /// libssl files instrumented so far (0 with `--tls false`).
    pub fn tls_libraries(&self) -> usize {
        self.tls.as_ref().map_or(0, |t| t.probes.instrumented())
    }

    /// The decoded event stream.
    pub fn events(&mut self) -> &mut mpsc::Receiver<Event> {
        &mut self.rx
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> CaptureStats {
        self.stats.snapshot()
    }

    /// Kernel ids of this capture's programs (they disappear when `self` is dropped).
    pub fn program_ids(&self) -> Vec<u32> {
        self.guard.ebpf.programs().filter_map(|(_, p)| p.info().ok()).map(|i| i.id()).collect()
    }

    /// A handle that reads the counters after `self` has been split up.
    pub fn stats_handle(&self) -> StatsHandle {
        self.stats.clone()
    }

    /// Splits the capture so the event stream can move into another task: keep the guard alive
    /// for as long as events should flow.
    pub fn into_parts(self) -> (CaptureGuard, mpsc::Receiver<Event>, StatsHandle) {
        (self.guard, self.rx, self.stats)
    }
}

/// Ids of every program loaded in the kernel right now (to check nothing outlives a capture).
pub fn loaded_program_ids() -> Vec<u32> {
    aya::programs::loaded_programs().filter_map(Result::ok).map(|p| p.id()).collect()
}

/// Cumulative kernel run time of one of this project's loaded programs (names `ra_*`). Counts only
/// grow while BPF statistics are enabled (see [`enable_bpf_stats`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramStat {
    pub id: u32,
    pub name: String,
    pub run_ns: u64,
    pub runs: u64,
}

/// Every loaded `ra_*` program of any capture on this host, with its run-time counters.
pub fn program_stats() -> Vec<ProgramStat> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter_map(|p| {
            let name = p.name_as_str()?.to_string();
            name.starts_with("ra_").then(|| ProgramStat {
                id: p.id(),
                name,
                run_ns: p.run_time().as_nanos() as u64,
                runs: p.run_count(),
            })
        })
        .collect()
}

/// Turns on kernel BPF run-time statistics for as long as the returned fd is open (they cost a
/// little per program run, so they are off by default; benchmarks use them).
pub fn enable_bpf_stats() -> std::io::Result<std::os::fd::OwnedFd> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(|e| std::io::Error::other(e.to_string()))
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, CaptureError> {
    ebpf.take_map(name).ok_or(CaptureError::MissingMap(name))
}

fn attach(ebpf: &mut Ebpf, prog: &str, category: &str, tp: &str) -> Result<(), CaptureError> {
    let program = ebpf.program_mut(prog).ok_or_else(|| CaptureError::Program {
        program: prog.to_string(),
        source: ProgramError::NotLoaded,
    })?;
    let program: &mut TracePoint = program
        .try_into()
        .map_err(|source| CaptureError::Program { program: prog.to_string(), source })?;
    match program.load() {
        Ok(()) => {}
        Err(ProgramError::LoadError { io_error, verifier_log }) => {
            return Err(CaptureError::Verifier {
                program: prog.to_string(),
                log: verifier_log.to_string(),
                source: ProgramError::LoadError { io_error, verifier_log },
            });
        }
        Err(source) => return Err(CaptureError::Program { program: prog.to_string(), source }),
    }
    program.attach(category, tp).map_err(|source| CaptureError::Program { program: prog.to_string(), source })?;
    Ok(())
}

/// Names the first missing prerequisite instead of letting the bpf() syscall fail obscurely.
fn preflight() -> Result<(), CaptureError> {
    if let Ok(status) = std::fs::read_to_string("/proc/self/status")
        && let Some(eff) = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
    {
        const CAP_SYS_ADMIN: u64 = 21;
        const CAP_PERFMON: u64 = 38;
        const CAP_BPF: u64 = 39;
        let has = |c: u64| eff & (1 << c) != 0;
        if !has(CAP_SYS_ADMIN) {
            if !has(CAP_BPF) {
                return Err(CaptureError::MissingCapability("CAP_BPF"));
            }
            if !has(CAP_PERFMON) {
                return Err(CaptureError::MissingCapability("CAP_PERFMON"));
            }
        }
    }
    if let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") {
        let mut it = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
        if (major, minor) < (5, 8) {
            return Err(CaptureError::KernelTooOld(release.trim().to_string()));
        }
    }
    let tracefs = Path::new("/sys/kernel/tracing/events");
    if !tracefs.exists() && !Path::new("/sys/kernel/debug/tracing/events").exists() {
        if mount("tracefs", "/sys/kernel/tracing", "tracefs") && tracefs.exists() {
            tracing::info!("mounted tracefs at /sys/kernel/tracing");
        } else {
            return Err(CaptureError::TracefsNotMounted);
        }
    }
    // Nothing is pinned, so bpffs is optional; mount it when missing as the usual set-up expects.
    if std::fs::read_dir("/sys/fs/bpf").map(|mut d| d.next().is_none()).unwrap_or(true)
        && !is_bpffs("/sys/fs/bpf")
        && !mount("bpf", "/sys/fs/bpf", "bpf")
    {
        tracing::warn!("bpffs is not mounted at /sys/fs/bpf (mount -t bpf bpf /sys/fs/bpf); not needed: nothing is pinned");
    }
    Ok(())
}

fn is_bpffs(path: &str) -> bool {
    const BPF_FS_MAGIC: i64 = 0xcafe4a11;
    let Ok(c) = std::ffi::CString::new(path) else { return false };
    // SAFETY: statfs writes into the zeroed struct we own; the path is NUL-terminated.
    unsafe {
        let mut s: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut s) == 0 && s.f_type as i64 == BPF_FS_MAGIC
    }
}

fn mount(source: &str, target: &str, fstype: &str) -> bool {
    let (Ok(s), Ok(t), Ok(f)) =
        (std::ffi::CString::new(source), std::ffi::CString::new(target), std::ffi::CString::new(fstype))
    else {
        return false;
    };
    // SAFETY: all strings are NUL-terminated and outlive the call; no data argument.
    unsafe { libc::mount(s.as_ptr(), t.as_ptr(), f.as_ptr(), 0, std::ptr::null()) == 0 }
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK.
fn raise_memlock() {
    let rl = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: plain syscall with a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rl) } != 0 {
        tracing::debug!("could not raise RLIMIT_MEMLOCK");
    }
}

/// CLOCK_MONOTONIC in ns, the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// Inserts connections that predate the agent into the kernel map and returns their events.
fn pick_up_existing(
    proc_root: &Path,
    agent_tgid: u32,
    conns: &mut BpfHashMap<MapData, ConnKey, ConnInfo>,
) -> Vec<Event> {
    let now = monotonic_ns();
    let mut out = Vec::new();
    for c in procfs::scan_existing(proc_root, agent_tgid) {
        let key = ConnKey { tgid: c.pid, fd: c.fd };
        // A connection the programs saw being made meanwhile is already there, with its real role.
        if conns.get(&key, 0).is_ok() {
            continue;
        }
        let role = match c.role {
            Role::Client => retry_common::role::CLIENT,
            Role::Server => retry_common::role::SERVER,
            Role::Unknown => retry_common::role::UNKNOWN,
        };
        let info = ConnInfo { generation: now, skaddr: 0, role, _pad: 0, tuple: decode::sock_tuple(&c.tuple) };
        if let Err(e) = conns.insert(&key, &info, 0) {
            tracing::debug!(pid = c.pid, fd = c.fd, error = %e, "cannot track existing connection");
            continue;
        }
        out.push(Event::Conn(ConnEvent {
            conn: ConnId { pid: c.pid, fd: c.fd, generation: now },
            role: c.role,
            tuple: Some(c.tuple),
            pid: c.pid,
            tid: c.pid,
            ts_ns: now,
            kind: ConnEventKind::Existing,
        }));
    }
    tracing::info!(connections = out.len(), "picked up existing TCP connections");
    out
}

/// The ring reader task's state.
struct Reader {
    tx: mpsc::Sender<Event>,
    stats: StatsHandle,
    drops: PerCpuArray<MapData, u64>,
    conns: BpfHashMap<MapData, ConnKey, ConnInfo>,
    proc_root: PathBuf,
    poll_interval: Duration,
    /// Pids whose `Event::Process` was sent, with the fds the kernel map tracks for them (so an
    /// exit removes exactly those entries instead of scanning the whole map).
    seen: HashMap<u32, HashSet<u32>>,
    /// Processes running the agent's own binary (its shims): a proxy hop is not a service, and
    /// observing it would put a fake service between every caller and callee it steers.
    ignored: HashSet<u32>,
    /// The agent's own comm, which its shims share.
    own_comm: String,
    /// Pids described with no name (gone from /proc before they were read): their exit record
    /// names them. Entries go with the exit, like `seen`'s.
    nameless: HashSet<u32>,
}

impl Reader {
    async fn run(mut self, mut ring: AsyncFd<RingBuf<MapData>>, initial: Vec<Event>) {
        for ev in initial {
            self.stats.0.events.fetch_add(1, Ordering::Relaxed);
            if !self.forward(ev) {
                return;
            }
        }
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        // The kernel wakes us only once `wakeup_bytes` wait; below that we come and look.
        let mut poll = tokio::time::interval(self.poll_interval);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut raw = Vec::with_capacity(8192);
        loop {
            tokio::select! {
                guard = ring.readable_mut() => {
                    let mut guard = match guard {
                        Ok(g) => g,
                        Err(e) => {
                            tracing::error!(error = %e, "ring buffer poll failed; capture stops");
                            return;
                        }
                    };
                    let Some(drained) = self.drain(guard.get_inner_mut(), &mut raw) else { return };
                    // Clear readiness only once the ring is empty: the kernel wakes the reader
                    // only when a record lands in an empty ring (adaptive notification), so
                    // clearing with records left would stall capture for good under load.
                    if drained {
                        guard.clear_ready();
                    } else {
                        tokio::task::yield_now().await;
                    }
                }
                _ = poll.tick() => {
                    // Records committed without a wakeup.
                    loop {
                        let Some(drained) = self.drain(ring.get_mut(), &mut raw) else { return };
                        if drained {
                            break;
                        }
                        tokio::task::yield_now().await;
                    }
                }
                _ = tick.tick() => self.refresh_drops(),
            }
        }
    }

    /// Handles up to one batch of records. `Some(true)`: the ring is empty; `Some(false)`: more
    /// wait; `None`: the consumer is gone. Bounded so the tick and a closed channel are noticed.
    fn drain(&mut self, rb: &mut RingBuf<MapData>, raw: &mut Vec<u8>) -> Option<bool> {
        for _ in 0..4096 {
            let Some(item) = rb.next() else { return Some(true) };
            raw.clear();
            raw.extend_from_slice(&item);
            drop(item);
            if !self.handle(raw) {
                return None;
            }
        }
        Some(false)
    }

    fn refresh_drops(&self) {
        if let Ok(v) = self.drops.get(&0, 0) {
            let total: u64 = v.iter().sum();
            self.stats.0.kernel_drops.store(total, Ordering::Relaxed);
        }
    }

    /// Returns false when the consumer is gone.
    fn handle(&mut self, raw: &[u8]) -> bool {
        if let Some(pid) = decode::exec_pid(raw) {
            // New image, new comm/exe: describe it again, but only if it was described before.
            if self.seen.contains_key(&pid) {
                let info = self.describe(pid);
                return self.send(Event::Process(info));
            }
            return true;
        }
        match decode::decode(raw) {
            Ok(ev) => {
                self.stats.0.events.fetch_add(1, Ordering::Relaxed);
                if let Event::ProcessExit { pid, .. } = ev
                    && self.nameless.remove(&pid)
                    && let Some(comm) = decode::exit_comm(raw)
                    && !self.send(Event::Process(ProcessInfo::named_at_exit(pid, comm)))
                {
                    return false;
                }
                self.forward(ev)
            }
            Err(e) => {
                let n = self.stats.0.decode_errors.fetch_add(1, Ordering::Relaxed);
                // Rate-limited: the first few and then every 1000th.
                if n < 5 || n % 1000 == 0 {
                    tracing::warn!(error = %e, total = n + 1, "malformed capture record");
                }
                true
            }
        }
    }

    fn forward(&mut self, ev: Event) -> bool {
        let pid = ev.pid();
        if self.ignored.contains(&pid) {
            match &ev {
                Event::ProcessExit { .. } => {
                    self.ignored.remove(&pid);
                }
                // Untrack its sockets in the kernel so their I/O costs no records.
                Event::Conn(c) => {
                    let _ = self.conns.remove(&ConnKey { tgid: pid, fd: c.conn.fd });
                }
                _ => {}
            }
            return true;
        }
        if let Event::ProcessExit { .. } = ev {
            // Exits of processes never traced are noise.
            let Some(fds) = self.seen.remove(&pid) else { return true };
            // The kernel cannot iterate its map on exit; drop the dead process's entries here.
            for fd in fds {
                let _ = self.conns.remove(&ConnKey { tgid: pid, fd });
            }
        } else if !self.seen.contains_key(&pid) {
            let info = self.describe(pid);
            if !self.own_comm.is_empty() && info.comm == self.own_comm {
                tracing::debug!(pid, "not observing another retry-agent process (a shim)");
                self.ignored.insert(pid);
                return self.forward(ev);
            }
            self.seen.insert(pid, HashSet::new());
            if !self.send(Event::Process(info)) {
                return false;
            }
        }
        if let (Event::Conn(c), Some(fds)) = (&ev, self.seen.get_mut(&pid)) {
            match c.kind {
                ConnEventKind::Close => {
                    fds.remove(&c.conn.fd);
                }
                ConnEventKind::Connect { .. } | ConnEventKind::Accept | ConnEventKind::Existing => {
                    fds.insert(c.conn.fd);
                }
                _ => {}
            }
        }
        self.send(ev)
    }

    /// Reads a process's metadata; one already gone (no name) is named by its exit record.
    fn describe(&mut self, pid: u32) -> ProcessInfo {
        let info = procfs::process_info(&self.proc_root, pid);
        if info.comm.is_empty() {
            self.nameless.insert(pid);
        } else {
            self.nameless.remove(&pid);
        }
        info
    }

    fn send(&self, ev: Event) -> bool {
        match self.tx.try_send(ev) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.stats.0.channel_drops.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }
}

mod btf;
mod tls;
pub mod golang;

#[cfg(test)]
mod tests;
