//! A real HAProxy (Debian package) driven by the HAProxy actuator through its runtime API.
//! Run: `cargo test -p integration-tests --test haproxy`
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use std::{
    net::SocketAddr,
    process::{Command, Stdio},
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use integration_tests::actuate::{
    Proc, allow, free_port, http_get, status_server, suppress, wait_until,
};
use retry_agent::actuate::{Actuator, haproxy::HaproxyActuator};

const BACKEND: &str = "rashim_callee";
/// The callee's service id as the agent names it: not the backend's name (the actuator finds the
/// backend by its server's address).
const CALLEE: &str = "orders";

fn config(fe: u16, be: SocketAddr, sock: &str, map: &str) -> String {
    format!(
        r#"global
    stats socket {sock} mode 600 level admin
defaults
    mode http
    timeout connect 1s
    timeout client 10s
    timeout server 10s
frontend rashim_fe
    bind 127.0.0.1:{fe}
    default_backend {BACKEND}
backend {BACKEND}
    retries 3
    retry-on all-retryable-errors
    http-request set-var(txn.ra_until) be_name,map_str_int({map},0)
    http-request set-var(txn.ra_now) date
    http-request set-var(txn.ra_left) var(txn.ra_until),sub(txn.ra_now)
    http-request disable-l7-retry if {{ var(txn.ra_left) -m int gt 0 }}
    server s1 {be}
"#
    )
}

/// Backend answers 503: 4 attempts per request (retries 3) before the actuator's map update,
/// 1 after; the same HAProxy process throughout (no reload); lifting restores retries.
#[test]
fn haproxy_map_update_disables_l7_retries_without_reload() {
    if Command::new("haproxy").arg("-v").output().is_err() {
        eprintln!("skip: haproxy not installed (apt-get install haproxy)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("rashim-haproxy-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let (sock, map, cfg) = (
        dir.join("admin.sock"),
        dir.join("retry-suppress.map"),
        dir.join("haproxy.cfg"),
    );
    std::fs::write(&map, "").expect("map file");
    let (be, hits) = status_server("503 Service Unavailable");
    let fe = free_port();
    let (sock_s, map_s) = (sock.display().to_string(), map.display().to_string());
    std::fs::write(&cfg, config(fe, be, &sock_s, &map_s)).expect("cfg");
    let check = Command::new("haproxy")
        .arg("-c")
        .arg("-f")
        .arg(&cfg)
        .output()
        .expect("haproxy -c");
    assert!(
        check.status.success(),
        "config rejected: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    let hap = Proc::from_child(
        Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn haproxy"),
    );
    let pid = hap.0.id();
    let fe_addr: SocketAddr = format!("127.0.0.1:{fe}").parse().expect("addr");
    assert!(
        wait_until(Duration::from_secs(5), || sock.exists()
            && std::net::TcpStream::connect(fe_addr).is_ok())
        .is_some()
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let mut act = HaproxyActuator::new(sock.clone(), map_s.clone());
    let attempts_per_request = |n: u64| {
        let before = hits.load(Ordering::SeqCst);
        for i in 0..n {
            let r = http_get(fe_addr, &format!("/r/{i}"), "").expect("request");
            assert_eq!(r.0, 503);
        }
        (hits.load(Ordering::SeqCst) - before) as f64 / n as f64
    };

    let before = attempts_per_request(5);
    assert_eq!(before, 4.0, "retries 3 → 4 attempts per request");

    let t0 = Instant::now();
    rt.block_on(act.apply(&[suppress(CALLEE, be, 60_000)]))
        .expect("apply");
    let applied = t0.elapsed();
    let shown = rt
        .block_on(act.command(&format!("show map {map_s}")))
        .expect("show map");
    assert!(shown.contains(BACKEND), "map entry missing: {shown}");
    let during = attempts_per_request(5);
    assert_eq!(during, 1.0, "suppressed: one attempt per request");
    eprintln!(
        "FIGURE haproxy_apply_ms={:.2} attempts/request before={before} after={during}",
        applied.as_secs_f64() * 1000.0
    );

    // Refresh is an update of the same key (set map), not a duplicate.
    rt.block_on(act.apply(&[suppress(CALLEE, be, 60_000)]))
        .expect("refresh");
    let shown = rt
        .block_on(act.command(&format!("show map {map_s}")))
        .expect("show map");
    assert_eq!(shown.matches(BACKEND).count(), 1, "{shown}");

    rt.block_on(act.apply(&[allow(CALLEE)])).expect("lift");
    assert_eq!(attempts_per_request(3), 4.0, "lifted: retries back");

    // TTL enforced by HAProxy itself: a 1 s suppression ends without the agent doing anything.
    rt.block_on(act.apply(&[suppress(CALLEE, be, 1000)]))
        .expect("short");
    assert_eq!(attempts_per_request(2), 1.0);
    std::thread::sleep(Duration::from_millis(2100));
    assert_eq!(
        attempts_per_request(2),
        4.0,
        "expired suppression must not hold"
    );

    // Shutdown removes the entry at once (it would also lapse by its own time).
    rt.block_on(act.apply(&[suppress(CALLEE, be, 60_000)]))
        .expect("again");
    assert_eq!(attempts_per_request(2), 1.0);
    rt.block_on(act.shutdown()).expect("shutdown");
    let shown = rt
        .block_on(act.command(&format!("show map {map_s}")))
        .expect("show map");
    assert!(
        !shown.contains(BACKEND),
        "entry left after shutdown: {shown}"
    );
    assert_eq!(attempts_per_request(2), 4.0, "shut down: retries back");

    // Same process all along: no reload, no restart.
    let mut hap = hap;
    assert!(hap.0.try_wait().ok().flatten().is_none(), "haproxy exited");
    assert_eq!(hap.0.id(), pid);
    drop(hap);
    let _ = std::fs::remove_dir_all(&dir);
}
