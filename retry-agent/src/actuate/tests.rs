use std::{
    net::SocketAddr,
    sync::{Arc, atomic::{AtomicU32, Ordering}},
    time::{Duration, Instant},
};

use super::*;
use crate::{
    correlate::{Edge, ServiceId},
    decide::{Action, Reason},
};

pub(crate) fn decision(id: u64, caller: &str, callee: &str, addr: &str, action: Action, ttl_ms: u64) -> Decision {
    Decision {
        id,
        edge: Edge { caller: ServiceId::new(caller), callee: ServiceId::new(callee) },
        callee_addrs: addr.parse::<SocketAddr>().into_iter().collect(),
        action,
        reason: Reason::CalleeUnclaimed,
        issued_at_ns: 0,
        ttl_ms,
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
        Box::pin(async move { if n % 2 == 0 { Err(ActuateError::Invalid("boom".into())) } else { Ok(()) } })
    }
}

#[tokio::test]
async fn dispatcher_counts_failures_and_keeps_going() {
    let calls = Arc::new(AtomicU32::new(0));
    let mut d = Dispatcher::default();
    d.push(Box::new(Flaky(calls.clone())));
    d.push(Box::new(Flaky(Arc::new(AtomicU32::new(1)))));
    for _ in 0..3 {
        d.apply(&[]).await;
    }
    let s = d.stats();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!((s[0].ok, s[0].failed), (1, 2));
    assert_eq!((s[1].ok, s[1].failed), (2, 1));
    assert_eq!(s[0].last_error.as_deref(), Some("boom"));
}

#[test]
fn active_set_expires_and_allow_lifts() {
    let mut s = ActiveSet::default();
    let t0 = Instant::now();
    let ch = s.update(&[decision(1, "a", "b", "127.0.0.1:80", Action::SuppressRetries, 100)], t0);
    assert_eq!(ch.upserted.len(), 1);
    assert_eq!(s.remaining(t0 + Duration::from_millis(50)).count(), 1);
    let ch = s.update(&[], t0 + Duration::from_millis(101));
    assert_eq!(ch.removed.len(), 1);
    assert!(s.is_empty());
    s.update(&[decision(2, "a", "b", "127.0.0.1:80", Action::SuppressRetries, 1000)], t0);
    let ch = s.update(&[decision(3, "a", "b", "", Action::Allow, 0)], t0);
    assert_eq!(ch.removed.first().map(|d| d.id), Some(2));
    assert!(s.is_empty());
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
    assert_eq!(parsed.actuators, vec![ActuatorKind::Control, ActuatorKind::DecisionLog]);
    let c = C::parse_from(["x", "--actuate", "haproxy,envoy"]).a;
    assert_eq!(c.actuators, vec![ActuatorKind::Haproxy, ActuatorKind::Envoy]);
    let c = C::parse_from(["x", "--actuators", "envoy"]).a;
    assert_eq!(c.actuators, vec![ActuatorKind::Envoy]);
}

#[test]
fn settings_that_cannot_work_are_refused() {
    use crate::settings::Settings;
    let bad = ActuateConfig {
        actuators: vec![ActuatorKind::Control, ActuatorKind::Haproxy, ActuatorKind::DecisionLog],
        control_socket: PathBuf::from(format!("/run/{}", "x".repeat(120))),
        haproxy_map: "/m.map; clear map x".into(),
        decision_log: PathBuf::from("/"),
        ..Default::default()
    };
    let Err(e) = bad.validate() else { panic!("accepted {bad:?}") };
    let flags: Vec<_> = e.0.iter().map(|p| p.flag).collect();
    assert_eq!(flags, ["actuate-control-socket", "actuate-haproxy-map", "actuate-decision-log"]);
    // What is not used is not checked.
    let unused = ActuateConfig { haproxy_map: String::new(), ..Default::default() };
    assert!(unused.validate().is_ok());
}

