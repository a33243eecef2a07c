//! Data syscalls: read/write, readv/writev, send*/recv* (+ mmsg), and sendfile/splice (counted:
//! zero-copy bytes are never captured). Entry saves the arguments of tracked fds; exit emits the
//! data record (or a reset on ECONNRESET/EPIPE).
use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext};
use retry_common::{ConnKey, IoArgs, arg_map, conn_kind, syscall};

use crate::{
    ctx::{arg, exit_ret, now, read_user},
    emit::{Src, emit_conn, emit_data},
    errno::{ECONNRESET, EPIPE},
    maps::{CONNS, IO_ARGS, arg_insert_failed},
    uprobes::libssl,
};

#[inline(always)]
fn try_enter_io(ctx: &TracePointContext, sc: u32) -> Result<(), i32> {
    let fd = arg(ctx, 0)? as u32;
    let pid_tgid = bpf_get_current_pid_tgid();
    let key = ConnKey { tgid: (pid_tgid >> 32) as u32, fd };
    if CONNS.get_ptr(&key).is_none() {
        return Ok(());
    }
    if libssl::inside_ssl_call(pid_tgid, fd) {
        return Ok(());
    }
    let args = IoArgs { buf: arg(ctx, 1)?, ts_enter_ns: now(), fd, syscall: sc };
    IO_ARGS.insert(&pid_tgid, &args, 0).map_err(|e| arg_insert_failed(arg_map::IO, e))
}

/// Where the bytes are and how many the syscall moved in total.
#[inline(always)]
fn payload_source(a: &IoArgs, ret: i64) -> Result<(Src, u64), i32> {
    let total = ret as u64;
    match a.syscall {
        syscall::READV | syscall::WRITEV => Ok((Src::Iov(a.buf), total)),
        // struct user_msghdr: msg_iov at 16.
        syscall::SENDMSG | syscall::RECVMSG => Ok((Src::Iov(read_user(a.buf + 16)?), total)),
        syscall::SENDMMSG | syscall::RECVMMSG => {
            // struct mmsghdr: msg_hdr (56 bytes) then msg_len; only the first message is reported.
            let msg_len: u32 = read_user(a.buf + 56)?;
            Ok((Src::Iov(read_user(a.buf + 16)?), msg_len as u64))
        }
        syscall::SENDFILE | syscall::SPLICE_OUT | syscall::SPLICE_IN => Ok((Src::None, total)),
        _ => Ok((Src::Flat(a.buf), total)),
    }
}

#[inline(always)]
fn try_exit_io(ctx: &TracePointContext) -> Result<(), i32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let a = match IO_ARGS.get_ptr(&pid_tgid) {
        // SAFETY: the value is copied out before the entry is removed.
        Some(p) => unsafe { *p },
        None => return Ok(()),
    };
    let _ = IO_ARGS.remove(&pid_tgid);
    let ret = exit_ret(ctx)?;
    let key = ConnKey { tgid: (pid_tgid >> 32) as u32, fd: a.fd };
    let info = match CONNS.get_ptr(&key) {
        // SAFETY: copied out; a concurrent close only makes this record slightly stale.
        Some(p) => unsafe { *p },
        None => return Ok(()),
    };
    if ret <= 0 {
        if ret == -ECONNRESET || ret == -EPIPE {
            let states = (0, 0);
            emit_conn(conn_kind::RESET, pid_tgid, info.fd, info.role, (-ret) as i32, states, info.generation, &info.tuple);
        }
        return Ok(());
    }
    let (src, total) = payload_source(&a, ret)?;
    emit_data(pid_tgid, &key, &info, a.syscall, src, (ret, total), a.ts_enter_ns);
    Ok(())
}

/// One entry and one exit program per data syscall.
macro_rules! io_programs {
    ($($enter:ident, $exit:ident, $tp_enter:literal, $tp_exit:literal, $sc:expr;)*) => {$(
        #[tracepoint(category = "syscalls", name = $tp_enter)]
        pub fn $enter(ctx: TracePointContext) -> u32 {
            let _ = try_enter_io(&ctx, $sc);
            0
        }
        #[tracepoint(category = "syscalls", name = $tp_exit)]
        pub fn $exit(ctx: TracePointContext) -> u32 {
            let _ = try_exit_io(&ctx);
            0
        }
    )*};
}

io_programs! {
    ra_enter_sendfile, ra_exit_sendfile, "sys_enter_sendfile64", "sys_exit_sendfile64", syscall::SENDFILE;
    ra_enter_read, ra_exit_read, "sys_enter_read", "sys_exit_read", syscall::READ;
    ra_enter_write, ra_exit_write, "sys_enter_write", "sys_exit_write", syscall::WRITE;
    ra_enter_readv, ra_exit_readv, "sys_enter_readv", "sys_exit_readv", syscall::READV;
    ra_enter_writev, ra_exit_writev, "sys_enter_writev", "sys_exit_writev", syscall::WRITEV;
    ra_enter_sendto, ra_exit_sendto, "sys_enter_sendto", "sys_exit_sendto", syscall::SENDTO;
    ra_enter_recvfrom, ra_exit_recvfrom, "sys_enter_recvfrom", "sys_exit_recvfrom", syscall::RECVFROM;
    ra_enter_sendmsg, ra_exit_sendmsg, "sys_enter_sendmsg", "sys_exit_sendmsg", syscall::SENDMSG;
    ra_enter_recvmsg, ra_exit_recvmsg, "sys_enter_recvmsg", "sys_exit_recvmsg", syscall::RECVMSG;
    ra_enter_sendmmsg, ra_exit_sendmmsg, "sys_enter_sendmmsg", "sys_exit_sendmmsg", syscall::SENDMMSG;
    ra_enter_recvmmsg, ra_exit_recvmmsg, "sys_enter_recvmmsg", "sys_exit_recvmmsg", syscall::RECVMMSG;
}

/// splice(fd_in, off_in, fd_out, off_out, len, flags): whichever end is a tracked socket (a
/// socket-to-socket splice goes through a pipe, so one end is a pipe).
#[inline(always)]
fn try_enter_splice(ctx: &TracePointContext) -> Result<(), i32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let fd_out = arg(ctx, 2)? as u32;
    let fd_in = arg(ctx, 0)? as u32;
    let (fd, sc) = if CONNS.get_ptr(&ConnKey { tgid, fd: fd_out }).is_some() {
        (fd_out, syscall::SPLICE_OUT)
    } else if CONNS.get_ptr(&ConnKey { tgid, fd: fd_in }).is_some() {
        (fd_in, syscall::SPLICE_IN)
    } else {
        return Ok(());
    };
    let args = IoArgs { buf: 0, ts_enter_ns: now(), fd, syscall: sc };
    IO_ARGS.insert(&pid_tgid, &args, 0).map_err(|e| arg_insert_failed(arg_map::IO, e))
}

#[tracepoint(category = "syscalls", name = "sys_enter_splice")]
pub fn ra_enter_splice(ctx: TracePointContext) -> u32 {
    let _ = try_enter_splice(&ctx);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_splice")]
pub fn ra_exit_splice(ctx: TracePointContext) -> u32 {
    let _ = try_exit_io(&ctx);
    0
}
