//! Reading what a program is given: tracepoint arguments, the clock, user memory, and kernel
//! structs through the BTF offsets userspace found.
use aya_ebpf::{
    EbpfContext,
    bindings::pt_regs,
    helpers::{
        bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_user,
        generated,
    },
    programs::TracePointContext,
};

use crate::config::config;

/// Syscall tracepoint layout: 8 bytes of common header and syscall nr, then 8-byte arguments.
/// Loaded from the context directly (no probe-read helper call): the kernel refuses to attach a
/// program that reads past its tracepoint's record, so a wrong offset fails at load, not later.
#[inline(always)]
pub fn arg(ctx: &TracePointContext, n: usize) -> Result<u64, i32> {
    // SAFETY: the context is the tracepoint record; offsets from the format files.
    Ok(unsafe { core::ptr::read((ctx.as_ptr() as *const u8).add(16 + 8 * n) as *const u64) })
}

#[inline(always)]
pub fn exit_ret(ctx: &TracePointContext) -> Result<i64, i32> {
    // SAFETY: as `arg`; sys_exit_* has `long ret` at 16.
    Ok(unsafe { core::ptr::read((ctx.as_ptr() as *const u8).add(16) as *const i64) })
}

/// The first three arguments of the current syscall, read from the registers the task entered
/// the kernel with. The syscall leaves them as they were (strace reads them at syscall-exit-stop
/// the same way), so an exit program needs no entry program to remember them. x86-64 layout
/// (di, si, dx), like the Go probes' r14; syscall tracepoints never fire for ia32 calls.
#[derive(Clone, Copy)]
pub struct SyscallArgs {
    pub arg0: u64,
    pub arg1: u64,
    pub arg2: u64,
}

#[inline(always)]
pub fn syscall_args() -> Result<SyscallArgs, i32> {
    // SAFETY: the helpers take the current task; the pt_regs they return is only read through
    // bpf_probe_read_kernel, which fails cleanly on a bad address.
    unsafe {
        let regs =
            generated::bpf_task_pt_regs(generated::bpf_get_current_task_btf()) as *const pt_regs;
        // dx, si, di are adjacent in pt_regs: one read.
        let [dx, si, di]: [u64; 3] =
            bpf_probe_read_kernel(core::ptr::addr_of!((*regs).rdx) as *const [u64; 3])?;
        Ok(SyscallArgs {
            arg0: di,
            arg1: si,
            arg2: dx,
        })
    }
}

#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: no preconditions.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
pub fn read_user<T>(addr: u64) -> Result<T, i32> {
    // SAFETY: bpf_probe_read_user validates the user address; failure is an error, not a fault.
    unsafe { bpf_probe_read_user(addr as *const T) }
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
    c.offsets.task_files != 0
        && c.offsets.files_fdt != 0
        && c.offsets.fdt_fd != 0
        && c.offsets.file_private_data != 0
}

/// `struct sock *` behind `fd` of the current task, via BTF offsets from userspace (0 if unknown).
#[inline(always)]
pub fn sock_of_fd(fd: u32) -> u64 {
    let c = config();
    if c.offsets.task_files == 0
        || c.offsets.files_fdt == 0
        || c.offsets.fdt_fd == 0
        || c.offsets.file_private_data == 0
    {
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
