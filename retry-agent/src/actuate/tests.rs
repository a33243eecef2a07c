#![allow(clippy::expect_used)]
use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use super::*;
use crate::{
    correlate::ServiceId,
    decide::{Action, Reason},
};

pub(crate) fn decision(
    id: u64,
    caller: &str,
    callee: &str,
    addr: &str,
    action: Action,
    ttl_ms: u64,
) -> Decision {
    Decision {
        id,
        callee_addrs: addr.parse::<SocketAddr>().into_iter().collect(),
        ..crate::testkit::decision(caller, callee, action, Reason::CalleeUnclaimed, ttl_ms)
    }
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ra-actuate-{}-{name}", std::process::id()))
}

struct Flaky(Arc<AtomicU32>);
impl Actuator for Flaky {
    fn name(&self) -> &'static str {
        "flaky"
    }
    fn apply<'a>(&'a mut self, _d: &'a [Decision]) -> ActuateFuture<'a> {
        let n = self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            if n.is_multiple_of(2) {
                Err(ActuateError::Invalid("boom".into()))
            } else {
                Ok(())
            }
        })
    }
}

/// Waits (up to 3 s) until `done` holds for the dispatcher's stats.
async fn settle(d: &Dispatcher, done: impl Fn(&[ActuatorStats]) -> bool) {
    let t0 = Instant::now();
    while !done(&d.stats()) {
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "stuck at {:?}",
            d.stats()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test]
async fn dispatcher_counts_failures_and_keeps_going() {
    let calls = Arc::new(AtomicU32::new(0));
    let mut d = Dispatcher::default();
    d.push(Box::new(Flaky(calls.clone()))).expect("push");
    d.push(Box::new(Flaky(Arc::new(AtomicU32::new(1)))))
        .expect("push");
    for n in 1..=3 {
        d.apply(&[]);
        settle(&d, |s| s.iter().all(|s| s.ok + s.failed == n)).await;
    }
    let s = d.stats();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!((s[0].ok, s[0].failed), (1, 2));
    assert_eq!((s[1].ok, s[1].failed), (2, 1));
    assert_eq!(s[0].last_error.as_deref(), Some("boom"));
}

/// Never answers (an HAProxy socket that accepted and went silent).
struct Hung;
impl Actuator for Hung {
    fn name(&self) -> &'static str {
        "hung"
    }
    fn apply<'a>(&'a mut self, _d: &'a [Decision]) -> ActuateFuture<'a> {
        Box::pin(std::future::pending())
    }
    fn shutdown(&mut self) -> ActuateFuture<'_> {
        Box::pin(std::future::pending())
    }
}

/// Records the ids it is handed, and its claims sets.
struct Recording(Arc<std::sync::Mutex<(Vec<u64>, usize)>>);
impl Actuator for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }
    fn apply<'a>(&'a mut self, d: &'a [Decision]) -> ActuateFuture<'a> {
        if let Ok(mut seen) = self.0.lock() {
            seen.0.extend(d.iter().map(|d| d.id));
        }
        Box::pin(async { Ok(()) })
    }
    fn publish_claims<'a>(&'a mut self, _c: &'a [ServiceClaim]) -> ActuateFuture<'a> {
        if let Ok(mut seen) = self.0.lock() {
            seen.1 += 1;
        }
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test]
async fn a_hung_actuator_delays_no_other_and_keeps_only_the_latest() {
    let seen = Arc::new(std::sync::Mutex::new((Vec::new(), 0)));
    let mut d = Dispatcher::default();
    d.push(Box::new(Hung)).expect("push");
    d.push(Box::new(Recording(seen.clone()))).expect("push");
    let suppress = |id, callee| {
        decision(
            id,
            "a",
            callee,
            "127.0.0.1:80",
            Action::SuppressRetries,
            1000,
        )
    };
    for id in 1..=50 {
        // Every call returns at once although `hung` never finishes its first apply.
        d.apply(&[suppress(id, if id % 2 == 0 { "b" } else { "c" })]);
        d.publish_claims(&[]);
        settle(&d, |s| s[1].ok >= 2 * id).await;
    }
    let recorded = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert_eq!(
        recorded.0,
        (1..=50).collect::<Vec<_>>(),
        "recording saw every decision"
    );
    assert_eq!(recorded.1, 50);
    let s = d.stats();
    // `hung` took decision 1; of 2..=50 only the latest per edge (49 for c, 50 for b) waits.
    assert_eq!((s[0].ok, s[0].failed, s[0].dropped), (0, 0, 47));
    assert_eq!(s[1].dropped, 0);
    let t0 = Instant::now();
    d.shutdown(Duration::from_millis(200)).await;
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "shutdown waited past its timeout"
    );
    let s = d.stats();
    assert_eq!((s[0].failed, s[1].failed), (1, 0), "{s:?}");
    assert_eq!(s[1].ok, 101, "recording shut down");
}

