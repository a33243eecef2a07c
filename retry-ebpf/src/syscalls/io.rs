//! Data syscalls: read/write, readv/writev, send*/recv* (+ mmsg), and sendfile/splice (counted:
//! zero-copy bytes are never captured). Exit programs only: the arguments are still in the
//! task's saved registers when the syscall returns (`ctx::syscall_args`), so no entry program
//! runs and no per-thread map entry is written and removed on every I/O of every process; a
//! call that moved nothing (EAGAIN, the common case of an event loop) stops at its return value.
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};
use retry_common::{ConnKey, conn_kind, syscall};

use crate::{
    ctx::{SyscallArgs, exit_ret, now, read_user, syscall_args},
    emit::{Src, emit_conn},
    errno::{ECONNRESET, EPIPE},
    maps::CONNS,
    summary,
    uprobes::libssl,
};

/// The tracked fd a data syscall moved bytes on, and where its bytes are.
#[inline(always)]
fn fd_and_buffer(sc: u32, a: &SyscallArgs) -> (u32, u64) {
    match sc {
        // splice(fd_in, off_in, fd_out, ...): the caller picks the tracked end.
        syscall::SPLICE_OUT => (a.arg2 as u32, 0),
        syscall::SPLICE_IN => (a.arg0 as u32, 0),
        // sendfile(out_fd, in_fd, ...): the socket is the destination.
        syscall::SENDFILE => (a.arg0 as u32, 0),
        _ => (a.arg0 as u32, a.arg1),
    }
}

/// Where the bytes are and how many the syscall moved in total.
#[inline(always)]
fn payload_source(sc: u32, buf: u64, ret: i64) -> Result<(Src, u64), i32> {
    let total = ret as u64;
    match sc {
        syscall::READV | syscall::WRITEV => Ok((Src::Iov(buf), total)),
        // struct user_msghdr: msg_iov at 16.
        syscall::SENDMSG | syscall::RECVMSG => Ok((Src::Iov(read_user(buf + 16)?), total)),
        syscall::SENDMMSG | syscall::RECVMMSG => {
            // struct mmsghdr: msg_hdr (56 bytes) then msg_len; only the first message is reported.
            let msg_len: u32 = read_user(buf + 56)?;
            Ok((Src::Iov(read_user(buf + 16)?), msg_len as u64))
        }
        syscall::SENDFILE | syscall::SPLICE_OUT | syscall::SPLICE_IN => Ok((Src::None, total)),
        _ => Ok((Src::Flat(buf), total)),
    }
}

#[inline(always)]
fn try_exit_io(sc: u32, ret: i64, args: &SyscallArgs) -> Result<(), i32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (fd, buf) = fd_and_buffer(sc, args);
    let key = ConnKey {
        tgid: (pid_tgid >> 32) as u32,
        fd,
    };
    let Some(conn) = CONNS.get_ptr_mut(&key) else {
        return Ok(());
    };
    // SAFETY: copied out; a concurrent close only makes this record slightly stale.
    let info = unsafe { *conn };
    // The ciphertext under an SSL call in progress: the SSL probes report its plaintext.
    if libssl::inside_ssl_call(pid_tgid, fd) {
        return Ok(());
    }
    if ret <= 0 {
        // What was held goes before the reset that ends it; the reset is this thread's failure.
        summary::release_if_on(&ConnKey {
            tgid: key.tgid,
            fd: info.fd,
        });
        summary::mark_failed(pid_tgid, &info, now());
        let states = (0, 0);
        emit_conn(
            conn_kind::RESET,
            pid_tgid,
            info.fd,
            info.role,
            (-ret) as i32,
            states,
            info.generation,
            &info.tuple,
        );
        return Ok(());
    }
    // Read once the fd is known to be tracked (most I/O on a node is not); no entry program
    // ran, so the call's only timestamp is its return.
    let ts = now();
    let (src, total) = payload_source(sc, buf, ret)?;
    summary::data(&summary::Io {
        pid_tgid,
        key: &key,
        conn,
        info: &info,
        sc,
        src,
        io: (ret, total),
        ts: (ts, ts),
    });
    Ok(())
}

/// Only calls that moved bytes, or failed because the peer reset or closed, go further.
#[inline(always)]
fn exit_io(ctx: &TracePointContext, sc: u32) {
    let Ok(ret) = exit_ret(ctx) else { return };
    if ret <= 0 && ret != -ECONNRESET && ret != -EPIPE {
        return;
    }
    let Ok(args) = syscall_args() else { return };
    let _ = try_exit_io(sc, ret, &args);
}

/// One exit program per data syscall.
macro_rules! io_programs {
    ($($exit:ident, $tp_exit:literal, $sc:expr;)*) => {$(
        #[tracepoint(category = "syscalls", name = $tp_exit)]
        pub fn $exit(ctx: TracePointContext) -> u32 {
            exit_io(&ctx, $sc);
            0
        }
    )*};
}

io_programs! {
    ra_exit_sendfile, "sys_exit_sendfile64", syscall::SENDFILE;
    ra_exit_read, "sys_exit_read", syscall::READ;
    ra_exit_write, "sys_exit_write", syscall::WRITE;
    ra_exit_readv, "sys_exit_readv", syscall::READV;
    ra_exit_writev, "sys_exit_writev", syscall::WRITEV;
    ra_exit_sendto, "sys_exit_sendto", syscall::SENDTO;
    ra_exit_recvfrom, "sys_exit_recvfrom", syscall::RECVFROM;
    ra_exit_sendmsg, "sys_exit_sendmsg", syscall::SENDMSG;
    ra_exit_recvmsg, "sys_exit_recvmsg", syscall::RECVMSG;
    ra_exit_sendmmsg, "sys_exit_sendmmsg", syscall::SENDMMSG;
    ra_exit_recvmmsg, "sys_exit_recvmmsg", syscall::RECVMMSG;
}

/// splice(fd_in, off_in, fd_out, off_out, len, flags): whichever end is a tracked socket (a
/// socket-to-socket splice goes through a pipe, so one end is a pipe).
#[tracepoint(category = "syscalls", name = "sys_exit_splice")]
pub fn ra_exit_splice(ctx: TracePointContext) -> u32 {
    let Ok(ret) = exit_ret(&ctx) else { return 0 };
    if ret <= 0 && ret != -ECONNRESET && ret != -EPIPE {
        return 0;
    }
    let Ok(args) = syscall_args() else { return 0 };
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let sc = if CONNS
        .get_ptr(&ConnKey {
            tgid,
            fd: args.arg2 as u32,
        })
        .is_some()
    {
        syscall::SPLICE_OUT
    } else {
        syscall::SPLICE_IN
    };
    let _ = try_exit_io(sc, ret, &args);
    0
}
