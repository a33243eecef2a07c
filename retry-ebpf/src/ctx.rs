//! Reading what a program is given: tracepoint arguments, the clock, user memory, and kernel
//! structs through the BTF offsets userspace found.
use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_user},
    programs::TracePointContext,
};

use crate::config::config;

/// Syscall tracepoint layout: 8 bytes of common header and syscall nr, then 8-byte arguments.
#[inline(always)]
pub fn arg(ctx: &TracePointContext, n: usize) -> Result<u64, i32> {
    // SAFETY: reads the tracepoint record through bpf_probe_read_kernel; offsets from the format files.
    unsafe { ctx.read_at::<u64>(16 + 8 * n) }
}

#[inline(always)]
pub fn exit_ret(ctx: &TracePointContext) -> Result<i64, i32> {
    // SAFETY: as `arg`; sys_exit_* has `long ret` at 16.
    unsafe { ctx.read_at::<i64>(16) }
}

#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: no preconditions.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
pub fn read_user<T>(addr: u64) -> Result<T, i32> {
    // SAFETY: bpf_probe_read_user validates the user address; failure is an error, not a fault.
    unsafe { bpf_probe_read_user(addr as *const T) }.map_err(|e| e as i32)
}

/// A pointer-sized kernel field at `addr` (0 for a null `addr` or a failed read), so a chain of
/// BTF-offset reads stops quietly at the first missing link.
#[inline(always)]
pub fn read_kernel_u64(addr: u64) -> u64 {
    if addr == 0 {
        return 0;
    }
    // SAFETY: bpf_probe_read_kernel tolerates bad addresses (returns an error).
    unsafe { bpf_probe_read_kernel(addr as *const u64) }.unwrap_or(0)
}

/// Whether BTF gave the offsets [`sock_of_fd`] walks (without them it always says 0).
#[inline(always)]
pub fn fd_walk_known() -> bool {
    let c = config();
    c.offsets.task_files != 0 && c.offsets.files_fdt != 0 && c.offsets.fdt_fd != 0 && c.offsets.file_private_data != 0
}

/// `struct sock *` behind `fd` of the current task, via BTF offsets from userspace (0 if unknown).
#[inline(always)]
pub fn sock_of_fd(fd: u32) -> u64 {
    let c = config();
    if c.offsets.task_files == 0 || c.offsets.files_fdt == 0 || c.offsets.fdt_fd == 0 || c.offsets.file_private_data == 0 {
        return 0;
    }
    let read = read_kernel_u64;
    // SAFETY: no preconditions; the pointer is only used through probe reads.
    let task = unsafe { bpf_get_current_task() };
    let files = read(task + c.offsets.task_files as u64);
    let fdt = read(files + c.offsets.files_fdt as u64);
    let fds = read(fdt + c.offsets.fdt_fd as u64);
    if fds == 0 {
        return 0;
    }
    let file = read(fds + 8 * fd as u64);
    let socket = read(file + c.offsets.file_private_data as u64);
    read(socket + c.offsets.socket_sk as u64)
}

/// `sk->sk_err` (0 when BTF gave no offset).
#[inline(always)]
pub fn sk_err(skaddr: u64) -> i32 {
    let off = config().offsets.sk_err;
    if off == 0 || off > 4096 {
        return 0;
    }
    // SAFETY: bpf_probe_read_kernel tolerates a bad address (returns an error).
    unsafe { bpf_probe_read_kernel((skaddr + off as u64) as *const i32) }.unwrap_or(0)
}