/// Counts shutdowns; fails the first one.
struct Stopping(Arc<AtomicU32>);
impl Actuator for Stopping {
    fn name(&self) -> &'static str {
        "stopping"
    }
    fn apply<'a>(&'a mut self, _d: &'a [Decision]) -> ActuateFuture<'a> {
        Box::pin(async { Ok(()) })
    }
    fn shutdown(&mut self) -> ActuateFuture<'_> {
        let n = self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            if n == 0 {
                Err(ActuateError::Invalid("still there".into()))
            } else {
                Ok(())
            }
        })
    }
}

#[tokio::test]
async fn dispatcher_shuts_every_actuator_down_even_after_a_failure() {
    let (a, b) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(1)));
    let mut d = Dispatcher::default();
    d.push(Box::new(Stopping(a.clone()))).expect("push");
    d.push(Box::new(Flaky(Arc::new(AtomicU32::new(0)))))
        .expect("push");
    d.push(Box::new(Stopping(b.clone()))).expect("push");
    d.shutdown(SHUTDOWN_TIMEOUT).await;
    assert_eq!(
        (a.load(Ordering::SeqCst), b.load(Ordering::SeqCst)),
        (1, 2),
        "both asked once"
    );
    let s = d.stats();
    assert_eq!(
        (s[0].failed, s[0].last_error.as_deref()),
        (1, Some("still there"))
    );
    assert_eq!(
        (s[1].ok, s[1].failed),
        (1, 0),
        "an actuator with nothing to remove succeeds"
    );
    assert_eq!((s[2].ok, s[2].failed), (1, 0));
}

#[test]
fn active_set_expires_and_allow_lifts() {
    let mut s = ActiveSet::default();
    let t0 = Instant::now();
    let ch = s.update(
        &[decision(
            1,
            "a",
            "b",
            "127.0.0.1:80",
            Action::SuppressRetries,
            100,
        )],
        t0,
    );
    assert_eq!(ch.upserted.len(), 1);
    assert_eq!(s.remaining(t0 + Duration::from_millis(50)).count(), 1);
    let ch = s.update(&[], t0 + Duration::from_millis(101));
    assert_eq!(ch.removed.len(), 1);
    assert!(s.is_empty());
    s.update(
        &[decision(
            2,
            "a",
            "b",
            "127.0.0.1:80",
            Action::SuppressRetries,
            1000,
        )],
        t0,
    );
    let ch = s.update(&[decision(3, "a", "b", "", Action::Allow, 0)], t0);
    assert_eq!(ch.removed.first().map(|d| d.id), Some(2));
    assert!(s.is_empty());
}

#[test]
fn active_set_caps_a_huge_ttl() {
    let mut s = ActiveSet::default();
    let t0 = Instant::now();
    let huge = decision(
        1,
        "a",
        "b",
        "127.0.0.1:80",
        Action::SuppressRetries,
        u64::MAX,
    );
    assert_eq!(s.update(&[huge], t0).upserted.len(), 1);
    let cap = Duration::from_millis(crate::decide::MAX_TTL_MS);
    assert_eq!(s.remaining(t0).map(|(_, left)| left).max(), Some(cap));
    assert!(s.update(&[], t0 + cap).removed.len() == 1 && s.is_empty());
}

