//! fd reuse hygiene: an fd closed behind our back (close_range, exec, a missed close) must not
//! keep its CONNS entry, or the file/pipe that reuses the number would be traced as TCP.
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};
use retry_common::ConnKey;

use super::conn::forget_fd;
use crate::{
    ctx::{arg, exit_ret},
    maps::CONNS,
};

#[inline(always)]
fn try_exit_new_fd(ctx: &TracePointContext) -> Result<(), i32> {
    let ret = exit_ret(ctx)?;
    if ret >= 0 {
        forget_fd(bpf_get_current_pid_tgid(), ret as u32);
    }
    Ok(())
}

/// Syscalls that return a new fd: whatever that number was tracked as is gone.
macro_rules! new_fd_programs {
    ($($prog:ident, $tp:literal;)*) => {$(
        #[tracepoint(category = "syscalls", name = $tp)]
        pub fn $prog(ctx: TracePointContext) -> u32 {
            let _ = try_exit_new_fd(&ctx);
            0
        }
    )*};
}

new_fd_programs! {
    ra_exit_openat, "sys_exit_openat";
    ra_exit_socket, "sys_exit_socket";
    ra_exit_dup, "sys_exit_dup";
}

/// dup2/dup3(oldfd, newfd): newfd is closed first; if oldfd is tracked, newfd becomes the same
/// connection (inetd-style redirection).
#[inline(always)]
fn try_enter_dup2(ctx: &TracePointContext) -> Result<(), i32> {
    let oldfd = arg(ctx, 0)? as u32;
    let newfd = arg(ctx, 1)? as u32;
    if oldfd == newfd {
        return Ok(());
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    forget_fd(pid_tgid, newfd);
    let tgid = (pid_tgid >> 32) as u32;
    if let Some(p) = CONNS.get_ptr(&ConnKey { tgid, fd: oldfd }) {
        // SAFETY: copied out of the map value.
        let info = unsafe { *p };
        let _ = CONNS.insert(&ConnKey { tgid, fd: newfd }, &info, 0);
    }
    Ok(())
}

#[tracepoint(category = "syscalls", name = "sys_enter_dup2")]
pub fn ra_enter_dup2(ctx: TracePointContext) -> u32 {
    let _ = try_enter_dup2(&ctx);
    0
}

#[tracepoint(category = "syscalls", name = "sys_enter_dup3")]
pub fn ra_enter_dup3(ctx: TracePointContext) -> u32 {
    let _ = try_enter_dup2(&ctx);
    0
}
