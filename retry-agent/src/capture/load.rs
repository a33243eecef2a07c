//! Getting the object into the kernel: prerequisites checked and named, the settings map
//! written, every program attached where its section says ([`super::programs`]).
use std::path::PathBuf;

use aya::{
    Ebpf,
    maps::{Array, HashMap as BpfHashMap, MapData},
    programs::{ProgramError, TracePoint},
};
use retry_common::{Config, MAX_PAYLOAD, config_flags, names};

use super::{
    CaptureConfig, CaptureError, Scope, btf,
    gaps::{self, Gap},
    programs::{Hook, ProgramSpec, ProgramsError, UprobeTarget},
};

/// The settings the programs read (`CONFIG`): what to capture, who the agent is, whether the Go
/// uprobes are on (`go`), and the kernel struct offsets BTF gave.
pub(super) fn kernel_config(
    cfg: &CaptureConfig,
    agent_tgid: u32,
    scope: &Scope,
    go: bool,
) -> Config {
    let exe = own_exe_kernel_id();
    let mut flags = if cfg.tls { config_flags::TLS } else { 0 };
    if go {
        flags |= config_flags::GO;
    }
    if !scope.cgroups.is_empty() {
        flags |= config_flags::SCOPE_CGROUP;
    }
    if !scope.netns.is_empty() {
        flags |= config_flags::SCOPE_NETNS;
    }
    if cfg.summarize {
        flags |= config_flags::SUMMARIZE;
    }
    Config {
        agent_tgid,
        payload_bytes: cfg.payload_bytes.min(MAX_PAYLOAD as u32),
        wakeup_bytes: cfg.wakeup_bytes.min(cfg.ring_bytes / 2),
        flags,
        exe_ino: exe.map_or(0, |e| e.0),
        exe_dev: exe.map_or(0, |e| e.1),
        cgroup_levels: scope.cgroup_levels(),
        offsets: btf::kernel_offsets(),
        response_bytes: cfg.response_prefix().min(MAX_PAYLOAD as u32),
        summary_sample: cfg.summary_sample,
        summary_hot_ns: cfg.summary_hot_secs.saturating_mul(1_000_000_000),
        summary_every: u32::from(cfg.summary_every),
        _pad: 0,
        summary_window_ns: cfg.summary_window_ms.saturating_mul(1_000_000),
    }
}

/// Fills `SCOPE_CGROUPS` and `SCOPE_NETNS` (before any program is attached).
pub(super) fn write_scope(ebpf: &mut Ebpf, scope: &Scope) -> Result<(), CaptureError> {
    fn map<'a, K: aya::Pod>(
        ebpf: &'a mut Ebpf,
        name: &'static str,
    ) -> Result<BpfHashMap<&'a mut MapData, K, u8>, CaptureError> {
        let m = ebpf.map_mut(name).ok_or(CaptureError::MissingMap(name))?;
        BpfHashMap::try_from(m).map_err(CaptureError::map(name))
    }
    let mut cgroups = map::<u64>(ebpf, names::SCOPE_CGROUPS)?;
    for c in &scope.cgroups {
        cgroups
            .insert(&c.id, &1u8, 0)
            .map_err(CaptureError::map(names::SCOPE_CGROUPS))?;
    }
    let mut netns = map::<u32>(ebpf, names::SCOPE_NETNS)?;
    for n in &scope.netns {
        netns
            .insert(n, &1u8, 0)
            .map_err(CaptureError::map(names::SCOPE_NETNS))?;
    }
    Ok(())
}

/// Writes `config` into the object's `CONFIG` map (before any program is attached).
pub(super) fn write_config(ebpf: &mut Ebpf, config: &Config) -> Result<(), CaptureError> {
    let map = ebpf
        .map_mut(names::CONFIG)
        .ok_or(CaptureError::MissingMap(names::CONFIG))?;
    let mut arr: Array<&mut MapData, Config> =
        Array::try_from(map).map_err(CaptureError::map(names::CONFIG))?;
    arr.set(0, config, 0)
        .map_err(CaptureError::map(names::CONFIG))
}