/// A hostile or broken agent sends `remaining_ms = u64::MAX`: the shim's follow task keeps
/// following (it reads the next line on the same connection) and caps the entry's life.
#[tokio::test]
async fn a_control_line_with_u64_max_remaining_does_not_stop_the_follower() {
    let path = tmp("huge.sock");
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path).expect("bind");
    let view = control::ControlView::new();
    let follower = tokio::spawn(control::follow(path.clone(), view.clone()));
    let (mut agent, _) = listener.accept().await.expect("accept");
    let line = |seq: u64, ms: u64| {
        format!(
            "{{\"v\":2,\"seq\":{seq},\"sent_unix_ms\":0,\
             \"suppress\":[{{\"decision_id\":1,\"caller\":\"a\",\"callee\":\"b\",\
             \"callee_addrs\":[\"127.0.0.1:8080\"],\"reason\":\"over_budget\",\"remaining_ms\":{ms}}}],\
             \"claims\":[{{\"service\":\"b\",\"addrs\":[\"0.0.0.0:8080\"],\"claim\":\"claimed\",\"remaining_ms\":{ms}}}]}}\n"
        )
    };
    let wait_seq = |want: u64| {
        let view = view.clone();
        async move {
            let t0 = Instant::now();
            while view.seq() != want {
                assert!(
                    t0.elapsed() < Duration::from_secs(3),
                    "shim never read seq {want}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    let dst: SocketAddr = "127.0.0.1:8080".parse().expect("addr");
    use tokio::io::AsyncWriteExt;
    agent
        .write_all(line(1, u64::MAX).as_bytes())
        .await
        .expect("write");
    wait_seq(1).await;
    let now = Instant::now();
    let cap = Duration::from_millis(wire::MAX_REMAINING_MS);
    assert_eq!(view.suppression(&dst, now), Some(Reason::OverBudget));
    assert_eq!(view.claim(&dst, now), Some(crate::l7::Claim::Claimed));
    assert_eq!(
        view.suppression(&dst, now + cap + Duration::from_secs(1)),
        None
    );
    assert_eq!(view.claim(&dst, now + cap + Duration::from_secs(1)), None);
    // Still following, on the same connection.
    agent
        .write_all(line(2, 50).as_bytes())
        .await
        .expect("write");
    wait_seq(2).await;
    assert!(!follower.is_finished());
    assert_eq!(
        view.suppression(&dst, Instant::now() + Duration::from_millis(100)),
        None
    );
    follower.abort();
    let _ = std::fs::remove_file(&path);
}

// That the defaults are the flag defaults is checked for every config in `settings::tests`.
#[test]
fn actuators_parse_as_a_list() {
    use clap::Parser;
    #[derive(Parser)]
    struct C {
        #[command(flatten)]
        a: ActuateConfig,
    }
    let parsed = C::parse_from(["x"]).a;
    assert_eq!(
        parsed.actuators,
        vec![ActuatorKind::Control, ActuatorKind::DecisionLog]
    );
    let c = C::parse_from(["x", "--actuate", "haproxy,envoy"]).a;
    assert_eq!(
        c.actuators,
        vec![ActuatorKind::Haproxy, ActuatorKind::Envoy]
    );
    let c = C::parse_from(["x", "--actuators", "envoy"]).a;
    assert_eq!(c.actuators, vec![ActuatorKind::Envoy]);
}

#[test]
fn settings_that_cannot_work_are_refused() {
    use crate::settings::Settings;
    let bad = ActuateConfig {
        actuators: vec![
            ActuatorKind::Control,
            ActuatorKind::Haproxy,
            ActuatorKind::DecisionLog,
        ],
        control_socket: PathBuf::from(format!("/run/{}", "x".repeat(120))),
        haproxy_map: "/m.map; clear map x".into(),
        decision_log: PathBuf::from("/"),
        ..Default::default()
    };
    let Err(e) = bad.validate() else {
        panic!("accepted {bad:?}")
    };
    let flags: Vec<_> = e.0.iter().map(|p| p.flag).collect();
    assert_eq!(
        flags,
        [
            "actuate-control-socket",
            "actuate-haproxy-map",
            "actuate-decision-log"
        ]
    );
    // What is not used is not checked.
    let unused = ActuateConfig {
        haproxy_map: String::new(),
        ..Default::default()
    };
    assert!(unused.validate().is_ok());
}

#[tokio::test]
async fn control_socket_feeds_view_and_ttl_lapses() {
    let path = tmp("control.sock");
    let mut ctl = control::ControlActuator::bind(&path).expect("bind");
    let view = control::ControlView::new();
    let follower = tokio::spawn(control::follow(path.clone(), view.clone()));
    let dst: SocketAddr = "127.0.0.1:8080".parse().expect("addr");
    ctl.apply(&[decision(
        1,
        "a",
        "b",
        "127.0.0.1:8080",
        Action::SuppressRetries,
        300,
    )])
    .await
    .expect("apply");
    let claim = ServiceClaim {
        service: ServiceId::new("b"),
        addrs: vec!["0.0.0.0:8080".parse().expect("addr")],
        claim: crate::l7::Claim::Unclaimed,
        counts: crate::correlate::ClaimCounts {
            claimed: 0,
            unclaimed: 3,
            missing: 0,
        },
    };
    ctl.publish_claims(&[claim]).await.expect("claims");
    let t0 = Instant::now();
    while view.suppression(&dst, Instant::now()).is_none()
        || view.claim(&dst, Instant::now()).is_none()
    {
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "view never saw the decision"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        view.suppression(&dst, Instant::now()),
        Some(Reason::CalleeUnclaimed)
    );
    assert_eq!(
        view.suppression(&"127.0.0.1:8081".parse().expect("addr"), Instant::now()),
        None
    );
    assert_eq!(
        view.claim(&dst, Instant::now()),
        Some(crate::l7::Claim::Unclaimed)
    );
    // Agent dies: the view still expires the suppression by its TTL.
    drop(ctl);
    assert_eq!(
        view.suppression(&dst, Instant::now() + Duration::from_millis(400)),
        None
    );
    follower.abort();
}

#[tokio::test]
async fn bind_refuses_a_live_socket_and_replaces_a_stale_one() {
    let path = tmp("live.sock");
    let a = control::ControlActuator::bind(&path).expect("bind");
    assert!(control::ControlActuator::bind(&path).is_err());
    drop(a);
    let _stale = std::os::unix::net::UnixListener::bind(&path).map(drop);
    assert!(control::ControlActuator::bind(&path).is_ok());
}

#[tokio::test]
async fn decision_log_appends_json_lines() {
    let path = tmp("decisions.jsonl");
    let _ = std::fs::remove_file(&path);
    let mut log = decision_log::DecisionLog::open(&path).expect("open");
    log.apply(&[
        decision(7, "a", "b", "127.0.0.1:1", Action::SuppressRetries, 5),
        decision(8, "a", "b", "127.0.0.1:1", Action::Allow, 5),
    ])
    .await
    .expect("apply");
    let text = std::fs::read_to_string(&path).expect("read");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["kind"], "decision");
    assert_eq!(lines[0]["decision"]["id"], 7);
    assert_eq!(lines[1]["decision"]["action"], "allow");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn addr_patterns() {
    let p = |s: &str| s.parse::<SocketAddr>().expect("addr");
    assert!(control::addr_matches(&p("0.0.0.0:80"), &p("10.0.0.1:80")));
    assert!(control::addr_matches(
        &p("10.0.0.1:80"),
        &p("[::ffff:10.0.0.1]:80")
    ));
    assert!(!control::addr_matches(&p("10.0.0.1:80"), &p("10.0.0.2:80")));
    assert!(!control::addr_matches(&p("10.0.0.1:80"), &p("10.0.0.1:81")));
}

#[test]
fn haproxy_keys_cannot_inject_commands() {
    assert!(haproxy::valid_key("orders"));
    assert!(!haproxy::valid_key("a;clear map x"));
    assert!(!haproxy::valid_key("a b"));
    assert!(!haproxy::valid_key(""));
}

/// `show servers state` as HAProxy 2.6 prints it (backend names are the operator's).
const SERVERS_STATE: &str = "1
# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port
3 orders 1 s1 127.0.0.1 2 0 1 1 1 1 0 2 0 0 0 0 - 18081 - 0 0 - - 0
3 orders 2 s2 ::1 2 0 1 1 1 1 0 2 0 0 0 0 - 18082 - 0 0 - - 0
4 other 1 o1 127.0.0.2 2 0 1 1 1 1 0 2 0 0 0 0 - 9000 - 0 0 - - 0

";

#[test]
fn haproxy_backends_found_by_server_address() {
    let p = |s: &str| s.parse::<SocketAddr>().expect("addr");
    assert_eq!(
        haproxy::backends_serving(SERVERS_STATE, &[p("127.0.0.1:18081")], "svc"),
        vec!["orders"]
    );
    assert_eq!(
        haproxy::backends_serving(
            SERVERS_STATE,
            &[p("[::1]:18082"), p("127.0.0.1:18081")],
            "svc"
        ),
        vec!["orders"]
    );
    assert_eq!(
        haproxy::backends_serving(SERVERS_STATE, &[p("0.0.0.0:9000")], "svc"),
        vec!["other"]
    );
    // Nothing at that address: a backend named like the callee, else nothing.
    assert_eq!(
        haproxy::backends_serving(SERVERS_STATE, &[p("127.0.0.1:1")], "other"),
        vec!["other"]
    );
    assert!(haproxy::backends_serving(SERVERS_STATE, &[p("127.0.0.1:1")], "svc").is_empty());
    assert!(haproxy::backends_serving("garbage\nmore", &[p("127.0.0.1:18081")], "svc").is_empty());
}

#[tokio::test]
async fn haproxy_set_falls_back_to_add_then_del() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let path = tmp("haproxy.sock");
    let _ = std::fs::remove_file(&path);
    let l = tokio::net::UnixListener::bind(&path).expect("bind");
    let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let mut r = BufReader::new(s);
            let mut line = String::new();
            let _ = r.read_line(&mut line).await;
            let reply = if line.starts_with("set map") {
                "entry not found.\n"
            } else if line.starts_with("show servers state") {
                SERVERS_STATE
            } else {
                "\n"
            };
            seen2.lock().expect("lock").push(line.trim().to_string());
            let _ = r.get_mut().write_all(reply.as_bytes()).await;
        }
    });
    let mut h = haproxy::HaproxyActuator::new(path.clone(), "/m.map".into());
    let unknown = h
        .apply(&[decision(
            3,
            "a",
            "nobody",
            "127.0.0.9:1",
            Action::SuppressRetries,
            60_000,
        )])
        .await;
    assert!(
        matches!(unknown, Err(ActuateError::Invalid(_))),
        "{unknown:?}"
    );
    // The callee's id is not a backend name: the key is the backend serving its address.
    h.apply(&[decision(
        1,
        "a",
        "orders-svc",
        "127.0.0.1:18081",
        Action::SuppressRetries,
        60_000,
    )])
    .await
    .expect("apply");
    h.apply(&[decision(
        2,
        "a",
        "orders-svc",
        "127.0.0.1:18081",
        Action::Allow,
        0,
    )])
    .await
    .expect("lift");
    let seen: Vec<String> = seen
        .lock()
        .expect("lock")
        .iter()
        .filter(|l| *l != "show servers state")
        .cloned()
        .collect();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(seen[0].starts_with("set map /m.map orders "));
    assert!(seen[1].starts_with("add map /m.map orders "));
    let until: u64 = seen[1]
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("value");
    assert!(until >= control::unix_ms() / 1000 + 59);
    assert_eq!(seen[2], "del map /m.map orders");
    let _ = std::fs::remove_file(&path);
}

