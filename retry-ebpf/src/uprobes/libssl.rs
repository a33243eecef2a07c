//! TLS: uprobes on OpenSSL (libssl). The plaintext an application hands to SSL_write or gets from
//! SSL_read is reported on the connection of the fd the library does its I/O on; the ciphertext
//! syscalls inside those calls (and inside handshakes) are not reported.
//!
//! Target `libssl`: userspace attaches every program here to each libssl file it finds, at the
//! symbols named in the attribute (capture/tls.rs). Every entry symbol needs the return probe.
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use retry_common::{ConnKey, arg_map, config_flags, syscall};

use crate::{
    config::config,
    ctx::{now, read_user},
    emit::{Src, emit_data},
    maps::{CONNS, SSL_ARGS, SSL_FDS, SslArgs, SslKey, arg_insert_failed},
};

const SSL_WRITE: u32 = 1;
const SSL_READ: u32 = 2;
const SSL_WRITE_EX: u32 = 3;
const SSL_READ_EX: u32 = 4;
const SSL_HANDSHAKE: u32 = 5;
/// An SSL call makes its syscalls right after it is entered (a blocking read waits inside one
/// syscall): a syscall this long after the entry means the entry is stale.
const SSL_CALL_STALE_NS: u64 = 10_000_000_000;

/// For the syscall programs: is this syscall on `fd` the ciphertext inside an SSL call of this
/// thread? Then it is not reported (the uretprobe reports the plaintext), and it tells which fd
/// the SSL object talks over.
#[inline(always)]
pub fn inside_ssl_call(pid_tgid: u64, fd: u32) -> bool {
    if config().flags & config_flags::TLS == 0 {
        return false;
    }
    let Some(p) = SSL_ARGS.get_ptr_mut(&pid_tgid) else {
        return false;
    };
    // SAFETY: this thread's own entry; only this thread writes it.
    let (ssl, since) = unsafe { ((*p).ssl, (*p).ts_enter_ns) };
    if now().saturating_sub(since) < SSL_CALL_STALE_NS {
        // SAFETY: as above.
        unsafe { (*p).fd = fd };
        let _ = SSL_FDS.insert(
            &SslKey {
                tgid: (pid_tgid >> 32) as u32,
                _pad: 0,
                ssl,
            },
            &fd,
            0,
        );
        return true;
    }
    // A call whose return never came (its thread was torn down mid-call and the tid
    // reused): forget it rather than hide this thread's plaintext I/O.
    let _ = SSL_ARGS.remove(&pid_tgid);
    false
}

#[inline(always)]
fn try_ssl_enter(ctx: &ProbeContext, kind: u32) -> Result<(), i32> {
    // No is_agent check (two kernel reads per SSL call): the agent's own sockets are never
    // tracked, so its SSL calls can produce nothing anyway.
    let pid_tgid = bpf_get_current_pid_tgid();
    let ssl: u64 = ctx.arg(0).ok_or(-1)?;
    let (buf, len_ptr) = match kind {
        SSL_HANDSHAKE => (0, 0),
        SSL_WRITE_EX | SSL_READ_EX => (ctx.arg(1).ok_or(-1)?, ctx.arg(3).ok_or(-1)?),
        _ => (ctx.arg(1).ok_or(-1)?, 0),
    };
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: plain value copied out of the map.
    let fd = unsafe { SSL_FDS.get(&SslKey { tgid, _pad: 0, ssl }) }
        .copied()
        .unwrap_or(u32::MAX);
    let args = SslArgs {
        ssl,
        buf,
        len_ptr,
        ts_enter_ns: now(),
        fd,
        kind,
    };
    SSL_ARGS
        .insert(&pid_tgid, &args, 0)
        .map_err(|e| arg_insert_failed(arg_map::SSL, e))
}

#[inline(always)]
fn try_ssl_exit(ctx: &RetProbeContext) -> Result<(), i32> {
    let ts_exit_ns = now();
    let pid_tgid = bpf_get_current_pid_tgid();
    let a = match SSL_ARGS.get_ptr(&pid_tgid) {
        // SAFETY: the value is copied out before the entry is removed.
        Some(p) => unsafe { *p },
        None => return Ok(()),
    };
    let _ = SSL_ARGS.remove(&pid_tgid);
    // Both return an int: SSL_read/SSL_write the byte count (≤ 0: nothing moved), the _ex
    // variants 1 on success with the count behind `len_ptr`.
    let ret = ctx.ret::<i64>() as i32;
    let n: u64 = match a.kind {
        SSL_WRITE | SSL_READ if ret > 0 => ret as u64,
        SSL_WRITE_EX | SSL_READ_EX if ret == 1 => read_user::<u64>(a.len_ptr)?,
        _ => return Ok(()),
    };
    if n == 0 || a.fd == u32::MAX {
        return Ok(());
    }
    let key = ConnKey {
        tgid: (pid_tgid >> 32) as u32,
        fd: a.fd,
    };
    let info = match CONNS.get_ptr(&key) {
        // SAFETY: copied out.
        Some(p) => unsafe { *p },
        None => return Ok(()),
    };
    let sc = if matches!(a.kind, SSL_WRITE | SSL_WRITE_EX) {
        syscall::SSL_WRITE
    } else {
        syscall::SSL_READ
    };
    emit_data(
        pid_tgid,
        &key,
        &info,
        sc,
        Src::Flat(a.buf),
        (n as i64, n),
        (a.ts_enter_ns, ts_exit_ns),
    );
    Ok(())
}

/// Entry probes: the program, the kind of call it records, the symbols it probes.
macro_rules! ssl_programs {
    ($($enter:ident, $kind:expr, $symbols:literal;)*) => {$(
        #[uprobe(path = "libssl", function = $symbols)]
        pub fn $enter(ctx: ProbeContext) -> u32 {
            let _ = try_ssl_enter(&ctx, $kind);
            0
        }
    )*};
}

ssl_programs! {
    ra_ssl_write, SSL_WRITE, "SSL_write";
    ra_ssl_read, SSL_READ, "SSL_read";
    ra_ssl_write_ex, SSL_WRITE_EX, "SSL_write_ex";
    ra_ssl_read_ex, SSL_READ_EX, "SSL_read_ex";
    ra_ssl_handshake, SSL_HANDSHAKE, "SSL_do_handshake,SSL_connect,SSL_accept";
}

/// One return probe for every SSL function above (the entry recorded which one it was).
#[uretprobe(
    path = "libssl",
    function = "SSL_write,SSL_read,SSL_write_ex,SSL_read_ex,SSL_do_handshake,SSL_connect,SSL_accept"
)]
pub fn ra_ssl_ret(ctx: RetProbeContext) -> u32 {
    let _ = try_ssl_exit(&ctx);
    0
}
