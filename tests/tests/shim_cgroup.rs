//! The shim steered by cgroup eBPF programs (`--shim-steer cgroup`), and failing open when its
//! whole cgroup is killed (`cgroup.kill`: the shim and anything with it die at once, as in a pod
//! OOM). Root and a cgroup v2 mount needed; traffic to loopback only.
//! Run: `cargo test -p integration-tests --test shim_cgroup`
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use integration_tests::actuate::{
    agent_bin, free_port, http_get, status_server, status_server_at, suppress, wait_until,
};
use retry_agent::actuate::{Actuator, control::ControlActuator, shim::cgroup::STEER_OBJECT};

/// Both tests count the kernel's `ra_steer_*` programs: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The cgroup v2 mount point, from /proc/self/mountinfo (`… - cgroup2 …`).
fn cgroup2_root() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        if post.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        pre.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// A fresh cgroup v2 child; on drop everything in it is killed and it is removed.
struct Cgroup(PathBuf);

impl Cgroup {
    fn create(root: &Path, name: &str) -> std::io::Result<Cgroup> {
        let p = root.join(format!("rashim-{}-{name}", std::process::id()));
        std::fs::create_dir(&p)?;
        Ok(Cgroup(p))
    }

    fn kill(&self) {
        let _ = std::fs::write(self.0.join("cgroup.kill"), "1");
    }

    fn empty(&self) -> bool {
        std::fs::read_to_string(self.0.join("cgroup.procs")).is_ok_and(|s| s.trim().is_empty())
    }

    /// `cmd args…` started inside this cgroup (a shell moves itself in, then execs).
    fn spawn(&self, cmd: &Path, args: &[&str]) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", r#"echo 0 > "$0/cgroup.procs" && exec "$@""#])
            .arg(&self.0)
            .arg(cmd)
            .args(args)
            .stdin(Stdio::null());
        c
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        self.kill();
        let _ = wait_until(Duration::from_secs(5), || self.empty());
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Reaps a child (already killed with its cgroup) on drop.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One request from a process in `cg`: the response head, or None if the connection failed.
fn client_get(cg: &Cgroup, dst: SocketAddr) -> Option<String> {
    let url = format!("http://{dst}/failopen");
    let out = cg
        .spawn(
            Path::new("curl"),
            &["-s", "-i", "-m", "3", "-H", "x-retry-attempt: 1", &url],
        )
        .output()
        .ok()?;
    let head = String::from_utf8_lossy(&out.stdout).to_string();
    (out.status.success() && head.starts_with("HTTP/")).then_some(head)
}

/// Programs of the steering object the kernel still holds (by their 15-byte kernel names).
fn steer_programs() -> usize {
    aya::programs::loaded_programs()
        .flatten()
        .filter(|p| p.name_as_str().is_some_and(|n| n.starts_with("ra_steer_")))
        .count()
}

/// The programs attached to `cg`, as bpftool shows them (None without bpftool).
fn bpftool_attached(cg: &Cgroup) -> Option<String> {
    let out = Command::new("bpftool")
        .arg("cgroup")
        .arg("show")
        .arg(&cg.0)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).to_string())
}