/// `/clusters?format=json` as Envoy 1.40 prints it, trimmed to the fields read.
const ENVOY_CLUSTERS: &str = r#"{"cluster_statuses": [
 {"name": "outbound|8080||orders.shop.svc.cluster.local",
  "host_statuses": [{"address": {"socket_address": {"address": "127.0.0.1", "port_value": 18081}},
                     "stats": [{"name": "cx_total", "value": "8"}], "weight": 1}],
  "observability_name": "outbound|8080||orders.shop.svc.cluster.local"},
 {"name": "backend_orders", "host_statuses": [{"address": {"socket_address": {"address": "::1", "port_value": 18081}}}]},
 {"name": "pipe", "host_statuses": [{"address": {"pipe": {"path": "/run/x.sock"}}}]},
 {"name": "empty"}
]}"#;

#[test]
fn envoy_clusters_found_by_endpoint_address() {
    let p = |s: &str| s.parse::<SocketAddr>().expect("addr");
    let c: envoy::Clusters = serde_json::from_str(ENVOY_CLUSTERS).expect("json");
    assert_eq!(
        c.holding(&[p("127.0.0.1:18081")]),
        vec!["outbound|8080||orders.shop.svc.cluster.local"]
    );
    assert_eq!(
        c.holding(&[p("0.0.0.0:18081")]),
        vec![
            "outbound|8080||orders.shop.svc.cluster.local",
            "backend_orders"
        ]
    );
    assert!(c.holding(&[p("127.0.0.1:18082")]).is_empty());
}