/// Every program aya loaded must be one of `specs` (the capture knows where it goes): a program
/// nobody attaches is an error, not a silent gap.
pub(super) fn check_accounted(ebpf: &Ebpf, specs: &[ProgramSpec]) -> Result<(), CaptureError> {
    for (name, _) in ebpf.programs() {
        if !specs.iter().any(|s| s.name == name) {
            return Err(CaptureError::Programs(ProgramsError::Unattachable {
                program: name.to_string(),
                section: "(not recognised as a program section)".to_string(),
            }));
        }
    }
    Ok(())
}

/// The tracepoint programs attached at load, and those the capture runs without.
#[derive(Debug, Default)]
pub(super) struct Attached {
    pub count: usize,
    pub gaps: Vec<Gap>,
}

/// Attaches every program whose hook is fixed (tracepoints). One that the kernel has no
/// tracepoint for, or that does not load or attach, is a [`Gap`] unless the capture needs it
/// ([`gaps::required`]), which fails the load. Uprobe families are attached per file of their
/// target by their own module, later (`tls` for libssl).
pub(super) fn attach_fixed(
    ebpf: &mut Ebpf,
    specs: &[ProgramSpec],
) -> Result<Attached, CaptureError> {
    let events = tracefs_events();
    let mut attached = Attached::default();
    for spec in attach_order(specs) {
        match &spec.hook {
            Hook::Tracepoint { category, name } => {
                let tracepoint = format!("{category}/{name}");
                if !gaps::has_tracepoint(events.as_deref(), category, name) {
                    attached.gaps.push(gaps::absent(spec, tracepoint)?);
                    continue;
                }
                let outcome = attach_tracepoint(ebpf, &spec.name, category, name);
                match gaps::settle(spec, tracepoint, outcome)? {
                    Some(gap) => attached.gaps.push(gap),
                    None => attached.count += 1,
                }
            }
            Hook::Uprobe(u) => match u.target {
                UprobeTarget::Libssl
                | UprobeTarget::Go
                | UprobeTarget::GoReturns
                | UprobeTarget::Calibrate => {}
            },
        }
    }
    Ok(attached)
}

/// The order programs are attached in: consumers before producers. A program that removes what
/// another leaves in a map goes first (process exit, then the syscall exits, then the socket
/// state changes the exits of accept read, then the syscall entries), so nothing is left behind
/// while the programs go in one by one. Attached by name instead (every entry, then every exit),
/// the lab's verdict precision fell from 99–100% to 55–85% and the gRPC hop lost its verdicts:
/// loading 39 programs takes seconds, and what the early ones recorded without their later
/// partners stayed wrong for the whole run.
pub(super) fn attach_order(specs: &[ProgramSpec]) -> Vec<&ProgramSpec> {
    let mut ordered: Vec<&ProgramSpec> = specs.iter().collect();
    ordered.sort_by_key(|s| attach_rank(s));
    ordered
}

fn attach_rank(s: &ProgramSpec) -> u8 {
    match &s.hook {
        Hook::Tracepoint { category, .. } if category == "sched" => 0,
        Hook::Tracepoint { name, .. } if name.starts_with("sys_exit_") => 1,
        Hook::Tracepoint { category, .. } if category == "sock" => 2,
        _ => 3,
    }
}

/// The kernel's ENOTSUPP (not userspace's EOPNOTSUPP): what `bpf_prog_load` returns when the
/// JIT fails on a program the verifier accepted and the interpreter is not built in.
const ENOTSUPP: i32 = 524;

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|r| r.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Why a program did not load, told apart: refused by the verifier (its log says why), or
/// accepted and then failed by the kernel's JIT, or anything else.
pub(super) fn load_error(prog: &str, e: ProgramError) -> CaptureError {
    match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            // A verifier refusal is EINVAL or EACCES; ENOTSUPP comes after it, from the JIT.
            let jit = io_error.raw_os_error() == Some(ENOTSUPP);
            let log = verifier_log.to_string();
            let source = Box::new(ProgramError::LoadError {
                io_error,
                verifier_log,
            });
            if jit {
                CaptureError::Jit {
                    program: prog.to_string(),
                    kernel: kernel_release(),
                    source,
                }
            } else {
                CaptureError::Verifier {
                    program: prog.to_string(),
                    log,
                    source,
                }
            }
        }
        source => CaptureError::program(prog)(source),
    }
}

