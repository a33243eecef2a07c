//! Layout pins: the kernel object and the agent are built by different compilers for different
//! targets, so every shared type's size and field offsets are written down here by hand. A change
//! to any of them must be deliberate (and both sides rebuilt).
extern crate std;
use super::*;
use core::mem::{align_of, offset_of, size_of};

/// Asserts size and each field's offset, and that the fields cover the struct with no hidden
/// padding (hidden padding would be uninitialised bytes in a Pod).
macro_rules! layout {
    ($t:ty, size $size:expr, { $($f:ident @ $off:expr, $fsize:expr);* $(;)? }) => {{
        assert_eq!(size_of::<$t>(), $size, "size of {}", stringify!($t));
        let mut covered = 0usize;
        $(
            assert_eq!(offset_of!($t, $f), $off, "offset of {}.{}", stringify!($t), stringify!($f));
            covered += $fsize;
        )*
        assert_eq!(covered, $size, "{} has implicit padding", stringify!($t));
    }};
}

#[test]
fn sock_tuple_layout() {
    layout!(SockTuple, size 40, { family @ 0, 2; lport @ 2, 2; rport @ 4, 2; _pad @ 6, 2; laddr @ 8, 16; raddr @ 24, 16 });
    assert_eq!(align_of::<SockTuple>(), 2);
}

#[test]
fn data_header_layout() {
    layout!(DataHeader, size 120, {
        kind @ 0, 4; syscall @ 4, 4; pid @ 8, 4; tid @ 12, 4; fd @ 16, 4; role @ 20, 4;
        direction @ 24, 2; flags @ 26, 2; captured @ 28, 4; generation @ 32, 8; ts_enter_ns @ 40, 8;
        ts_exit_ns @ 48, 8; ret @ 56, 8; len @ 64, 8; tuple @ 72, 40; goroutine @ 112, 8;
    });
}

#[test]
fn data_record_layout() {
    layout!(DataRecord, size 120 + MAX_PAYLOAD, { header @ 0, 120; payload @ 120, MAX_PAYLOAD });
}

#[test]
fn summary_record_layout() {
    layout!(SummaryRecord, size 8 + 2 * 120 + HELD_BYTES, {
        kind @ 0, 4; status @ 4, 2; weight @ 6, 2; response @ 8, 120; request @ 128, 120; bytes @ 248, HELD_BYTES;
    });
    assert_eq!(SUMMARY_HEAD, offset_of!(SummaryRecord, bytes));
}

#[test]
fn conn_record_layout() {
    layout!(ConnRecord, size 112, {
        kind @ 0, 4; conn_kind @ 4, 4; pid @ 8, 4; tid @ 12, 4; fd @ 16, 4; role @ 20, 4;
        errno @ 24, 4; oldstate @ 28, 4; newstate @ 32, 4; parent @ 36, 4; generation @ 40, 8;
        ts_ns @ 48, 8; tuple @ 56, 40; stream_id @ 96, 4; _pad @ 100, 4; context @ 104, 8;
    });
    layout!(GoGrpcOffsets, size 24, {
        stream_id @ 0, 4; stream_client @ 4, 4; server_conn @ 8, 4; client_conn @ 12, 4;
        tcp_conn_itab @ 16, 8;
    });
}

#[test]
fn process_exit_layout() {
    layout!(ProcessExitRecord, size 32, { kind @ 0, 4; pid @ 4, 4; ts_ns @ 8, 8; comm @ 16, 16 });
}

