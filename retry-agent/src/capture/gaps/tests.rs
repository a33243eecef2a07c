#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests fail loudly")]
use aya::programs::ProgramError;

use super::super::programs::Hook;

use super::*;

fn spec(name: &str, category: &str, tp: &str) -> ProgramSpec {
    ProgramSpec {
        name: name.into(),
        hook: Hook::Tracepoint {
            category: category.into(),
            name: tp.into(),
        },
    }
}

fn verifier(program: &str) -> CaptureError {
    CaptureError::Verifier {
        program: program.into(),
        log: "unreachable insn 1".into(),
        source: Box::new(ProgramError::NotLoaded),
    }
}

fn jit(program: &str) -> CaptureError {
    CaptureError::Jit {
        program: program.into(),
        kernel: "6.18.0".into(),
        source: Box::new(ProgramError::NotLoaded),
    }
}

#[test]
fn a_data_program_that_fails_is_a_gap_named_by_its_reason() {
    let readv = spec("ra_exit_readv", "syscalls", "sys_exit_readv");
    let tp = || "syscalls/sys_exit_readv".to_string();
    let gap = settle(&readv, tp(), Err(jit("ra_exit_readv")))
        .unwrap()
        .unwrap();
    assert_eq!(
        (gap.program.as_str(), gap.tracepoint.as_str(), gap.reason),
        ("ra_exit_readv", "syscalls/sys_exit_readv", GapReason::Jit)
    );
    assert!(gap.detail.contains("JIT"), "{}", gap.detail);
    let gap = settle(&readv, tp(), Err(verifier("ra_exit_readv")))
        .unwrap()
        .unwrap();
    assert_eq!(gap.reason, GapReason::Verifier);
    // The error's source is kept in the detail, not only its first line.
    let attach = CaptureError::Program {
        program: "ra_exit_readv".into(),
        source: Box::new(ProgramError::NotLoaded),
    };
    let gap = settle(&readv, tp(), Err(attach)).unwrap().unwrap();
    assert_eq!(gap.reason, GapReason::Attach);
    assert!(
        gap.detail.starts_with("program ra_exit_readv: ") && gap.detail.len() > 24,
        "{}",
        gap.detail
    );
    assert!(settle(&readv, tp(), Ok(())).unwrap().is_none());
}

#[test]
fn a_connection_lifecycle_program_that_fails_fails_the_load() {
    for (name, category, tp) in [
        ("ra_enter_connect", "syscalls", "sys_enter_connect"),
        ("ra_exit_connect", "syscalls", "sys_exit_connect"),
        ("ra_enter_accept4", "syscalls", "sys_enter_accept4"),
        ("ra_exit_accept4", "syscalls", "sys_exit_accept4"),
        ("ra_enter_close", "syscalls", "sys_enter_close"),
        ("ra_sock_state", "sock", "inet_sock_set_state"),
        ("ra_process_exit", "sched", "sched_process_exit"),
    ] {
        let s = spec(name, category, tp);
        assert!(required(&s), "{name}");
        let e = settle(&s, format!("{category}/{tp}"), Err(verifier(name))).unwrap_err();
        assert!(matches!(e, CaptureError::Verifier { ref program, .. } if program == name));
        let e = absent(&s, format!("{category}/{tp}")).unwrap_err();
        assert!(
            matches!(e, CaptureError::NoTracepoint { ref program, .. } if program == name),
            "{e}"
        );
    }
    // What the capture can do without: one syscall's I/O, fd reuse, inheritance, `accept`
    // (libc calls accept4 where it is missing).
    for (name, tp) in [
        ("ra_exit_read", "sys_exit_read"),
        ("ra_exit_sendmmsg", "sys_exit_sendmmsg"),
        ("ra_enter_dup2", "sys_enter_dup2"),
        ("ra_exit_fork", "sys_exit_fork"),
        ("ra_enter_accept", "sys_enter_accept"),
    ] {
        assert!(!required(&spec(name, "syscalls", tp)), "{name}");
    }
}

#[test]
fn a_syscall_the_kernel_does_not_have_is_a_quiet_gap() {
    let dir = std::env::temp_dir().join(format!("ra-gaps-{}", std::process::id()));
    let events = dir.join("events");
    std::fs::create_dir_all(events.join("syscalls/sys_exit_read")).unwrap();
    assert!(has_tracepoint(Some(&events), "syscalls", "sys_exit_read"));
    assert!(!has_tracepoint(Some(&events), "syscalls", "sys_enter_dup2"));
    assert!(!has_tracepoint(Some(&events), "sched", "sys_exit_read"));
    // No tracefs to ask: attaching will say what is wrong.
    assert!(has_tracepoint(None, "syscalls", "sys_enter_dup2"));
    let gap = absent(
        &spec("ra_enter_dup2", "syscalls", "sys_enter_dup2"),
        "syscalls/sys_enter_dup2".into(),
    )
    .unwrap();
    assert_eq!(
        (gap.reason, gap.reason.as_str(), gap.detail.as_str()),
        (GapReason::NoTracepoint, "no_tracepoint", "")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
