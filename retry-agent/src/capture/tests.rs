use super::*;

// That the defaults are the flag defaults is checked for every config in `settings::tests`.

#[test]
fn validate_reports_every_problem() {
    let cfg = CaptureConfig { ring_bytes: 5000, payload_bytes: 5000, channel_capacity: 0, poll_ms: 0, ..Default::default() };
    let Err(e) = cfg.validate() else { panic!("accepted a bad config") };
    let flags: Vec<_> = e.0.iter().map(|p| p.flag).collect();
    assert_eq!(flags, ["capture-ring-bytes", "capture-payload-bytes", "capture-ring-poll-ms", "capture-channel-capacity"]);
    assert!(CaptureConfig::default().validate().is_ok());
}

#[test]
fn comm_is_stored_like_the_kernel_does() {
    let b = super::load::comm_bytes("retry-agent");
    assert_eq!(&b[..11], b"retry-agent");
    assert!(b[11..].iter().all(|&c| c == 0));
    // The kernel keeps 15 bytes and a NUL.
    let long = super::load::comm_bytes("a-very-long-process-name");
    assert_eq!(&long[..15], b"a-very-long-pro");
    assert_eq!(long[15], 0);
}