#[test]
fn envoy_keys_cover_both_priorities_and_budgets_and_encode_names() {
    let t = envoy::Target::Cluster("outbound|8080||orders".into());
    let on = envoy::runtime_keys(&t, Some(1234));
    assert!(on.contains(&(
        "circuit_breakers.outbound|8080||orders.default.max_retries".into(),
        "0".into()
    )));
    assert!(on.contains(&(
        "circuit_breakers.outbound|8080||orders.high.retry_budget.budget_percent".into(),
        "0".into()
    )));
    assert!(on.contains(&(
        "circuit_breakers.outbound|8080||orders.default.retry_budget.min_retry_concurrency".into(),
        "0".into()
    )));
    assert!(on.contains(&(
        "retry_agent.suppressed_until.outbound|8080||orders".into(),
        "1234".into()
    )));
    assert_eq!(on.len(), 7);
    let off = envoy::runtime_keys(&t, None);
    assert_eq!(off.len(), 7);
    assert!(
        off.iter().all(|(_, v)| v.is_empty()),
        "lifting empties every key: {off:?}"
    );
    assert_eq!(
        envoy::runtime_keys(&envoy::Target::AllRoutes, Some(1))[0],
        ("upstream.use_retry".into(), "0".into())
    );
    let body = envoy::form_body(&[
        ("a.b|c".into(), "0".into()),
        ("x y&z".into(), String::new()),
    ]);
    assert_eq!(body, "a.b%7Cc=0&x%20y%26z=");
}