#[tokio::test]
async fn control_socket_feeds_view_and_ttl_lapses() {
    let path = tmp("control.sock");
    let mut ctl = control::ControlActuator::bind(&path).expect("bind");
    let view = control::ControlView::new();
    let follower = tokio::spawn(control::follow(path.clone(), view.clone()));
    let dst: SocketAddr = "127.0.0.1:8080".parse().expect("addr");
    ctl.apply(&[decision(1, "a", "b", "127.0.0.1:8080", Action::SuppressRetries, 300)]).await.expect("apply");
    let claim = ServiceClaim {
        service: ServiceId::new("b"),
        addrs: vec!["0.0.0.0:8080".parse().expect("addr")],
        claim: crate::l7::Claim::Unclaimed,
        counts: crate::correlate::ClaimCounts { claimed: 0, unclaimed: 3, missing: 0 },
    };
    ctl.publish_claims(&[claim]).await.expect("claims");
    let t0 = Instant::now();
    while view.suppression(&dst, Instant::now()).is_none() || view.claim(&dst, Instant::now()).is_none() {
        assert!(t0.elapsed() < Duration::from_secs(3), "view never saw the decision");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(view.suppression(&dst, Instant::now()), Some(Reason::CalleeUnclaimed));
    assert_eq!(view.suppression(&"127.0.0.1:8081".parse().expect("addr"), Instant::now()), None);
    assert_eq!(view.claim(&dst, Instant::now()), Some(crate::l7::Claim::Unclaimed));
    // Agent dies: the view still expires the suppression by its TTL.
    drop(ctl);
    assert_eq!(view.suppression(&dst, Instant::now() + Duration::from_millis(400)), None);
    follower.abort();
}

#[tokio::test]
async fn bind_refuses_a_live_socket_and_replaces_a_stale_one() {
    let path = tmp("live.sock");
    let a = control::ControlActuator::bind(&path).expect("bind");
    assert!(control::ControlActuator::bind(&path).is_err());
    drop(a);
    let _stale = std::os::unix::net::UnixListener::bind(&path).map(|l| drop(l));
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
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).expect("json")).collect();
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
    assert!(control::addr_matches(&p("10.0.0.1:80"), &p("[::ffff:10.0.0.1]:80")));
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
            let reply = if line.starts_with("set map") { "entry not found.\n" } else { "\n" };
            seen2.lock().expect("lock").push(line.trim().to_string());
            let _ = r.get_mut().write_all(reply.as_bytes()).await;
        }
    });
    let mut h = haproxy::HaproxyActuator::new(path.clone(), "/m.map".into());
    h.apply(&[decision(1, "a", "orders", "127.0.0.1:1", Action::SuppressRetries, 60_000)]).await.expect("apply");
    h.apply(&[decision(2, "a", "orders", "127.0.0.1:1", Action::Allow, 0)]).await.expect("lift");
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(seen[0].starts_with("set map /m.map orders "));
    assert!(seen[1].starts_with("add map /m.map orders "));
    let until: u64 = seen[1].rsplit(' ').next().and_then(|v| v.parse().ok()).expect("value");
    assert!(until >= control::unix_ms() / 1000 + 59);
    assert_eq!(seen[2], "del map /m.map orders");
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn envoy_runtime_modify_and_error_status() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let reqs = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let reqs2 = reqs.clone();
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((mut s, _)) = l.accept().await {
            let mut buf = vec![0u8; 4096];
            let k = s.read(&mut buf).await.unwrap_or(0);
            reqs2.lock().expect("lock").push(String::from_utf8_lossy(&buf[..k]).lines().next().unwrap_or("").to_string());
            let resp: &[u8] = if n == 0 { b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nOK" } else { b"HTTP/1.1 400 Bad Request\r\ncontent-length: 3\r\n\r\nbad" };
            n += 1;
            let _ = s.write_all(resp).await;
        }
    });
    let mut e = envoy::EnvoyActuator::new(addr);
    e.apply(&[decision(1, "a", "orders", "127.0.0.1:1", Action::SuppressRetries, 60_000)]).await.expect("apply");
    let r = e.apply(&[decision(2, "a", "orders", "127.0.0.1:1", Action::Allow, 0)]).await;
    assert!(matches!(r, Err(ActuateError::EnvoyStatus { .. })), "{r:?}");
    let reqs = reqs.lock().expect("lock").clone();
    assert_eq!(reqs[0], "POST /runtime_modify?circuit_breakers.orders.default.max_retries=0 HTTP/1.1");
    assert_eq!(reqs[1], "POST /runtime_modify?circuit_breakers.orders.default.max_retries= HTTP/1.1");
}
