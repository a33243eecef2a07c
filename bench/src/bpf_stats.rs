//! The kernel's run-time statistics of eBPF programs (`kernel.bpf_stats_enabled`): how much of
//! the workload's CPU the programs themselves take, which the agent's own CPU figure leaves out
//! (programs run in the context of the task that made the syscall).
use std::path::Path;

const SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Statistics on while this lives; the previous setting comes back on drop. Counting costs two
/// clock reads per program run, so the bench turns it on for every probed run (floor and agent)
/// alike.
pub(crate) struct StatsOn {
    previous: Option<String>,
}

impl StatsOn {
    pub(crate) fn enable() -> StatsOn {
        let previous = std::fs::read_to_string(SYSCTL).ok();
        if std::fs::write(SYSCTL, "1").is_err() {
            eprintln!("bench overhead: cannot enable {SYSCTL}: no eBPF time per request");
        }
        StatsOn { previous }
    }
}

impl Drop for StatsOn {
    fn drop(&mut self) {
        if let Some(p) = &self.previous {
            let _ = std::fs::write(SYSCTL, p.trim());
        }
    }
}

/// Nanoseconds the programs behind `pid`'s open program fds have run so far (0 when statistics
/// are off or the process is gone). A program is counted once per fd the process holds on it;
/// the agent holds one each.
pub(crate) fn run_time_ns(pid: u32) -> u64 {
    let dir = Path::new("/proc").join(pid.to_string()).join("fdinfo");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter(|info| info.contains("prog_tag:"))
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("run_time_ns:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .sum()
}
