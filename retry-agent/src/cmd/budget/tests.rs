#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use super::*;
use crate::cmd::{Command, parse_from, run::RunArgs, shim::ShimArgs};
use crate::settings::Settings;

fn run(args: &[&str]) -> RunArgs {
    let line = ["retry-agent", "run"]
        .into_iter()
        .chain(args.iter().copied());
    match parse_from(line).unwrap().command {
        Some(Command::Run(a)) => *a,
        other => panic!("{other:?}"),
    }
}

fn shim(args: &[&str]) -> ShimArgs {
    let line = ["retry-agent", "shim"]
        .into_iter()
        .chain(args.iter().copied());
    match parse_from(line).unwrap().command {
        Some(Command::Shim(a)) => a,
        other => panic!("{other:?}"),
    }
}

fn caps_of(a: &RunArgs) -> Caps {
    Caps {
        ring_bytes: a.capture.ring_bytes,
        channel_capacity: a.capture.channel_capacity,
        recorder_max_mib: a.recorder.max_mib,
        l7_max_connections: a.pipeline.l7.max_connections,
        correlate_max_threads: a.pipeline.correlate.max_threads,
        correlate_max_pending: a.pipeline.correlate.max_pending,
        correlate_max_retry_keys: a.pipeline.correlate.max_retry_keys,
        correlate_max_history: a.pipeline.correlate.max_history,
    }
}

/// The stages' flag defaults are what the default budget derives, so every command that
/// builds a stage from its defaults (trace, forensics, tests) is bounded like `run`.
#[test]
fn flag_defaults_are_the_default_budget() {
    let d = RunArgs::default();
    assert_eq!(
        caps_of(&d),
        Caps::derive(MemoryBudget::default(), d.capture.payload_bytes)
    );
    assert_eq!(caps_of(&run(&[])), caps_of(&d));
    assert_eq!(ShimArgs::default().cache_mib, shim(&[]).cache_mib);
}

#[test]
fn every_cap_follows_the_budget() {
    let small = run(&[]);
    let big = run(&["--memory-budget-mib", "220"]);
    let (s, b) = (caps_of(&small), caps_of(&big));
    // 220 − 28 fixed = 192 MiB to share, 16/3 of the default's 36 (the ring rounds to 2^n).
    assert_eq!(b.ring_bytes, 16 << 20);
    assert_eq!(b.recorder_max_mib, 48);
    // (each count rounds down on its own)
    assert!(
        (s.channel_capacity * 16 / 3..=(s.channel_capacity + 1) * 16 / 3)
            .contains(&b.channel_capacity)
    );
    assert_eq!(b.l7_max_connections, s.l7_max_connections * 16 / 3);
    assert_eq!(b.correlate_max_threads, s.correlate_max_threads * 16 / 3);
    assert_eq!(b.correlate_max_pending, s.correlate_max_pending * 16 / 3);
    assert_eq!(
        b.correlate_max_retry_keys,
        s.correlate_max_retry_keys * 16 / 3
    );
    assert!(
        (s.correlate_max_history * 16 / 3..=(s.correlate_max_history + 1) * 16 / 3)
            .contains(&b.correlate_max_history)
    );
    // A larger payload prefix makes each queued event dearer: fewer of them.
    let wide = run(&["--capture-payload-bytes", "4096"]);
    assert!(wide.capture.channel_capacity < s.channel_capacity / 3);
}

/// What the budget derives stays within it, whatever the budget.
#[test]
fn the_derived_ceiling_is_within_the_budget() {
    for mib in [32, 48, 64, 100, 256, 1000, 4096] {
        let a = run(&["--memory-budget-mib", &mib.to_string()]);
        let c = Ceiling::of(&a);
        assert!(c.total() <= mib << 20, "{mib} MiB: {c}");
        // Most of it is used: the ring's rounding is the only slack.
        assert!(c.total() + c.ring >= mib << 20, "{mib} MiB: {c}");
    }
    let off = run(&["--recorder", "false"]);
    assert_eq!(Ceiling::of(&off).recorder, 0);
    assert!(
        run(&["--memory-budget-mib", "8"])
            .budget
            .validate()
            .is_err()
    );
}

#[test]
fn a_bound_given_on_its_flag_wins() {
    let a = run(&[
        "--memory-budget-mib",
        "128",
        "--l7-max-connections",
        "5",
        "--recorder-max-mib",
        "64",
        "--capture-ring-bytes",
        "4096",
    ]);
    assert_eq!(a.pipeline.l7.max_connections, 5);
    assert_eq!(a.recorder.max_mib, 64);
    assert_eq!(a.capture.ring_bytes, 4096);
    // The others still follow the budget.
    let derived = Caps::derive(a.budget, a.capture.payload_bytes);
    assert_eq!(a.capture.channel_capacity, derived.channel_capacity);
    assert_eq!(
        a.pipeline.correlate.max_threads,
        derived.correlate_max_threads
    );
    // A value equal to the default is still an explicit choice.
    let b = run(&[
        "--memory-budget-mib",
        "128",
        "--correlate-max-pending",
        "2304",
    ]);
    assert_eq!(b.pipeline.correlate.max_pending, 2304);
    // And a ceiling over the budget is what the start-up warning reports.
    let over = run(&["--recorder-max-mib", "512"]);
    assert!(Ceiling::of(&over).total() > over.budget.bytes());
}

#[test]
fn the_shim_cache_follows_the_budget_unless_given() {
    assert_eq!(shim(&["--memory-budget-mib", "128"]).cache_mib, 32);
    assert_eq!(
        shim(&["--memory-budget-mib", "128", "--shim-cache-mib", "3"]).cache_mib,
        3
    );
}

#[test]
fn the_ceiling_names_every_part() {
    let text = Ceiling::of(&RunArgs::default()).to_string();
    for part in ["fixed", "ring", "channel", "recorder", "l7", "correlate"] {
        assert!(text.contains(part), "{text}");
    }
    assert!(text.starts_with("63.0 MiB"), "{text}");
}

#[test]
fn a_queued_event_is_charged_at_least_its_size() {
    let event = std::mem::size_of::<crate::capture::Event>() as u64;
    assert!(
        event + 32 <= EVENT_OVERHEAD_BYTES,
        "an Event is {event} bytes: EVENT_OVERHEAD_BYTES must cover it and its payload's handle"
    );
}
