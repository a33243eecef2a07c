#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests fail loudly")]
use std::collections::BTreeSet;

use super::*;

fn tp(category: &str, name: &str) -> Option<Hook> {
    Some(Hook::Tracepoint {
        category: category.into(),
        name: name.into(),
    })
}

fn up(symbols: &[&str], ret: bool) -> Option<Hook> {
    Some(Hook::Uprobe(Uprobe {
        target: UprobeTarget::Libssl,
        symbols: symbols.iter().map(|s| s.to_string()).collect(),
        ret,
    }))
}

#[test]
fn sections_name_their_hook() {
    let cases: &[(&str, Option<Hook>)] = &[
        (
            "tracepoint/syscalls/sys_enter_read",
            tp("syscalls", "sys_enter_read"),
        ),
        (
            "tracepoint/sock/inet_sock_set_state",
            tp("sock", "inet_sock_set_state"),
        ),
        ("uprobe/libssl:SSL_write", up(&["SSL_write"], false)),
        (
            "uprobe/libssl:SSL_do_handshake,SSL_connect",
            up(&["SSL_do_handshake", "SSL_connect"], false),
        ),
        ("uretprobe/libssl:SSL_read", up(&["SSL_read"], true)),
        // Where the capture would not know what to do: refused, never silently skipped.
        ("tracepoint", None),
        ("tracepoint/syscalls", None),
        ("tracepoint/a/b/c", None),
        ("uprobe", None),
        ("uprobe/libssl:", None),
        ("uprobe/libgo:crypto/tls.(*Conn).Write", None),
        ("kprobe/tcp_connect", None),
        ("xdp", None),
    ];
    for (section, want) in cases {
        assert_eq!(&hook(section), want, "{section}");
    }
}

#[test]
fn not_an_elf_is_an_error() {
    assert!(matches!(
        programs(b"not an object"),
        Err(ProgramsError::Elf(_))
    ));
}

/// The embedded object (built by `cargo xtask test`; empty in a bare `cargo test`, where there
/// is nothing to check): every program aya will load is one the capture attaches, and every one
/// the capture attaches is in the object.
#[test]
fn every_program_in_the_object_is_attached() {
    if super::super::EBPF_OBJECT.is_empty() {
        eprintln!("no embedded eBPF object (run through `cargo xtask test`): nothing to check");
        return;
    }
    let specs =
        programs(super::super::EBPF_OBJECT).expect("every program has a hook the capture attaches");
    let ours: BTreeSet<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    let obj = aya_obj::Object::parse(super::super::EBPF_OBJECT).expect("aya parses the object");
    let ayas: BTreeSet<&str> = obj.programs.keys().map(String::as_str).collect();
    assert_eq!(ours, ayas);
    // What the kernel side is known to hold, as a floor: the syscall, sock and sched tracepoints
    // and OpenSSL's entry points, each with a return probe.
    for (category, name) in [
        ("syscalls", "sys_exit_read"),
        ("syscalls", "sys_exit_connect"),
        ("syscalls", "sys_exit_accept4"),
        ("syscalls", "sys_enter_close"),
        ("sock", "inet_sock_set_state"),
        ("sched", "sched_process_exit"),
    ] {
        let want = Hook::Tracepoint {
            category: category.into(),
            name: name.into(),
        };
        assert!(
            specs.iter().any(|s| s.hook == want),
            "{category}:{name} is not attached"
        );
    }
    // Every program the capture cannot run without is here, on its tracepoint: one renamed
    // or moved would otherwise turn a required program into a quiet gap.
    for (program, tp) in super::super::gaps::REQUIRED {
        let (category, name) = tp.split_once('/').expect("category/name");
        let want = Hook::Tracepoint {
            category: category.into(),
            name: name.into(),
        };
        assert!(
            specs.iter().any(|s| s.name == *program && s.hook == want),
            "required {program} is not in the object on {tp}"
        );
    }
    // Data syscalls are read at their exit alone (`ctx::syscall_args` on the kernel side): an
    // entry program would be paid on every read and write of every process for nothing.
    assert!(
        !specs.iter().any(|s| s.hook
            == Hook::Tracepoint {
                category: "syscalls".into(),
                name: "sys_enter_read".into(),
            }),
        "sys_enter_read is attached"
    );
    let plan = super::super::tls::plan(&specs);
    for sym in [
        "SSL_write",
        "SSL_read",
        "SSL_write_ex",
        "SSL_read_ex",
        "SSL_do_handshake",
    ] {
        assert!(
            plan.entries.iter().any(|(_, s)| s == sym),
            "no entry probe on {sym}"
        );
    }
    assert!(
        plan.is_complete(),
        "an entry probe without a return probe: {plan:?}"
    );
}