/// A workload's suppressed retry is answered by the shim (it was steered); a process outside
/// the workload cgroup reaches the service directly. Then the shim's cgroup is killed: within
/// 2 s the workload's next connection reaches the service directly (not refused, not steered)
/// and no program or link of the shim is left in the kernel.
#[test]
fn killing_the_shims_cgroup_leaves_connections_direct() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0"))
        .ok()
        != Some(true)
    {
        eprintln!("skip: needs root (cgroups, eBPF)");
        return;
    }
    let Some(root) = cgroup2_root() else {
        eprintln!("skip: no cgroup v2 mount");
        return;
    };
    if STEER_OBJECT.is_empty() || Command::new("curl").arg("--version").output().is_err() {
        eprintln!("skip: no steering object (cargo xtask build-ebpf) or no curl");
        return;
    }
    assert_eq!(
        steer_programs(),
        0,
        "steering programs left over from an earlier run"
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        // The control socket serves followers from a background task.
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let _g = rt.enter();
    let ctl_path = std::env::temp_dir().join(format!("rashim-{}-cg.sock", std::process::id()));
    let mut ctl = ControlActuator::bind(&ctl_path).expect("control socket");
    let (svc, hits) = status_server("503 Service Unavailable");
    // IPv6 too (connect6 and the IPv6 key), where [::1] exists.
    let svc6 = std::net::TcpListener::bind("[::1]:0")
        .is_ok()
        .then(|| status_server_at("[::1]:0", "503 Service Unavailable").0);

    let shim_cg = Cgroup::create(&root, "shim").expect("shim cgroup");
    let workload = Cgroup::create(&root, "workload").expect("workload cgroup");
    let port = free_port().to_string();
    let log_path = std::env::temp_dir().join(format!("rashim-{}-cg.log", std::process::id()));
    let log = std::fs::File::create(&log_path).expect("log file");
    let wl = workload.0.to_string_lossy().to_string();
    let dports = [Some(svc), svc6]
        .iter()
        .flatten()
        .map(|a| a.port().to_string())
        .collect::<Vec<_>>()
        .join(",");
    let ctl_arg = ctl_path.to_string_lossy().to_string();
    let shim = shim_cg
        .spawn(
            &agent_bin(),
            &[
                "--log",
                "info,retry_agent::actuate=debug",
                "shim",
                "--shim-port",
                &port,
                "--shim-steer",
                "cgroup",
                "--shim-steer-cgroup",
                &wl,
                "--shim-dport",
                &dports,
                "--shim-control-socket",
                &ctl_arg,
                "--shim-ipv6",
                if svc6.is_some() { "true" } else { "false" },
                "--shim-threads",
                "1",
            ],
        )
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn shim");
    // `sh` exec'd into the shim: same pid.
    let shim_pid = shim.id();
    let mut shim = Reap(shim);
    let up = || std::fs::read_to_string(&log_path).is_ok_and(|l| l.contains("steering installed"));
    // Up, or exited (a refused attach ends the shim at once).
    let _ = wait_until(Duration::from_secs(30), || {
        up() || shim.0.try_wait().is_ok_and(|s| s.is_some())
    });
    assert!(
        up(),
        "shim did not come up: {}",
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );
    // sock_ops, connect4 and getpeername4, and their IPv6 twins when the shim steers IPv6.
    let programs = if svc6.is_some() { 5 } else { 3 };
    assert_eq!(steer_programs(), programs, "steering programs loaded");
    if let Some(shown) = bpftool_attached(&workload) {
        assert!(
            shown.contains("connect4") && shown.contains("sock_ops"),
            "{shown}"
        );
    }

    // The agent's capture, to see which callee it records for a steered connect.
    let mut cap = integration_tests::fixture::load();
    let mut decisions = vec![suppress("rashim-cg", svc, 60_000)];
    decisions.extend(svc6.map(|a| suppress("rashim-cg6", a, 60_000)));
    rt.block_on(ctl.apply(&decisions)).expect("apply");
    let steered = wait_until(Duration::from_secs(5), || {
        [Some(svc), svc6]
            .iter()
            .flatten()
            .all(|a| client_get(&workload, *a).is_some_and(|h| h.contains("x-retry-suppressed")))
    });
    assert!(
        steered.is_some(),
        "the workload's retry never reached the shim (see {})",
        log_path.display()
    );
    // The capture names the service as the callee, not the shim's port the connect was
    // rewritten to (the agent's decisions for the edge must match what the shim forwards to).
    if let Some(cap) = cap.as_mut() {
        let shim_port: u16 = port.parse().expect("port");
        // The clients only: not this process (servers), nor the shim (its upstream connects).
        let me = std::process::id();
        let remotes = |evs: &[retry_agent::capture::Event]| {
            integration_tests::fixture::conn_events(evs)
                .iter()
                .filter(|c| c.pid != me && c.pid != shim_pid)
                .filter_map(|c| c.tuple.map(|t| t.remote))
                .collect::<Vec<_>>()
        };
        let evs = rt.block_on(integration_tests::fixture::collect(
            cap,
            Duration::from_secs(3),
            |e| matches!(e, retry_agent::capture::Event::Conn(c) if c.role == retry_agent::capture::Role::Client),
            |evs| {
                let r = remotes(evs);
                r.contains(&svc) && svc6.is_none_or(|a| r.contains(&a))
            },
        ));
        let seen = remotes(&evs);
        assert!(
            seen.contains(&svc) && svc6.is_none_or(|a| seen.contains(&a)),
            "no client connection to {svc} captured: {seen:?}"
        );
        assert!(
            seen.iter().all(|r| r.port() != shim_port),
            "a steered connection was recorded as going to the shim: {seen:?}"
        );
    }
    drop(cap);
    // The steered client's getpeername() names the service, as under REDIRECT.
    let peer_port = |dst: SocketAddr| {
        let code = "import socket,sys; s=socket.create_connection((sys.argv[1], int(sys.argv[2])), 3); print(s.getpeername()[1])";
        let ip = dst.ip().to_string();
        let port = dst.port().to_string();
        let out = workload
            .spawn(Path::new("python3"), &["-c", code, &ip, &port])
            .output()
            .expect("python3");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    for a in [Some(svc), svc6].iter().flatten() {
        assert_eq!(
            peer_port(*a),
            a.port().to_string(),
            "getpeername of a steered socket to {a}"
        );
    }
    // Outside the workload cgroup nothing is steered.
    let (status, head) =
        http_get(svc, "/direct", "x-retry-attempt: 1\r\n").expect("direct request");
    assert!(
        status == 503 && !head.contains("x-retry-suppressed"),
        "{head}"
    );
    // Nor in another network namespace (its loopback does not reach the shim): a server on the
    // steered port inside a fresh netns answers the workload's client there.
    let script = format!(
        "ip link set lo up && python3 -m http.server {p} --bind 127.0.0.1 >/dev/null 2>&1 & \
         for i in $(seq 50); do curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{p}/ && break; \
         sleep 0.1; done; kill $!",
        p = svc.port()
    );
    let out = workload
        .spawn(Path::new("unshare"), &["-n", "sh", "-c", &script])
        .output()
        .expect("unshare");
    let codes = String::from_utf8_lossy(&out.stdout);
    assert!(
        codes.ends_with("200"),
        "another netns was steered: {codes:?}"
    );

    let before = hits.load(std::sync::atomic::Ordering::Relaxed);
    let t0 = Instant::now();
    shim_cg.kill();
    let mut refused = 0;
    let direct = wait_until(Duration::from_secs(2), || {
        [Some(svc), svc6]
            .iter()
            .flatten()
            .all(|a| match client_get(&workload, *a) {
                Some(h) => h.starts_with("HTTP/1.1 503") && !h.contains("x-retry-suppressed"),
                None => {
                    refused += 1;
                    false
                }
            })
    });
    let direct = direct
        .map(|_| t0.elapsed())
        .expect("connections did not go direct within 2 s of cgroup.kill");
    assert!(
        hits.load(std::sync::atomic::Ordering::Relaxed) > before,
        "the service saw the direct request"
    );
    eprintln!(
        "FIGURE cgroup_kill_to_direct_ms={:.1} failed_attempts={refused}",
        direct.as_secs_f64() * 1000.0
    );

    let gone = wait_until(Duration::from_secs(2), || {
        steer_programs() == 0 && shim_cg.empty()
    });
    assert!(
        gone.is_some(),
        "steering programs still loaded after the shim's cgroup died"
    );
    if let Some(shown) = bpftool_attached(&workload) {
        assert!(
            !shown.contains("connect4") && !shown.contains("sock_ops"),
            "{shown}"
        );
    }
    drop(ctl);
    let _ = std::fs::remove_file(&ctl_path);
}

/// Inbound (`--shim-inbound-port` with `--shim-steer cgroup`: sk_lookup on the shim's netns): a
/// connection from another namespace to a service next to the shim, over IPv4 and IPv6, is
/// handed to the shim (a suppressed retry is answered by it, so the original destination was
/// known; a first attempt is forwarded to the service), while the same retry from inside the
/// service's namespace (a loopback arrival) reaches the service directly; after `cgroup.kill` of
/// the shim's cgroup the remote requests reach the service directly too.
#[test]
fn inbound_steering_dies_with_the_shims_cgroup() {
    use integration_tests::fixture::{NetnsPair, Proc, wait_listening};
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(root) = cgroup2_root() else {
        eprintln!("skip: no cgroup v2 mount");
        return;
    };
    if STEER_OBJECT.is_empty() || Command::new("curl").arg("--version").output().is_err() {
        eprintln!("skip: no steering object (cargo xtask build-ebpf) or no curl");
        return;
    }
    let Some(pair) = NetnsPair::create("sk", 77) else {
        return;
    };
    // IPv6 where the kernel has it (the IPv4 half still runs without).
    let v6 = pair.add_ipv6(77);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let _g = rt.enter();
    let ctl_path = std::env::temp_dir().join(format!("rashim-{}-in.sock", std::process::id()));
    let mut ctl = ControlActuator::bind(&ctl_path).expect("control socket");
    let port = free_port().to_string();
    let svc: SocketAddr = format!("{}:{port}", pair.ip_a).parse().expect("addr");
    let svc6 = v6.map(|(a, _)| SocketAddr::from((a, svc.port())));
    let services: Vec<SocketAddr> = [Some(svc), svc6].into_iter().flatten().collect();
    let _servers: Vec<Proc> = services
        .iter()
        .map(|a| {
            let server = Proc::spawn(
                NetnsPair::exec(&pair.a, "python3")
                    .args(["-m", "http.server", &port, "--bind", &a.ip().to_string()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null()),
            );
            wait_listening(&a.to_string(), Some(&pair.a));
            server
        })
        .collect();

    let shim_cg = Cgroup::create(&root, "shim-in").expect("shim cgroup");
    let log_path = std::env::temp_dir().join(format!("rashim-{}-in.log", std::process::id()));
    let log = std::fs::File::create(&log_path).expect("log file");
    let shim_port = free_port().to_string();
    let bin = agent_bin().to_string_lossy().to_string();
    let ctl_arg = ctl_path.to_string_lossy().to_string();
    let shim = shim_cg
        .spawn(
            Path::new("ip"),
            &[
                "netns",
                "exec",
                &pair.a,
                &bin,
                "--log",
                "info,retry_agent::actuate=debug",
                "shim",
                "--shim-port",
                &shim_port,
                "--shim-steer",
                "cgroup",
                "--shim-inbound-port",
                &port,
                "--shim-control-socket",
                &ctl_arg,
                "--shim-ipv6",
                if svc6.is_some() { "true" } else { "false" },
                "--shim-threads",
                "1",
            ],
        )
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn shim");
    let mut shim = Reap(shim);
    let up = || std::fs::read_to_string(&log_path).is_ok_and(|l| l.contains("steering installed"));
    let _ = wait_until(Duration::from_secs(30), || {
        up() || shim.0.try_wait().is_ok_and(|s| s.is_some())
    });
    assert!(
        up(),
        "shim did not come up: {}",
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );
    assert_eq!(steer_programs(), 1, "sk_lookup loaded");

    // One request from namespace `ns` (a retry unless `first`): the response head, if any.
    let get = |ns: &str, dst: SocketAddr, first: bool| {
        let mut c = NetnsPair::exec(ns, "curl");
        c.args(["-s", "-i", "-m", "3", "-g"]);
        if !first {
            c.args(["-H", "x-retry-attempt: 1"]);
        }
        let out = c.arg(format!("http://{dst}/")).output().ok()?;
        let head = String::from_utf8_lossy(&out.stdout).to_string();
        (out.status.success() && head.starts_with("HTTP/")).then_some(head)
    };
    let direct = |h: &Option<String>| {
        h.as_ref()
            .is_some_and(|h| h.starts_with("HTTP/1.0 200") && !h.contains("x-retry-suppressed"))
    };
    // One edge per address: a decision replaces the last one for the same edge.
    let decisions: Vec<_> = services
        .iter()
        .zip(["rashim-in", "rashim-in6"])
        .map(|(a, callee)| suppress(callee, *a, 60_000))
        .collect();
    rt.block_on(ctl.apply(&decisions)).expect("apply");
    for a in &services {
        let steered = wait_until(Duration::from_secs(5), || {
            get(&pair.b, *a, false).is_some_and(|h| h.contains("x-retry-suppressed"))
        });
        assert!(
            steered.is_some(),
            "the inbound retry to {a} never reached the shim: {:?}",
            get(&pair.b, *a, false)
        );
        // A first attempt is forwarded to the original destination.
        let first = get(&pair.b, *a, true);
        assert!(
            first.as_ref().is_some_and(|h| h.contains(" 200 ")),
            "first attempt to {a}: {first:?}"
        );
        // Loopback arrivals (a client next to the service) are left alone.
        let local = get(&pair.a, *a, false);
        assert!(
            direct(&local),
            "a local retry to {a} was steered: {local:?}"
        );
    }

    let t0 = Instant::now();
    shim_cg.kill();
    let gone_direct = wait_until(Duration::from_secs(2), || {
        services.iter().all(|a| direct(&get(&pair.b, *a, false)))
    });
    let gone_direct = gone_direct
        .map(|_| t0.elapsed())
        .expect("inbound connections did not go direct within 2 s");
    eprintln!(
        "FIGURE inbound_cgroup_kill_to_direct_ms={:.1} families={}",
        gone_direct.as_secs_f64() * 1000.0,
        services.len()
    );
    let gone = wait_until(Duration::from_secs(2), || {
        steer_programs() == 0 && shim_cg.empty()
    });
    assert!(
        gone.is_some(),
        "sk_lookup still loaded after the shim's cgroup died"
    );
    drop(ctl);
    let _ = std::fs::remove_file(&ctl_path);
}
