use super::*;

// That the defaults are the flag defaults is checked for every config in `settings::tests`.

#[test]
fn validate_reports_every_problem() {
    let cfg = CaptureConfig {
        ring_bytes: 5000,
        payload_bytes: 5000,
        response_bytes: Some(4097),
        channel_capacity: 0,
        poll_ms: 0,
        ..Default::default()
    };
    let Err(e) = cfg.validate() else {
        panic!("accepted a bad config")
    };
    let flags: Vec<_> = e.0.iter().map(|p| p.flag).collect();
    assert_eq!(
        flags,
        [
            "capture-ring-bytes",
            "capture-payload-bytes",
            "capture-response-bytes",
            "capture-ring-poll-ms",
            "capture-channel-capacity"
        ]
    );
    assert!(CaptureConfig::default().validate().is_ok());
}

#[test]
fn programs_go_in_consumers_first() {
    use super::programs::{Hook, ProgramSpec};
    let tp = |name: &str, category: &str, tp: &str| ProgramSpec {
        name: name.into(),
        hook: Hook::Tracepoint {
            category: category.into(),
            name: tp.into(),
        },
    };
    // Sorted by name, as the object lists them.
    let specs = [
        tp("ra_enter_close", "syscalls", "sys_enter_close"),
        tp("ra_enter_connect", "syscalls", "sys_enter_connect"),
        tp("ra_exit_accept", "syscalls", "sys_exit_accept"),
        tp("ra_exit_connect", "syscalls", "sys_exit_connect"),
        tp("ra_process_exit", "sched", "sched_process_exit"),
        tp("ra_sock_state", "sock", "inet_sock_set_state"),
    ];
    let order: Vec<&str> = super::load::attach_order(&specs)
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(
        order,
        [
            "ra_process_exit",
            "ra_exit_accept",
            "ra_exit_connect",
            "ra_sock_state",
            "ra_enter_close",
            "ra_enter_connect"
        ]
    );
}

/// A program the JIT failed after the verifier accepted it is not reported as the verifier's
/// refusal (the log of an accepted program says nothing wrong): ENOTSUPP is the JIT's.
#[test]
fn a_jit_failure_is_not_called_a_verifier_refusal() {
    let failed = |errno: i32| aya::programs::ProgramError::LoadError {
        io_error: std::io::Error::from_raw_os_error(errno),
        verifier_log: aya_obj::VerifierLog::new("processed 85385 insns".to_owned()),
    };
    let jit = load::load_error("ra_exit_readv", failed(524));
    assert!(matches!(jit, CaptureError::Jit { .. }), "{jit}");
    let text = jit.to_string();
    assert!(
        text.contains("ra_exit_readv") && text.contains("bpf_jit: fatal error"),
        "{text}"
    );
    let refused = load::load_error("ra_exit_readv", failed(libc::EACCES));
    assert!(
        matches!(refused, CaptureError::Verifier { .. }),
        "{refused}"
    );
}
