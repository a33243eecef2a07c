//! The settings userspace writes into `CONFIG` before attaching, and what they decide.
use aya_ebpf::helpers::{
    bpf_get_current_ancestor_cgroup_id, bpf_get_current_task, bpf_probe_read_kernel,
};
use retry_common::{Config, MAX_CGROUP_LEVELS, config_flags};

use crate::maps::{AGENT_TGIDS, CONFIG, SCOPE_CGROUPS, SCOPE_NETNS};

#[inline(always)]
pub fn config() -> Config {
    CONFIG.get(0).copied().unwrap_or_default()
}

/// The agent itself, or a process of its binary (a shim, a CLI call): a proxy hop is not a
/// service, and observing it would put a fake one between every caller and callee it steers.
#[inline(always)]
pub fn is_agent(pid_tgid: u64) -> bool {
    let c = config();
    if c.agent_tgid != 0 && (pid_tgid >> 32) as u32 == c.agent_tgid {
        return true;
    }
    // Not by name: any workload could take the agent's name and hide. By executable: the
    // agent's own file here (catches short-lived CLI calls before userspace could look), and
    // any process userspace found running it or a byte-identical copy.
    if runs_agent_file(&c) {
        return true;
    }
    // SAFETY: the value is a plain byte; only its presence is read.
    unsafe { AGENT_TGIDS.get(&((pid_tgid >> 32) as u32)) }.is_some()
}

/// Whether the current task's `mm->exe_file` is the agent's executable (by inode and device).
#[inline(always)]
fn runs_agent_file(c: &Config) -> bool {
    if c.exe_ino == 0
        || c.offsets.task_mm == 0
        || c.offsets.mm_exe_file == 0
        || c.offsets.file_inode == 0
        || c.offsets.inode_sb == 0
    {
        return false;
    }
    let read = crate::ctx::read_kernel_u64;
    // SAFETY: no preconditions; the pointer is only used through probe reads.
    let task = unsafe { bpf_get_current_task() };
    let mm = read(task + c.offsets.task_mm as u64);
    let file = read(mm + c.offsets.mm_exe_file as u64);
    let inode = read(file + c.offsets.file_inode as u64);
    if inode == 0 || read(inode + c.offsets.inode_ino as u64) != c.exe_ino {
        return false;
    }
    let sb = read(inode + c.offsets.inode_sb as u64);
    if sb == 0 {
        return false;
    }
    // SAFETY: as above; s_dev is a u32 (dev_t).
    let dev: u32 =
        unsafe { bpf_probe_read_kernel((sb + c.offsets.sb_dev as u64) as *const u32) }.unwrap_or(0);
    dev == c.exe_dev
}

/// Whether the current task is inside the part of the machine this agent observes
/// (`--capture-cgroup`, `--capture-netns`; no scope: everything). Asked only at connect and
/// accept: a socket made outside stays untracked, so its I/O costs one failed lookup.
#[inline(always)]
pub fn in_scope(c: &Config) -> bool {
    if c.flags & config_flags::SCOPE_CGROUP != 0 && !in_scoped_cgroup(c) {
        return false;
    }
    if c.flags & config_flags::SCOPE_NETNS != 0 && !in_scoped_netns(c) {
        return false;
    }
    true
}

/// The current task's cgroup or one of its ancestors (down from level 1) is in `SCOPE_CGROUPS`.
#[inline(always)]
fn in_scoped_cgroup(c: &Config) -> bool {
    let mut level = 1u32;
    while level <= MAX_CGROUP_LEVELS && level <= c.cgroup_levels {
        // SAFETY: no preconditions; 0 once the task's cgroup is shallower than `level`.
        let id = unsafe { bpf_get_current_ancestor_cgroup_id(level as i32) };
        if id == 0 {
            return false;
        }
        // SAFETY: the value is a plain byte; only its presence is read.
        if unsafe { SCOPE_CGROUPS.get(&id) }.is_some() {
            return true;
        }
        level += 1;
    }
    false
}

/// The current task's network namespace (`task->nsproxy->net_ns->ns.inum`) is in `SCOPE_NETNS`.
/// Unknown offsets: out of scope (userspace refuses a netns scope without them).
#[inline(always)]
fn in_scoped_netns(c: &Config) -> bool {
    let o = &c.offsets;
    if o.task_nsproxy == 0 || o.nsproxy_net_ns == 0 || o.ns_inum == 0 {
        return false;
    }
    let read = crate::ctx::read_kernel_u64;
    // SAFETY: no preconditions; the pointer is only used through probe reads.
    let task = unsafe { bpf_get_current_task() };
    let nsproxy = read(task + o.task_nsproxy as u64);
    let net = read(nsproxy + o.nsproxy_net_ns as u64);
    if net == 0 {
        return false;
    }
    // SAFETY: bpf_probe_read_kernel tolerates a bad address; inum is an unsigned int.
    let inum: u32 =
        unsafe { bpf_probe_read_kernel((net + o.net_ns as u64 + o.ns_inum as u64) as *const u32) }
            .unwrap_or(0);
    // SAFETY: as above.
    inum != 0 && unsafe { SCOPE_NETNS.get(&inum) }.is_some()
}
