//! The kernel's run-time statistics of eBPF programs (`kernel.bpf_stats_enabled`): how much of
//! the workload's CPU the programs themselves take, which the agent's own CPU figure leaves out
//! (programs run in the context of the task that made the syscall).
use std::{collections::BTreeMap, path::Path};

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

/// Run time and run count of one program, as the kernel counts them.
#[derive(Clone, Debug, Default)]
pub(crate) struct ProgStats {
    pub(crate) name: String,
    pub(crate) run_time_ns: u64,
    pub(crate) run_cnt: u64,
}

/// The programs behind `pid`'s open program fds, by program id (empty when the process is
/// gone). A program is listed once however many fds the process holds on it.
pub(crate) fn programs(pid: u32) -> BTreeMap<u32, ProgStats> {
    let dir = Path::new("/proc").join(pid.to_string()).join("fdinfo");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    let field = |info: &str, key: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let mut progs = BTreeMap::new();
    for info in entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        // Program fds; a link fd names its program too, without the counts.
        .filter(|info| info.contains("prog_tag:") && info.contains("run_cnt:"))
    {
        let Some(id) = field(&info, "prog_id:").and_then(|v| u32::try_from(v).ok()) else {
            continue;
        };
        progs.insert(
            id,
            ProgStats {
                name: String::new(),
                run_time_ns: field(&info, "run_time_ns:").unwrap_or(0),
                run_cnt: field(&info, "run_cnt:").unwrap_or(0),
            },
        );
    }
    // fdinfo has no names; the kernel's program list does.
    for info in aya::programs::loaded_programs().flatten() {
        if let Some(p) = progs.get_mut(&info.id()) {
            p.name = info.name_as_str().unwrap_or("?").to_owned();
        }
    }
    progs
}

/// What each program ran between two snapshots: (name, runs, ns), dearest first.
pub(crate) fn delta(
    before: &BTreeMap<u32, ProgStats>,
    after: &BTreeMap<u32, ProgStats>,
) -> Vec<(String, u64, u64)> {
    let mut d: Vec<(String, u64, u64)> = after
        .iter()
        .filter_map(|(id, a)| {
            let (cnt0, ns0) = before
                .get(id)
                .map_or((0, 0), |b| (b.run_cnt, b.run_time_ns));
            let runs = a.run_cnt.saturating_sub(cnt0);
            (runs > 0).then(|| (a.name.clone(), runs, a.run_time_ns.saturating_sub(ns0)))
        })
        .collect();
    d.sort_by_key(|p| std::cmp::Reverse(p.2));
    d
}
