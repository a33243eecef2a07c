use clap::Parser;

use super::*;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    capture: CaptureConfig,
}

#[test]
fn default_impl_matches_the_flag_defaults() {
    let parsed = Cli::parse_from(["x"]).capture;
    let d = CaptureConfig::default();
    assert_eq!(
        (parsed.ring_bytes, parsed.payload_bytes, parsed.channel_capacity, &parsed.proc_root, parsed.wakeup_bytes, parsed.poll_ms),
        (d.ring_bytes, d.payload_bytes, d.channel_capacity, &d.proc_root, d.wakeup_bytes, d.poll_ms)
    );
    assert!(d.validate().is_ok());
}

#[test]
fn validate_reports_every_problem() {
    let cfg = CaptureConfig { ring_bytes: 5000, payload_bytes: 5000, channel_capacity: 0, poll_ms: 0, ..Default::default() };
    let Err(CaptureError::Config(msg)) = cfg.validate() else { panic!("accepted a bad config") };
    for needle in ["ring bytes", "payload bytes", "channel capacity", "poll interval"] {
        assert!(msg.contains(needle), "{needle} missing from {msg}");
    }
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