#[test]
fn envoy_sweep_finds_only_lapsed_markers() {
    let rt = serde_json::json!({"layers": ["static", "admin"], "entries": {
        "retry_agent.suppressed_until.old": {"final_value": "100", "layer_values": ["", "100"]},
        "retry_agent.suppressed_until.fresh": {"final_value": "300", "layer_values": ["", "300"]},
        "retry_agent.suppressed_until.*": {"final_value": "junk"},
        "circuit_breakers.old.default.max_retries": {"final_value": "0"}
    }});
    let mut lapsed = envoy::lapsed_markers(&rt, 200);
    lapsed.sort();
    assert_eq!(
        lapsed,
        vec![
            envoy::Target::AllRoutes,
            envoy::Target::Cluster("old".into())
        ]
    );
    assert!(envoy::lapsed_markers(&serde_json::json!({}), 200).is_empty());
}

/// The failure a new user met: an Envoy without an admin runtime layer answers 503. The error
/// carries Envoy's own words.
#[tokio::test]
async fn envoy_admin_refusal_is_reported_with_its_body() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    let body = ENVOY_CLUSTERS.to_string();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let mut buf = vec![0u8; 8192];
            let k = s.read(&mut buf).await.unwrap_or(0);
            let head = String::from_utf8_lossy(buf.get(..k).unwrap_or_default()).to_string();
            let resp = if head.starts_with("GET /clusters?format=json ") {
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                )
            } else {
                "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 24\r\n\r\nNo admin layer specified".to_string()
            };
            let _ = s.write_all(resp.as_bytes()).await;
        }
    });
    let mut e = envoy::EnvoyActuator::new(addr);
    let r = e
        .apply(&[decision(
            1,
            "a",
            "orders",
            "127.0.0.1:18081",
            Action::SuppressRetries,
            60_000,
        )])
        .await;
    match r {
        Err(ActuateError::EnvoyStatus { status, body, .. }) => {
            assert!(status.starts_with("503"), "{status}");
            assert_eq!(body, "No admin layer specified");
        }
        other => panic!("expected the 503 to be reported: {other:?}"),
    }
}
