#![allow(clippy::expect_used)]
use std::time::Duration;

use super::*;
use crate::{
    correlate::{ClaimCounts, ServiceId},
    decide::Action,
};

fn decision() -> Decision {
    Decision {
        id: 9,
        callee_addrs: vec!["10.0.0.7:8080".parse().expect("addr")],
        issued_at_ns: 5,
        ..crate::testkit::decision(
            "frontend",
            "orders",
            Action::SuppressRetries,
            decide::Reason::OverBudget,
            30_000,
        )
    }
}

fn claim(c: Claim) -> ServiceClaim {
    ServiceClaim {
        service: ServiceId::new("orders"),
        addrs: vec!["0.0.0.0:8080".parse().expect("addr")],
        claim: c,
        counts: ClaimCounts {
            claimed: 1,
            unclaimed: 7,
            missing: 0,
        },
    }
}

fn snapshot() -> Snapshot {
    Snapshot {
        v: VERSION,
        seq: 3,
        sent_unix_ms: 1_764_430_000_000,
        suppress: vec![Suppression::new(&decision(), Duration::from_millis(29_875))],
        claims: ClaimEntry::new(&claim(Claim::Unclaimed), Duration::from_millis(9_990))
            .into_iter()
            .collect(),
    }
}

#[test]
fn a_snapshot_round_trips_as_one_line() {
    let snap = snapshot();
    let line = encode(&snap).expect("encode");
    assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
    assert_eq!(line.last(), Some(&b'\n'));
    assert_eq!(decode(&line).expect("decode"), snap);
    assert_eq!(
        decode(line.trim_ascii_end()).expect("without its newline"),
        snap
    );
}

#[test]
fn conversions_keep_what_the_shim_acts_on() {
    let s = &snapshot().suppress[0];
    assert_eq!(
        (s.decision_id, s.caller.as_str(), s.callee.as_str()),
        (9, "frontend", "orders")
    );
    assert_eq!(s.callee_addrs, decision().callee_addrs);
    assert_eq!(s.reason.known(), Some(decide::Reason::OverBudget));
    assert_eq!(s.remaining_ms, 29_875);
    let c = &snapshot().claims[0];
    assert_eq!(
        (c.service.as_str(), c.claim.known(), c.remaining_ms),
        ("orders", Some(Claim::Unclaimed), 9_990)
    );
    // No claim is no entry; a lapsing entry never reads as zero.
    assert!(ClaimEntry::new(&claim(Claim::Missing), Duration::from_secs(1)).is_none());
    assert_eq!(ms(Duration::from_micros(10)), 1);
    // The wire spells reasons as the suppressed-retry header does.
    for r in [
        decide::Reason::CalleeUnclaimed,
        decide::Reason::OverBudget,
        decide::Reason::Amplification,
    ] {
        assert_eq!(
            serde_json::to_value(Reason::from(r)).expect("json"),
            r.as_str()
        );
        assert_eq!(Reason::from(r).known(), Some(r));
    }
}

#[test]
fn the_wire_format_is_pinned() {
    // What a deployed shim reads: changing it needs a new major version.
    let text = String::from_utf8(encode(&snapshot()).expect("encode")).expect("utf8");
    assert_eq!(
        text,
        concat!(
            r#"{"v":2,"seq":3,"sent_unix_ms":1764430000000,"#,
            r#""suppress":[{"decision_id":9,"caller":"frontend","callee":"orders","callee_addrs":["10.0.0.7:8080"],"reason":"over_budget","remaining_ms":29875}],"#,
            r#""claims":[{"service":"orders","addrs":["0.0.0.0:8080"],"claim":"unclaimed","remaining_ms":9990}]}"#,
            "\n"
        )
    );
}

