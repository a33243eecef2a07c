//! Sockets inherited across fork: a server that accepts in a parent and serves in a forked
//! child (busybox httpd, inetd, Python's ForkingMixIn, many PHP/Perl servers) does its I/O in a
//! process whose fds were never tracked.
//!
//! Nothing here runs on the data syscalls: their untracked-fd path stays one `CONNS` lookup.
//! Instead the hand-over is done at fork, for the one connection that pattern passes on — the
//! one the parent accepted last, if still open:
//! - accept (`conn`) remembers it per process (`LAST_ACCEPT`);
//! - `sched:sched_process_fork` fires in the parent before the child can run (so a parent that
//!   closes its copy at once cannot race the child) and hands the entry to the child's pid
//!   (`INHERITED`);
//! - the child's first return from the fork (`sys_exit_clone*`, `fork`, `vfork` with 0) checks
//!   that its fd is the same socket (a `CLONE_FILES` child shares the parent's table) and
//!   adopts it under a new generation: tracked, owned (`SOCKS`), reported as an accept, and
//!   remembered, so a grandchild (a CGI process) inherits it too. A new thread drops its entry:
//!   it shares its process's table.
//! - exec closes close-on-exec fds: an adopted fd that is no longer that socket is forgotten.
//!
//! Not covered: other inherited fds (a connection the parent accepted earlier, or connected).
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};
use retry_common::{ConnInfo, ConnKey, SockOwner, conn_kind};

use super::conn::forget_fd;
use crate::{
    ctx::{exit_ret, fd_walk_known, now, sock_of_fd},
    emit::emit_conn_from,
    maps::{CONNS, INHERITED, Inherited, LAST_ACCEPT, LastAccept, SOCKS},
};

/// Called by accept's exit for every tracked connection it accepted.
#[inline(always)]
pub(super) fn remember_accept(tgid: u32, fd: u32, generation: u64) {
    let _ = LAST_ACCEPT.insert(
        &tgid,
        &LastAccept {
            generation,
            fd,
            _pad: 0,
        },
        0,
    );
}

/// The current process's last accepted connection, if that fd still tracks it.
#[inline(always)]
fn last_accepted(tgid: u32) -> Option<ConnInfo> {
    // SAFETY: copied out of the map value.
    let last = unsafe { LAST_ACCEPT.get(&tgid) }.copied()?;
    // SAFETY: as above.
    let info = unsafe { *CONNS.get_ptr(&ConnKey { tgid, fd: last.fd })? };
    (info.generation == last.generation).then_some(info)
}

/// Whether the current task's `fd` is the socket `info` tracks (true when that cannot be told).
#[inline(always)]
fn same_socket(info: &ConnInfo) -> bool {
    if info.skaddr == 0 || !fd_walk_known() {
        return true;
    }
    sock_of_fd(info.fd) == info.skaddr
}

#[inline(always)]
fn try_process_fork(ctx: &TracePointContext) -> Result<(), i32> {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let Some(info) = last_accepted(tgid) else {
        return Ok(());
    };
    // SAFETY: `pid_t child_pid` at 20 in sched_process_fork's format.
    let child: i32 = unsafe { ctx.read_at(20)? };
    INHERITED.insert(
        &(child as u32),
        &Inherited {
            info,
            parent: tgid,
            _pad: 0,
        },
        0,
    )
}

#[tracepoint(category = "sched", name = "sched_process_fork")]
pub fn ra_process_fork(ctx: TracePointContext) -> u32 {
    let _ = try_process_fork(&ctx);
    0
}

#[inline(always)]
fn try_exit_fork(ctx: &TracePointContext) -> Result<(), i32> {
    // The parent sees the child's pid (or an error); only the child returns 0.
    if exit_ret(ctx)? != 0 {
        return Ok(());
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    let (info, parent) = match INHERITED.get_ptr(&tid) {
        // SAFETY: copied out before removal.
        Some(p) => unsafe { ((*p).info, (*p).parent) },
        None => return Ok(()),
    };
    let _ = INHERITED.remove(&tid);
    if tid != tgid || !same_socket(&info) {
        return Ok(());
    }
    let generation = now();
    let adopted = ConnInfo { generation, ..info };
    CONNS.insert(&ConnKey { tgid, fd: info.fd }, &adopted, 0)?;
    remember_accept(tgid, info.fd, generation);
    if info.skaddr != 0 {
        // The child serves it now: resets seen in softirq context are its connection's.
        let owner = SockOwner {
            pid_tgid,
            generation,
            fd: info.fd,
            role: info.role,
            flags: 0,
            errno: 0,
            tuple: info.tuple,
        };
        let _ = SOCKS.insert(&info.skaddr, &owner, 0);
    }
    // To userspace an adopted connection is one the child accepted (a server connection seen
    // from its start: the parent passes it on before reading), forked from `parent` (userspace
    // describes a child gone before /proc was read by its parent).
    emit_conn_from(
        conn_kind::ACCEPT,
        pid_tgid,
        info.fd,
        info.role,
        0,
        (0, 0),
        generation,
        &info.tuple,
        parent,
    );
    Ok(())
}

/// glibc's fork() is clone(2); posix_spawn uses clone3 or vfork.
macro_rules! fork_exit_programs {
    ($($prog:ident, $tp:literal;)*) => {$(
        #[tracepoint(category = "syscalls", name = $tp)]
        pub fn $prog(ctx: TracePointContext) -> u32 {
            let _ = try_exit_fork(&ctx);
            0
        }
    )*};
}

fork_exit_programs! {
    ra_exit_clone, "sys_exit_clone";
    ra_exit_clone3, "sys_exit_clone3";
    ra_exit_fork, "sys_exit_fork";
    ra_exit_vfork, "sys_exit_vfork";
}

/// After exec (`sched`): close-on-exec fds are closed by now; an adopted or accepted fd that
/// is no longer its socket is forgotten, so whatever reuses the number is not traced as TCP.
#[inline(always)]
pub fn after_exec(pid_tgid: u64) {
    let tgid = (pid_tgid >> 32) as u32;
    if let Some(info) = last_accepted(tgid)
        && info.skaddr != 0
        && fd_walk_known()
        && sock_of_fd(info.fd) != info.skaddr
    {
        forget_fd(pid_tgid, info.fd);
    }
}

/// At exit (`sched`): the process's hand-over entry goes. dup2 aliases are unknown to
/// userspace (which removes the fds it was told of); inetd-style children put them on stdio.
#[inline(always)]
pub fn at_exit(tgid: u32) {
    let _ = LAST_ACCEPT.remove(&tgid);
    for fd in 0..3 {
        let _ = CONNS.remove(&ConnKey { tgid, fd });
    }
}