fn attach_tracepoint(
    ebpf: &mut Ebpf,
    prog: &str,
    category: &str,
    tp: &str,
) -> Result<(), CaptureError> {
    let program = ebpf
        .program_mut(prog)
        .ok_or(ProgramError::NotLoaded)
        .map_err(CaptureError::program(prog))?;
    let program: &mut TracePoint = program.try_into().map_err(CaptureError::program(prog))?;
    program.load().map_err(|e| load_error(prog, e))?;
    program
        .attach(category, tp)
        .map_err(CaptureError::program(prog))?;
    Ok(())
}

pub(super) fn take_map(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<aya::maps::Map, CaptureError> {
    ebpf.take_map(name).ok_or(CaptureError::MissingMap(name))
}

/// The agent's executable as the kernel names it: (inode number, `s_dev`). `stat` encodes the
/// device for userspace; the kernel's `dev_t` is `major << 20 | minor`.
fn own_exe_kernel_id() -> Option<(u64, u32)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata("/proc/self/exe").ok()?;
    let dev = m.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    Some((m.ino(), (major << 20) | (minor & 0xfffff)))
}

/// The tracefs `events` directory, where it is mounted (`preflight` mounts it when missing).
pub(super) fn tracefs_events() -> Option<PathBuf> {
    [
        "/sys/kernel/tracing/events",
        "/sys/kernel/debug/tracing/events",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.is_dir())
}

/// Names the first missing prerequisite instead of letting the bpf() syscall fail obscurely.
pub(super) fn preflight() -> Result<(), CaptureError> {
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
        let mut it = release
            .trim()
            .split(['.', '-'])
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
        if (major, minor) < (5, 8) {
            return Err(CaptureError::KernelTooOld(release.trim().to_string()));
        }
    }
    if tracefs_events().is_none() {
        if mount("tracefs", "/sys/kernel/tracing", "tracefs") && tracefs_events().is_some() {
            tracing::info!("mounted tracefs at /sys/kernel/tracing");
        } else {
            return Err(CaptureError::TracefsNotMounted);
        }
    }
    // Nothing is pinned, so bpffs is optional; mount it when missing as the usual set-up expects.
    if std::fs::read_dir("/sys/fs/bpf")
        .map(|mut d| d.next().is_none())
        .unwrap_or(true)
        && !is_bpffs("/sys/fs/bpf")
        && !mount("bpf", "/sys/fs/bpf", "bpf")
    {
        tracing::warn!(
            "bpffs is not mounted at /sys/fs/bpf (mount -t bpf bpf /sys/fs/bpf); not needed: nothing is pinned"
        );
    }
    Ok(())
}

fn is_bpffs(path: &str) -> bool {
    const BPF_FS_MAGIC: i64 = 0xcafe4a11;
    let Ok(c) = std::ffi::CString::new(path) else {
        return false;
    };
    // SAFETY: statfs writes into the zeroed struct we own; the path is NUL-terminated.
    unsafe {
        let mut s: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut s) == 0 && s.f_type as i64 == BPF_FS_MAGIC
    }
}

fn mount(source: &str, target: &str, fstype: &str) -> bool {
    let (Ok(s), Ok(t), Ok(f)) = (
        std::ffi::CString::new(source),
        std::ffi::CString::new(target),
        std::ffi::CString::new(fstype),
    ) else {
        return false;
    };
    // SAFETY: all strings are NUL-terminated and outlive the call; no data argument.
    unsafe { libc::mount(s.as_ptr(), t.as_ptr(), f.as_ptr(), 0, std::ptr::null()) == 0 }
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK.
pub(super) fn raise_memlock() {
    let rl = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall with a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rl) } != 0 {
        tracing::debug!("could not raise RLIMIT_MEMLOCK");
    }
}
