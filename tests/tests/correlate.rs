//! Error ownership end to end on the real capture layer: `cargo test -p integration-tests
//! --test correlate` as root.
//!
//! client → A → B, small Python servers on loopback ports. When B fails, B owns its errors
//! (claimed) and A's failures are symptoms (unclaimed, explained by B's failures); when A fails
//! on its own (its call to B succeeded), A's failures are claimed.
use std::{process::Stdio, time::Duration};

use integration_tests::{
    capture::{Proc, can_run, collect, free_port, load, python, wait_listening},
    correlate::{CLIENT_PY, SERVICE_A_PY, SERVICE_B_PY, derive},
};
use retry_agent::{
    capture::{Event, Role},
    correlate::CorrelateConfig,
    decide::{DecideConfig, Decider, Reason},
    l7::Claim,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chain_owner_claims_and_symptoms_are_unclaimed() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load() else { return };
    let (pa, pb) = (free_port(), free_port());
    let (sa, sb) = (pa.to_string(), pb.to_string());
    let b = Proc::spawn(python(SERVICE_B_PY, &[&sb]).stdout(Stdio::null()));
    wait_listening(&format!("127.0.0.1:{pb}"), None);
    let a = Proc::spawn(python(SERVICE_A_PY, &[&sa, &sb]).stdout(Stdio::null()));
    wait_listening(&format!("127.0.0.1:{pa}"), None);

    let mut paths: Vec<String> = (1..=6).map(|i| format!("/chain/{i}")).collect();
    paths.extend((1..=6).map(|i| format!("/own/{i}")));
    let mut args = vec![sa.clone()];
    args.extend(paths.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut client = Proc::spawn(python(CLIENT_PY, &args).stdout(Stdio::piped()));
    let pids = [a.pid(), b.pid(), client.pid()];
    let collecting = collect(&mut cap, Duration::from_secs(8), move |e: &Event| pids.contains(&e.pid()), |_| false);
    let waiter = tokio::task::spawn_blocking(move || {
        let mut lines = Vec::new();
        loop {
            let l = client.read_line();
            if l.is_empty() || l.trim() == "done" {
                break;
            }
            lines.push(l.trim().to_string());
        }
        (client, lines)
    });
    let events = collecting.await;
    let (_client, lines) = waiter.await.expect("client");
    assert_eq!(lines.len(), 12, "the client logged every request: {lines:?}");
    assert!(lines.iter().filter(|l| l.starts_with("/chain/")).all(|l| l.ends_with(" 502")), "{lines:?}");
    assert!(lines.iter().filter(|l| l.starts_with("/own/")).all(|l| l.ends_with(" 500")), "{lines:?}");

    let mut cfg = CorrelateConfig::default();
    cfg.service_names.push(format!("pid:{}=svc-a", a.pid()).parse().expect("override"));
    cfg.service_names.push(format!("pid:{}=svc-b", b.pid()).parse().expect("override"));
    let d = derive(&events, cfg);
    let path_of = |v: &retry_agent::correlate::Verdict| d.exchanges.get(&v.exchange).and_then(|x| x.path.clone()).unwrap_or_default();
    let server_exchanges = |pid: u32| d.exchanges.values().filter(move |x| x.pid == pid && x.role == Role::Server).count();
    eprintln!("exchanges: A served {}, B served {}", server_exchanges(a.pid()), server_exchanges(b.pid()));
    for v in &d.verdicts {
        eprintln!("verdict {} {} {:?} caused_by {:?}", v.service, path_of(v), v.claim, v.caused_by);
    }

    // B failed on its own: every /fail request it answered is claimed, and A called it.
    let b_verdicts: Vec<_> = d.verdicts.iter().filter(|v| v.service.as_str() == "svc-b").collect();
    assert_eq!(b_verdicts.len(), 12, "two attempts per chained request");
    assert!(b_verdicts.iter().all(|v| v.claim == Claim::Claimed && path_of(v).starts_with("/fail/")));
    assert!(b_verdicts.iter().all(|v| v.caller.as_ref().map(|c| c.as_str()) == Some("svc-a")));

    // A's chained failures are symptoms of B's, with both failed attempts as the cause.
    let chained: Vec<_> = d.verdicts.iter().filter(|v| v.service.as_str() == "svc-a" && path_of(v).starts_with("/chain/")).collect();
    assert_eq!(chained.len(), 6);
    for v in &chained {
        assert_eq!(v.claim, Claim::Unclaimed, "{v:?}");
        assert_eq!(v.caused_by.len(), 2, "{v:?}");
        assert!(v.caused_by.iter().all(|c| c.callee.as_str() == "svc-b" && c.status == Some(503)));
    }
    // A failing on its own (its call to B succeeded) owns its errors.
    let own: Vec<_> = d.verdicts.iter().filter(|v| v.service.as_str() == "svc-a" && path_of(v).starts_with("/own/")).collect();
    assert_eq!(own.len(), 6);
    assert!(own.iter().all(|v| v.claim == Claim::Claimed && v.caused_by.is_empty()), "{own:?}");

    // The edge figures: A retried B once per chained request; B's errors were claimed, so the
    // retries into B are never suppressed for ownership.
    let edges = d.engine.edges();
    let ab = edges.iter().find(|e| e.edge.to_string() == "svc-a->svc-b").unwrap_or_else(|| panic!("edge svc-a -> svc-b in {edges:?}"));
    eprintln!("{ab:?}");
    assert_eq!(ab.retries_total, 6);
    assert_eq!(ab.requests_total, 18);
    let mut decider = Decider::new(DecideConfig { min_requests: 1, ..DecideConfig::default() });
    let decisions = decider.evaluate_edges(&edges, d.engine.now_ns());
    assert!(decisions.iter().all(|x| x.reason != Reason::CalleeUnclaimed), "{decisions:?}");
}
