//! Stage 1: load and attach the eBPF programs, read the ring buffer, decode raw records into
//! owned [`Event`]s. The only stage that talks to the kernel.
//!
//! ```text
//! tracepoints ──RINGBUF──▶ reader task ──decode──▶ batches, bounded in events ──▶ Capture::events()
//!                                 └─ /proc metadata: Event::Process once per pid, first
//! ```
//! The reader never blocks on the channel: a full channel counts a drop. Dropping [`Capture`]
//! stops the reader and detaches every program (nothing is pinned).
//!
//! Module map: `config` (the `--capture-*` settings), `programs` (what the object holds and where each program goes, read from its
//! sections), `load` (prerequisites, the settings map, attaching), `gaps` (which programs the
//! capture can run without, and what it misses then), `tls` (the libssl uprobe
//! family, per library file), `btf` (kernel struct offsets), `scope` (`--capture-cgroup`,
//! `--capture-netns`: the part of the machine observed), `pickup` + `procfs` (connections
//! that predate the agent, process metadata), `reader` (the ring reader task), `decode` +
//! `event` (records into [`Event`]s), `stats` (counters).
pub mod decode;
pub mod event;
pub mod procfs;
pub mod scope;
mod workload;

use std::{path::PathBuf, time::Duration};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    programs::ProgramError,
};
use retry_common::{ConnInfo, ConnKey, names};
use tokio::{io::unix::AsyncFd, task::JoinHandle};

use crate::settings::{InvalidConfig, Settings};

pub use config::{CaptureConfig, GoMode};
pub use event::{
    ConnEvent, ConnEventKind, ConnId, DataEvent, Direction, Event, ProcessInfo, Role, SummaryEvent,
    Syscall, Tuple,
};
pub use events::Events;
pub use gaps::{Gap, GapReason};
pub use programs::ProgramsError;
pub use scope::{Scope, ScopeError, ScopedCgroup};
pub use stats::{
    CaptureStats, ProgramStat, StatsHandle, StatsInner, enable_bpf_stats, loaded_program_ids,
    program_stats,
};
pub use workload::{WorkloadKind, WorkloadName};

