//! The settings userspace writes into `CONFIG` before attaching, and what they decide.
use aya_ebpf::helpers::{bpf_get_current_task, bpf_probe_read_kernel};
use retry_common::Config;

use crate::maps::CONFIG;

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
    if c.ignore_comm[0] == 0 || c.task_group_leader == 0 || c.task_comm == 0 {
        return false;
    }
    // The main thread's name: worker threads carry their own (tokio-runtime-w).
    // SAFETY: kernel reads through the checked helper; offsets from BTF.
    let leader: u64 = match unsafe { bpf_probe_read_kernel((bpf_get_current_task() + c.task_group_leader as u64) as *const u64) } {
        Ok(l) => l,
        Err(_) => return false,
    };
    // SAFETY: as above.
    let comm: [u8; 16] = match unsafe { bpf_probe_read_kernel((leader + c.task_comm as u64) as *const [u8; 16]) } {
        Ok(x) => x,
        Err(_) => return false,
    };
    let mut i = 0;
    while i < 16 {
        if comm[i] != c.ignore_comm[i] {
            return false;
        }
        if comm[i] == 0 {
            return true;
        }
        i += 1;
    }
    true
}