#[test]
fn another_major_version_is_a_clear_error() {
    for v in [1, 3] {
        let line =
            format!(r#"{{"v":{v},"seq":1,"sent_unix_ms":0,"suppress":[{{"decision":{{}}}}]}}"#);
        let e = decode(line.as_bytes()).expect_err("another version");
        assert!(
            matches!(e, WireError::UnsupportedVersion { got } if got == v),
            "{e:?}"
        );
        assert!(
            e.to_string().contains(&format!("v{v}")) && e.to_string().contains("v2"),
            "{e}"
        );
    }
    assert!(matches!(decode(br#"{"seq":1}"#), Err(WireError::NoVersion)));
}

#[test]
fn newer_minor_additions_are_ignored() {
    let line = br#"{"v":2,"seq":4,"sent_unix_ms":0,"compression":"none",
        "suppress":[{"decision_id":1,"caller":"a","callee":"b","callee_addrs":["127.0.0.1:1"],"reason":"brownout","remaining_ms":5,"priority":3}],
        "claims":[{"service":"b","addrs":["127.0.0.1:1"],"claim":"disputed","remaining_ms":5},
                  {"service":"c","addrs":["127.0.0.1:2"],"claim":"claimed","remaining_ms":5,"since_ms":1}]}"#;
    let snap = decode(line).expect("a newer minor revision still reads");
    assert_eq!(snap.seq, 4);
    assert_eq!(snap.suppress[0].reason, Reason::Unknown);
    assert_eq!(snap.suppress[0].reason.known(), None);
    assert_eq!(snap.claims[0].claim.known(), None);
    assert_eq!(snap.claims[1].claim.known(), Some(Claim::Claimed));
    // Lists a newer agent leaves out read as empty.
    assert!(
        decode(br#"{"v":2,"seq":1,"sent_unix_ms":0}"#)
            .expect("minimal")
            .suppress
            .is_empty()
    );
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    for line in [
        &b""[..],
        b"\n",
        b"not json\n",
        b"[1,2]\n",
        b"{\"v\":2,\"seq\":\"x\"}\n",
        b"{\"v\":2",
        b"\xff\xfe\n",
        b"{\"v\":-1}\n",
    ] {
        assert!(decode(line).is_err(), "{:?}", String::from_utf8_lossy(line));
    }
    assert!(matches!(
        decode(br#"{"v":2,"seq":1}"#),
        Err(WireError::Malformed(_))
    ));
}

/// Revision 2.1: a suppression says what its decision rests on; a 2.0 line (no `basis`) and a
/// newer value both still read, and the shim acts on the reason alone.
#[test]
fn the_basis_is_an_additive_field() {
    let mut d = decision();
    let mut ev = crate::decide::Evidence {
        basis: decide::Basis::OwnerBudget,
        callee: decide::Ownership::Owner,
        claims: ClaimCounts::default(),
        sources: Default::default(),
        dependency: crate::correlate::DependencyKind::Unknown,
        requests: 100,
        retries: 50,
        retry_ratio: 0.5,
        retry_budget: 0.1,
        amplification: 1.0,
        amplification_threshold: 1.5,
        fault_active: false,
        retries_within_budget: true,
    };
    for b in decide::Basis::ALL {
        ev.basis = b;
        d.evidence = Some(ev.clone());
        let s = Suppression::new(&d, Duration::from_millis(5));
        assert_eq!(
            serde_json::to_value(s.basis).expect("json"),
            b.as_str(),
            "spelled as the metrics label"
        );
    }
    ev.basis = decide::Basis::Amplification;
    d.evidence = Some(ev);
    let line = encode(&Snapshot {
        suppress: vec![Suppression::new(&d, Duration::from_millis(5))],
        ..snapshot()
    })
    .expect("encode");
    let text = String::from_utf8(line.clone()).expect("utf8");
    assert!(
        text.contains(r#""reason":"over_budget","basis":"amplification","remaining_ms":5"#),
        "{text}"
    );
    assert_eq!(
        decode(&line).expect("decode").suppress[0].basis,
        Some(WireBasis::Amplification)
    );
    let old = br#"{"v":2,"seq":1,"sent_unix_ms":0,"suppress":[{"decision_id":1,"caller":"a","callee":"b","callee_addrs":["127.0.0.1:1"],"reason":"over_budget","remaining_ms":5}]}"#;
    assert_eq!(decode(old).expect("a 2.0 line").suppress[0].basis, None);
    let newer = br#"{"v":2,"seq":1,"sent_unix_ms":0,"suppress":[{"decision_id":1,"caller":"a","callee":"b","callee_addrs":["127.0.0.1:1"],"reason":"over_budget","basis":"oracle","remaining_ms":5}]}"#;
    let s = &decode(newer).expect("a newer basis").suppress[0];
    assert_eq!(
        (s.basis, s.reason.known()),
        (Some(WireBasis::Unknown), Some(decide::Reason::OverBudget))
    );
}

#[test]
fn remaining_times_are_capped_both_ways() {
    let s = Suppression::new(&decision(), Duration::MAX);
    assert_eq!(s.remaining_ms, MAX_REMAINING_MS);
    let mut c = ClaimEntry::new(&claim(Claim::Unclaimed), Duration::MAX).expect("claim");
    assert_eq!(c.remaining_ms, MAX_REMAINING_MS);
    c.remaining_ms = u64::MAX;
    assert_eq!(c.remaining(), Duration::from_millis(MAX_REMAINING_MS));
}