#[test]
fn map_key_and_value_layouts() {
    layout!(ConnKey, size 8, { tgid @ 0, 4; fd @ 4, 4 });
    layout!(ConnInfo, size 72, {
        generation @ 0, 8; skaddr @ 8, 8; role @ 16, 4; fd @ 20, 4; tuple @ 24, 40; flags @ 64, 4; _pad @ 68, 4;
    });
    layout!(SockOwner, size 72, {
        pid_tgid @ 0, 8; generation @ 8, 8; fd @ 16, 4; role @ 20, 4; flags @ 24, 4; errno @ 28, 4; tuple @ 32, 40;
    });
    layout!(PeerKey, size 20, { family @ 0, 2; port @ 2, 2; addr @ 4, 16 });
    layout!(ServerEst, size 48, { skaddr @ 0, 8; tuple @ 8, 40 });
    layout!(ConnectArgs, size 48, {
        ts_enter_ns @ 0, 8; skaddr @ 8, 8; fd @ 16, 4; is_tcp @ 20, 4; dst @ 24, 20; _pad @ 44, 4;
    });
    layout!(AcceptArgs, size 24, { addr @ 0, 8; ts_enter_ns @ 8, 8; fd @ 16, 4; _pad @ 20, 4 });
    layout!(KernelOffsets, size 64, {
        sk_err @ 0, 4; task_files @ 4, 4; files_fdt @ 8, 4; fdt_fd @ 12, 4; file_private_data @ 16, 4;
        socket_sk @ 20, 4; task_mm @ 24, 4; mm_exe_file @ 28, 4; file_inode @ 32, 4; inode_ino @ 36, 4;
        inode_sb @ 40, 4; sb_dev @ 44, 4; task_nsproxy @ 48, 4; nsproxy_net_ns @ 52, 4; net_ns @ 56, 4;
        ns_inum @ 60, 4;
    });
    layout!(Config, size 128, {
        agent_tgid @ 0, 4; payload_bytes @ 4, 4; wakeup_bytes @ 8, 4; flags @ 12, 4; exe_ino @ 16, 8;
        exe_dev @ 24, 4; cgroup_levels @ 28, 4; offsets @ 32, 64; response_bytes @ 96, 4;
        summary_sample @ 100, 4; summary_hot_ns @ 104, 8; summary_every @ 112, 4; _pad @ 116, 4;
        summary_window_ns @ 120, 8;
    });
}

#[test]
fn kind_tags_are_distinct_and_first() {
    assert_eq!(KIND_DATA, 1);
    assert_eq!(KIND_CONN, 2);
    assert_eq!(KIND_PROCESS_EXIT, 3);
    assert_eq!(KIND_PROCESS_EXEC, 4);
    assert_eq!(KIND_SUMMARY, 5);
    assert_eq!(KIND_TALLY, 6);
    assert_eq!(offset_of!(SummaryRecord, kind), 0);
    assert_eq!(offset_of!(DataHeader, kind), 0);
    assert_eq!(offset_of!(ConnRecord, kind), 0);
    assert_eq!(offset_of!(ProcessExitRecord, kind), 0);
}

#[test]
fn responses_are_a_servers_writes_and_a_clients_reads() {
    assert!(role::carries_response(role::SERVER, true));
    assert!(role::carries_response(role::CLIENT, false));
    assert!(!role::carries_response(role::SERVER, false));
    assert!(!role::carries_response(role::CLIENT, true));
    assert!(!role::carries_response(role::UNKNOWN, true));
    assert!(!role::carries_response(role::UNKNOWN, false));
}

#[test]
fn egress_syscalls() {
    for sc in [
        syscall::WRITE,
        syscall::WRITEV,
        syscall::SENDTO,
        syscall::SENDMSG,
        syscall::SENDMMSG,
        syscall::SENDFILE,
        syscall::SPLICE_OUT,
    ] {
        assert!(syscall::is_egress(sc));
    }
    for sc in [
        syscall::READ,
        syscall::READV,
        syscall::RECVFROM,
        syscall::RECVMSG,
        syscall::RECVMMSG,
        syscall::SPLICE_IN,
        0,
        99,
    ] {
        assert!(!syscall::is_egress(sc));
    }
    for sc in [syscall::SENDFILE, syscall::SPLICE_OUT, syscall::SPLICE_IN] {
        assert!(syscall::is_zero_copy(sc));
    }
    assert!(!syscall::is_zero_copy(syscall::WRITE));
}

#[test]
fn steer_layouts() {
    use steer::{SteerAddr, SteerConfig};
    layout!(SteerAddr, size 20, { family @ 0, 2; port @ 2, 2; addr @ 4, 16 });
    layout!(SteerConfig, size 24, {
        shim_port @ 0, 2; _pad @ 2, 2; mark @ 4, 4; flags @ 8, 4; _pad2 @ 12, 4; netns_cookie @ 16, 8;
    });
}
