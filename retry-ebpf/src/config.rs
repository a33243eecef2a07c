//! The settings userspace writes into `CONFIG` before attaching, and what they decide.
use aya_ebpf::helpers::{bpf_get_current_task, bpf_probe_read_kernel};
use retry_common::Config;

use crate::maps::{AGENT_TGIDS, CONFIG};

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
    if c.exe_ino == 0 || c.offsets.task_mm == 0 || c.offsets.mm_exe_file == 0 || c.offsets.file_inode == 0 || c.offsets.inode_sb == 0 {
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
    let dev: u32 = unsafe { bpf_probe_read_kernel((sb + c.offsets.sb_dev as u64) as *const u32) }.unwrap_or(0);
    dev == c.exe_dev
}