/// The eBPF object embedded at build time (empty when built without `cargo xtask build-ebpf`).
pub static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/retry-ebpf.o"));

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("invalid capture settings")]
    Config(#[source] InvalidConfig),
    #[error(
        "missing capability {0}: the agent loads eBPF programs; run it as root or grant CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN)"
    )]
    MissingCapability(&'static str),
    #[error(
        "tracefs is not mounted at /sys/kernel/tracing and mounting it failed; run: mount -t tracefs nodev /sys/kernel/tracing"
    )]
    TracefsNotMounted,
    #[error("kernel {0} is too old: the ring buffer needs Linux 5.8 or newer")]
    KernelTooOld(String),
    #[error(
        "the embedded eBPF object is empty: run `cargo xtask build-ebpf` and rebuild the agent"
    )]
    EmptyObject,
    #[error("capture must be started inside a tokio runtime")]
    NoRuntime,
    #[error("loading the eBPF object")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("the verifier rejected program {program}: {source}\nverifier log:\n{log}")]
    Verifier {
        program: String,
        log: String,
        #[source]
        source: Box<ProgramError>,
    },
    /// The verifier accepted the program and the kernel's JIT failed to compile it (ENOTSUPP;
    /// the kernel log says `bpf_jit: fatal error`): on x86-64 its passes did not converge on
    /// one layout of a program this large, which the kernel's JIT, not the program, decides.
    #[error(
        "the kernel's BPF JIT could not compile program {program} (ENOTSUPP after the verifier accepted it; the kernel log says \"bpf_jit: fatal error\"): a limit of this kernel's JIT for programs of this size, not a refusal of what the program does; please report the kernel version ({kernel}) with this message"
    )]
    Jit {
        program: String,
        kernel: String,
        #[source]
        source: Box<ProgramError>,
    },
    #[error(
        "this kernel has no tracepoint {tracepoint}, which program {program} needs: are syscall tracepoints built in (CONFIG_FTRACE_SYSCALLS)?"
    )]
    NoTracepoint { program: String, tracepoint: String },
    #[error("program {program}")]
    Program {
        program: String,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("the eBPF object has no map {0}")]
    MissingMap(&'static str),
    #[error("map {map}")]
    Map {
        map: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    #[error("polling the ring buffer")]
    Poll(#[source] std::io::Error),
    #[error("reading the programs of the eBPF object")]
    Programs(#[source] ProgramsError),
    #[error(
        "--capture-netns needs kernel BTF offsets of task_struct.nsproxy, nsproxy.net_ns, net.ns and ns_common.inum, which this kernel's BTF does not give"
    )]
    NetnsScopeUnsupported,
    #[error("the capture scope")]
    Scope(#[source] ScopeError),
}

impl CaptureError {
    /// `map` could not be opened or written: for `map_err`.
    fn map(map: &'static str) -> impl FnOnce(aya::maps::MapError) -> Self {
        move |source| CaptureError::Map {
            map,
            source: Box::new(source),
        }
    }

    /// `program` could not be found, loaded or attached: for `map_err`.
    fn program(program: &str) -> impl FnOnce(ProgramError) -> Self + '_ {
        move |source| CaptureError::Program {
            program: program.to_string(),
            source: Box::new(source),
        }
    }
}

/// A running capture: programs attached, reader task running.
pub struct Capture {
    guard: CaptureGuard,
    rx: Events,
    stats: StatsHandle,
    tls: Option<TlsState>,
    go: Option<GoState>,
    attached: usize,
    /// Programs the capture runs without ([`gaps`]).
    gaps: Vec<Gap>,
    /// What one uprobe hit costs on this node, when measured (`--capture-go auto`, or TLS on).
    uprobe_cost: Option<Duration>,
}

/// What a Go rescan needs.
struct GoState {
    probes: golang::GoProbes,
    proc_root: PathBuf,
    scope: Scope,
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
        Self::load_from(cfg, EBPF_OBJECT)
    }

    /// [`Capture::load`] with another object than the embedded one: for tests that load it
    /// altered (a program made to fail the verifier, a tracepoint the kernel does not have).
    #[cfg(any(test, feature = "testkit"))]
    pub fn load_object(cfg: &CaptureConfig, object: &[u8]) -> Result<Capture, CaptureError> {
        Self::load_from(cfg, object)
    }

    fn load_from(cfg: &CaptureConfig, object: &[u8]) -> Result<Capture, CaptureError> {
        cfg.validate().map_err(CaptureError::Config)?;
        let rt = tokio::runtime::Handle::try_current().map_err(|_| CaptureError::NoRuntime)?;
        load::preflight()?;
        if object.is_empty() {
            return Err(CaptureError::EmptyObject);
        }
        let specs = programs::programs(object).map_err(CaptureError::Programs)?;
        load::raise_memlock();
        let mut loader = EbpfLoader::new();
        loader.map_max_entries(names::EVENTS, cfg.ring_bytes);
        for map in names::ARG_MAPS {
            loader.map_max_entries(map, cfg.arg_map_entries);
        }
        let mut ebpf = loader
            .load(object)
            .map_err(|e| CaptureError::Load(Box::new(e)))?;
        load::check_accounted(&ebpf, &specs)?;

        let agent_tgid = std::process::id();
        // Validated above; a cgroup removed since is still an error, not a wider scope.
        let scope = Scope::resolve(&cfg.cgroups, &cfg.netns)
            .map_err(|mut e| CaptureError::Scope(e.remove(0)))?;
        // Decided before the settings are written: they tell the data programs whether to look
        // up a goroutine.
        let (go_on, uprobe_cost) = calibrate::go_uprobes(cfg, &mut ebpf, &specs);
        let config = load::kernel_config(cfg, agent_tgid, &scope, go_on);
        if !scope.netns.is_empty() && config.offsets.ns_inum == 0 {
            return Err(CaptureError::NetnsScopeUnsupported);
        }
        load::write_scope(&mut ebpf, &scope)?;
        load::write_config(&mut ebpf, &config)?;
        if !scope.is_whole_machine() {
            tracing::info!(cgroups = ?scope.cgroups, netns = ?scope.netns, "observing part of the machine");
        }

        let load::Attached {
            count: attached,
            gaps,
        } = load::attach_fixed(&mut ebpf, &specs)?;
        for g in &gaps {
            match g.reason {
                GapReason::NoTracepoint => tracing::info!(
                    program = %g.program,
                    tracepoint = %g.tracepoint,
                    "this kernel has no such syscall: nothing can make the calls the program would see"
                ),
                _ => tracing::error!(
                    program = %g.program,
                    tracepoint = %g.tracepoint,
                    reason = g.reason.as_str(),
                    error = %g.detail,
                    "capture runs without this program: what it would see goes unseen (retry_agent_capture_programs_missing)"
                ),
            }
        }
        let mut tls_probes = cfg.tls.then(|| tls::TlsProbes::new(tls::plan(&specs)));
        if let Some(t) = tls_probes.as_mut() {
            let n = t.instrument(&mut ebpf, &tls::candidates(&cfg.tls_libs, &cfg.proc_root));
            if n == 0 {
                tracing::info!(
                    "no libssl instrumented: TLS connections stay opaque until one is found"
                );
            }
        }

        let go = go_on.then(|| {
            let mut probes = golang::GoProbes::new(golang::plan(&specs));
            probes.scan(&mut ebpf, &cfg.proc_root, agent_tgid, &scope);
            GoState {
                probes,
                proc_root: cfg.proc_root.clone(),
                scope: scope.clone(),
            }
        });

        let ring = load::take_map(&mut ebpf, names::EVENTS)?;
        let ring = RingBuf::try_from(ring).map_err(CaptureError::map(names::EVENTS))?;
        let drops = load::take_map(&mut ebpf, names::DROPS)?;
        let drops: PerCpuArray<MapData, u64> =
            PerCpuArray::try_from(drops).map_err(CaptureError::map(names::DROPS))?;
        let arg_failures = load::take_map(&mut ebpf, names::ARG_FAILURES)?;
        let arg_failures: PerCpuArray<MapData, u64> =
            PerCpuArray::try_from(arg_failures).map_err(CaptureError::map(names::ARG_FAILURES))?;
        let conns = load::take_map(&mut ebpf, names::CONNS)?;
        let mut conns: BpfHashMap<MapData, ConnKey, ConnInfo> =
            BpfHashMap::try_from(conns).map_err(CaptureError::map(names::CONNS))?;

        let held = load::take_map(&mut ebpf, names::HELD)?;
        let held: BpfHashMap<MapData, ConnKey, retry_common::SummaryRecord> =
            BpfHashMap::try_from(held).map_err(CaptureError::map(names::HELD))?;
        let agent_tgids = load::take_map(&mut ebpf, names::AGENT_TGIDS)?;
        let agent_tgids: BpfHashMap<MapData, u32, u8> =
            BpfHashMap::try_from(agent_tgids).map_err(CaptureError::map(names::AGENT_TGIDS))?;

        // Attached before the scan, so a connection opened meanwhile is seen by one or the other.
        let initial = pickup::pick_up_existing(&cfg.proc_root, agent_tgid, &scope, &mut conns);

        let stats = StatsHandle::default();
        let (tx, rx) = events::channel(cfg.channel_capacity);
        let reader = {
            let _guard = rt.enter();
            // SAFETY: the RingBuf owns its map fd, which stays open and the same for as long as
            // the AsyncFd owns the RingBuf.
            let async_ring =
                unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
                    .map_err(|e| CaptureError::Poll(std::io::Error::other(e.to_string())))?;
            let state = reader::Reader {
                tx,
                stats: stats.clone(),
                drops,
                arg_failures,
                conns,
                held,
                proc_root: cfg.proc_root.clone(),
                poll_interval: Duration::from_millis(cfg.poll_ms.max(1)),
                seen: Default::default(),
                ignored: Default::default(),
                nameless: Default::default(),
                forked_from: Default::default(),
                arena: Default::default(),
                own_exe: own_exe::OwnExe::current(),
                agent_tgids,
            };
            rt.spawn(state.run(async_ring, initial))
        };
        tracing::info!(
            programs = attached,
            payload_bytes = config.payload_bytes,
            response_bytes = config.response_bytes,
            "capture attached"
        );
        let tls = tls_probes.map(|probes| TlsState {
            probes,
            configured: cfg.tls_libs.clone(),
            proc_root: cfg.proc_root.clone(),
        });
        Ok(Capture {
            guard: CaptureGuard { ebpf, reader },
            rx,
            stats,
            tls,
            go,
            attached,
            gaps,
            uprobe_cost,
        })
    }

    /// Instruments the libssl files processes started since the last scan brought (a new pod's
    /// image); returns how many were added. Blocking /proc reads: call it off the hot path.
    pub fn rescan_tls(&mut self) -> usize {
        let Some(t) = self.tls.as_mut() else { return 0 };
        let libs = tls::candidates(&t.configured, &t.proc_root);
        t.probes.instrument(&mut self.guard.ebpf, &libs)
    }

    /// Instruments the Go executables of processes started since the last scan; returns how
    /// many were added. Blocking /proc and file reads (only new executables are read): the
    /// event loop uses [`Capture::rescan_go_in_background`].
    pub fn rescan_go(&mut self) -> usize {
        let Some(g) = self.go.as_mut() else { return 0 };
        g.probes.scan(
            &mut self.guard.ebpf,
            &g.proc_root,
            std::process::id(),
            &g.scope,
        )
    }

    /// As [`Capture::rescan_go`], with new executables read on a blocking thread and attached
    /// by a later call (returns how many this call attached): for the agent's event loop.
    pub fn rescan_go_in_background(&mut self) -> usize {
        let Some(g) = self.go.as_mut() else { return 0 };
        g.probes.scan_in_background(
            &mut self.guard.ebpf,
            &g.proc_root,
            std::process::id(),
            &g.scope,
        )
    }

    /// Go executables are being read in the background: a rescan soon attaches them.
    pub fn go_inspecting(&self) -> bool {
        self.go.as_ref().is_some_and(|g| g.probes.inspecting())
    }

    /// Whether the Go uprobes are on (see `--capture-go`).
    pub fn go_enabled(&self) -> bool {
        self.go.is_some()
    }

    /// What one uprobe hit costs on this node, when it was measured.
    pub fn uprobe_cost(&self) -> Option<Duration> {
        self.uprobe_cost
    }

    /// Go executables instrumented so far, and those that could not be.
    pub fn go_programs(&self) -> (usize, usize) {
        self.go
            .as_ref()
            .map_or((0, 0), |g| (g.probes.instrumented, g.probes.failed))
    }

    /// gRPC-go executables instrumented with their stream probes, and without them.
    pub fn go_grpc_programs(&self) -> (usize, usize) {
        self.go
            .as_ref()
            .map_or((0, 0), |g| (g.probes.grpc_linked, g.probes.grpc_unlinked))
    }

    /// Programs attached at load (what `/healthz` requires to be non-zero).
    pub fn programs_attached(&self) -> usize {
        self.attached
    }

    /// The programs of the object the capture runs without, and why.
    pub fn gaps(&self) -> &[Gap] {
        &self.gaps
    }

    /// libssl files instrumented so far (0 with `--tls false`).
    pub fn tls_libraries(&self) -> usize {
        self.tls.as_ref().map_or(0, |t| t.probes.instrumented())
    }

    /// The decoded event stream.
    pub fn events(&mut self) -> &mut Events {
        &mut self.rx
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> CaptureStats {
        self.stats.snapshot()
    }

    /// Kernel ids of this capture's programs (they disappear when `self` is dropped).
    pub fn program_ids(&self) -> Vec<u32> {
        self.guard
            .ebpf
            .programs()
            .filter_map(|(_, p)| p.info().ok())
            .map(|i| i.id())
            .collect()
    }

    /// A handle that reads the counters after `self` has been split up.
    pub fn stats_handle(&self) -> StatsHandle {
        self.stats.clone()
    }

    /// Splits the capture so the event stream can move into another task: keep the guard alive
    /// for as long as events should flow.
    pub fn into_parts(self) -> (CaptureGuard, Events, StatsHandle) {
        (self.guard, self.rx, self.stats)
    }
}

/// The tracepoints the embedded object's programs attach to, as (category, name): what a
/// benchmark's floor attaches empty programs to, so it measures the same hooks.
pub fn tracepoints() -> Result<Vec<(String, String)>, ProgramsError> {
    Ok(programs::programs(EBPF_OBJECT)?
        .into_iter()
        .filter_map(|p| match p.hook {
            programs::Hook::Tracepoint { category, name } => Some((category, name)),
            programs::Hook::Uprobe(_) => None,
        })
        .collect())
}

/// CLOCK_MONOTONIC in ns, the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

mod btf;
mod calibrate;
mod config;
mod events;
mod gaps;
pub mod golang;
mod load;
mod own_exe;
mod pickup;
mod programs;
mod reader;
mod stats;
mod tls;

#[cfg(test)]
mod tests;
