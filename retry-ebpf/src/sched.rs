//! Process lifetime: exit (every thread cleans up what a syscall it never returned from left
//! behind; the whole process reports its exit) and exec (userspace re-reads comm/exe).
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};
use retry_common::{KIND_PROCESS_EXEC, KIND_PROCESS_EXIT};

use crate::{
    emit::emit_process,
    maps::{ACCEPT_ARGS, AGENT_TGIDS, CONNECT_ARGS, SSL_ARGS},
};

#[inline(always)]
fn try_process_exit(ctx: &TracePointContext) -> Result<(), i32> {
    // Every exiting thread: drop what a syscall it never returned from left behind.
    let tid_key = bpf_get_current_pid_tgid();
    let _ = CONNECT_ARGS.remove(&tid_key);
    let _ = ACCEPT_ARGS.remove(&tid_key);
    let _ = SSL_ARGS.remove(&tid_key);
    // SAFETY: `bool group_dead` at 32 in sched_process_exit's format.
    let group_dead: u8 = unsafe { ctx.read_at(32)? };
    if group_dead == 0 {
        return Ok(());
    }
    let _ = AGENT_TGIDS.remove(&((tid_key >> 32) as u32));
    crate::syscalls::fork::at_exit((tid_key >> 32) as u32);
    emit_process(KIND_PROCESS_EXIT, bpf_get_current_pid_tgid());
    Ok(())
}

#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn ra_process_exit(ctx: TracePointContext) -> u32 {
    let _ = try_process_exit(&ctx);
    0
}

/// exec replaces comm/exe: userspace re-reads the metadata of processes it already described.
#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn ra_process_exec(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    // A new image is judged anew by userspace.
    let _ = AGENT_TGIDS.remove(&((pid_tgid >> 32) as u32));
    crate::syscalls::fork::after_exec(pid_tgid);
    emit_process(KIND_PROCESS_EXEC, pid_tgid);
    0
}
