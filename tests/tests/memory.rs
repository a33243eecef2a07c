//! Memory bounds under floods: the agent as users run it stays within its budget and counts what
//! its bounds let go; the kernel's per-thread argument maps count the inserts they refuse.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use integration_tests::{
    actuate::{release_agent_bin, skip_reason, wait_until},
    fixture::{
        NetnsPair, Proc, can_run, collect, free_port, haproxy_answering, load_with, python,
        wait_listening,
    },
};
use retry_agent::capture::{CaptureConfig, Event, Role};
use retry_common::arg_map;

/// Peak resident memory of a process (VmHWM), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kib << 10
}

/// The agent's `/metrics` page (empty if it did not answer).
fn metrics_text(api: u16) -> String {
    let out = Command::new("curl")
        .args(["-s", &format!("http://127.0.0.1:{api}/metrics")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The release agent, as users run it (the budget is a promise about that build), with its
/// files in a new directory named `name`, the recorder's storm dumps off and `extra` flags;
/// returns it once its API answers, with the API's port and the directory.
fn release_agent(name: &str, extra: &[&str]) -> (Proc, u16, std::path::PathBuf) {
    let api = free_port();
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let agent = Proc::spawn(
        Command::new(release_agent_bin())
            .args(["run", "--api-addr", &format!("127.0.0.1:{api}")])
            .args(["--actuate", "decision-log", "--capture-go", "false"])
            .args(["--recorder-auto-dump", "false"])
            .args(extra)
            .arg("--actuate-decision-log")
            .arg(dir.join("decisions.jsonl"))
            .arg("--actuate-control-socket")
            .arg(dir.join("control.sock"))
            .arg("--api-socket")
            .arg(dir.join("api.sock"))
            .arg("--recorder-dump-dir")
            .arg(&dir)
            .arg("--recorder-digest-key-file")
            .arg(dir.join("key"))
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    wait_listening(&format!("127.0.0.1:{api}"), None);
    (agent, api, dir)
}

/// 20,000 short connections, 4,000 of them open at once on each side (the default budget's l7
/// table holds 2,304): the agent's peak RSS stays under its 64 MiB budget, with the recorder on,
/// and the connections its tables could not hold are counted as evictions. The release agent, as
/// users run it: the budget is a promise about that build.
#[test]
fn a_flood_of_short_connections_stays_within_the_budget() {
    if !can_run() {
        return;
    }
    let (agent, api, dir) = release_agent("ra-memory-test", &[]);

    let port = free_port();
    let started = Instant::now();
    let mut flood = Proc::spawn(
        python("conn_flood.py", &[&port.to_string(), "20000", "4000"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );
    assert_eq!(flood.read_line().trim(), "listening");
    let done = flood.read_line();
    assert_eq!(done.trim(), "done 20000", "the flood did not finish");
    let took = started.elapsed();
    // Published once a second.
    std::thread::sleep(Duration::from_millis(2500));
    let text = metrics_text(api);
    let peak = peak_rss(agent.pid());
    eprintln!(
        "flood of 20000 connections in {took:?}: agent peak RSS {} KiB",
        peak >> 10
    );
    assert!(
        peak < 64 << 20,
        "peak RSS {} KiB over the 64 MiB budget",
        peak >> 10
    );
    let l7 = metric(&text, "retry_agent_l7_evictions_total").expect("l7 evictions exported");
    assert!(l7 > 0.0, "no l7 eviction counted:\n{text}");
    assert!(
        metric(&text, "retry_agent_capture_arg_insert_failures_total").is_some(),
        "argument-map failures are not exported:\n{text}"
    );
    assert!(metric(&text, "retry_agent_recorder_evictions_total").is_some());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A dump asked for under load: the blocks the ring lets go while the dump is written count
/// against the recorder's bound, so the agent grows by the writer's buffers, not by the
/// recorder's size again (before: a 32 MiB recorder's agent went from 59 to 90 MB on one dump
/// under wrk). wrk against HAProxy answering itself keeps the 24 MiB ring full and turning over.
#[test]
fn a_dump_under_load_stays_within_the_recorders_bound() {
    if !can_run() {
        return;
    }
    // Plain blocks, so the ring fills within the load's seconds (packed, the same bound holds
    // several times the history: `recorder::ring` tests that packing keeps the bound).
    let (agent, api, dir) = release_agent(
        "ra-memory-dump",
        &["--recorder-max-mib", "24", "--recorder-pack", "false"],
    );
    let port = free_port();
    let _haproxy = haproxy_answering(&dir.join("haproxy.cfg"), port, "", &[]);
    let _wrk = Proc::from_child(
        Command::new("wrk")
            .args(["-t1", "-c8", "-d30s", &format!("http://127.0.0.1:{port}/")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("wrk (cargo xtask setup installs it)"),
    );
    // The ring full: it has let records go for its size.
    assert!(
        wait_until(Duration::from_secs(20), || {
            metric(&metrics_text(api), "retry_agent_recorder_evictions_total")
                .is_some_and(|n| n > 1e5)
        })
        .is_some(),
        "the ring never filled:\n{}",
        metrics_text(api)
    );
    std::thread::sleep(Duration::from_secs(1));
    let before = peak_rss(agent.pid());
    let out = Command::new(release_agent_bin())
        .args(["dump", "--api"])
        .arg(format!("unix:{}", dir.join("api.sock").display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "dump: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The ring turns over once more after the dump.
    std::thread::sleep(Duration::from_secs(2));
    let after = peak_rss(agent.pid());
    let text = metrics_text(api);
    eprintln!(
        "dump of a full 24 MiB recorder under load: peak RSS {} → {} KiB",
        before >> 10,
        after >> 10
    );
    assert!(
        after < before + (12 << 20),
        "a dump took the agent from {} to {} KiB: the recorder held its ring twice",
        before >> 10,
        after >> 10
    );
    assert!(
        metric(&text, "retry_agent_recorder_held_bytes").is_some(),
        "{text}"
    );
    let dumps = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "radump"))
        })
        .count();
    assert_eq!(dumps, 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A channel to the pipeline far smaller than a burst loses nothing while the kernel's ring has
/// room: the reader leaves what the channel cannot take in the ring and comes back for it,
/// instead of decoding it only to drop it. 1,000 connections run while nothing consumes the
/// events; then every request is delivered (the client's write and the server's read), the
/// client's in the order it wrote them, and nothing is counted as dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_waits_in_the_ring_while_the_pipeline_has_no_room() {
    if !can_run() {
        return;
    }
    let Some(mut capture) = load_with(&CaptureConfig {
        channel_capacity: 16,
        ring_bytes: 16 << 20,
        ..CaptureConfig::default()
    }) else {
        return;
    };
    const N: usize = 1000;
    let port = free_port();
    let mut flood = Proc::spawn(
        python("conn_flood.py", &[&port.to_string(), &N.to_string(), "100"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );
    assert_eq!(flood.read_line().trim(), "listening");
    assert_eq!(flood.read_line().trim(), format!("done {N}"));
    // Only now does anything read the events.
    // A request is a data record, or a kernel summary (a quiet exchange) whose line it is.
    let request = |e: &Event| match e {
        Event::Data(d) => Some(d.clone()),
        Event::Summary(s) => Some(s.request.clone()),
        _ => None,
    };
    let requests: Vec<_> = collect(
        &mut capture,
        Duration::from_secs(60),
        |e| request(e).is_some_and(|d| d.payload.starts_with(b"GET /item/")),
        |seen| seen.len() >= 2 * N,
    )
    .await
    .iter()
    .filter_map(request)
    .collect();
    let stats = capture.stats();
    assert_eq!(
        (stats.kernel_drops, stats.channel_drops),
        (0, 0),
        "nothing is dropped while the ring has room"
    );
    assert_eq!(requests.len(), 2 * N, "every request, on both sides");
    // The client wrote item i before item i+1 on its one thread: arrival keeps that order.
    let client_items: Vec<usize> = requests
        .iter()
        .filter(|d| d.role == Role::Client)
        .filter_map(|d| {
            std::str::from_utf8(&d.payload)
                .ok()?
                .strip_prefix("GET /item/")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(client_items, (0..N).collect::<Vec<_>>());
}

/// With room for two threads in accept() at once, eight threads blocked there leave six
/// unrecorded, and the kernel counts each refused insert.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_argument_maps_count_their_failed_inserts() {
    if !can_run() {
        return;
    }
    let Some(capture) = load_with(&CaptureConfig {
        arg_map_entries: 2,
        ..CaptureConfig::default()
    }) else {
        return;
    };
    let mut blocked = Proc::spawn(
        python("blocked_accepts.py", &["8"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );
    assert_eq!(blocked.read_line().trim(), "blocked");
    let accept = arg_map::ACCEPT as usize;
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut failures = 0;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        failures = capture.stats().arg_insert_failures[accept];
        if failures >= 6 {
            break;
        }
    }
    assert!(failures >= 6, "{failures} failed accept inserts counted");
    blocked.kill();
}

/// A network namespace of its own, removed on drop.
struct Netns(String);

impl Netns {
    fn create(name: &str) -> Option<Netns> {
        let ip = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let _ = ip(&["netns", "del", name]);
        let ns = Netns(name.to_string());
        let steps: [&[&str]; 3] = [
            &["netns", "add", name],
            &["-n", name, "link", "set", "lo", "up"],
            // AnyIP: the whole block is local, so a client can bind any of its addresses.
            &[
                "-n",
                name,
                "-6",
                "route",
                "add",
                "local",
                FLOOD_BLOCK,
                "dev",
                "lo",
                "table",
                "local",
            ],
        ];
        for s in steps {
            if !ip(s) {
                eprintln!("skip: `ip {}` failed", s.join(" "));
                return None;
            }
        }
        Some(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Its iptables rules and sockets go with it.
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// The sources' block (a ULA prefix, local to the test's namespace only).
const FLOOD_BLOCK: &str = "fd00:13:f1::/64";
const FLOOD_SOURCES: usize = 4000;
/// Long targets make each remembered failure cost ~4.4 KiB, so the flood overflows the cache.
const FLOOD_TARGET_BYTES: usize = 4096;
const SHIM_BUDGET_MIB: u64 = 32;

/// Field `name=value` of a `key=value …` log line (nested as `outer=name=value` too).
fn field(line: &str, name: &str) -> Option<u64> {
    line.split(|c: char| c.is_whitespace() || c == '"')
        .find_map(|w| {
            let (k, v) = w.rsplit_once('=')?;
            (k.rsplit('=').next() == Some(name)).then_some(v)
        })
        .and_then(|v| v.parse().ok())
}

/// The shim (iptables steering, in a namespace the test creates) flooded by 4,000 clients with
/// distinct IPv6 source addresses, each failing once with its own retry key: the shim's peak RSS
/// stays under its 32 MiB budget, the failure cache stays within its bytes (a quarter of the
/// budget, half of it for failures) and what it refused is counted and reported.
#[test]
fn a_flood_of_new_ipv6_sources_at_the_shim_stays_within_its_budget() {
    if let Some(r) = skip_reason(&[]) {
        eprintln!("skip: {r}");
        return;
    }
    let name = format!("raflood{}", std::process::id() % 100_000);
    let Some(ns) = Netns::create(&name) else {
        return;
    };
    // ip6tables' nat table, asked inside the namespace the shim will run in.
    let v6nat = NetnsPair::exec(&ns.0, "ip6tables")
        .args(["-w", "5", "-t", "nat", "-S"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !v6nat {
        eprintln!("skip: ip6tables nat not usable");
        return;
    }
    let dir = std::env::temp_dir().join(format!("ra-shim-flood-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let log_path = dir.join("shim.log");
    let (svc_port, shim_port) = (18080, 15001);
    let bin = release_agent_bin();
    let shim = Proc::spawn(
        NetnsPair::exec(&ns.0, &bin.to_string_lossy())
            .args(["--log", "info", "shim"])
            .args(["--shim-port", &shim_port.to_string()])
            .args(["--shim-dport", &svc_port.to_string()])
            .args(["--shim-chain", "RAFLOOD", "--shim-ipv6", "true"])
            .args(["--shim-watchdog", "false"])
            .args(["--memory-budget-mib", &SHIM_BUDGET_MIB.to_string()])
            .arg("--shim-run-dir")
            .arg(&dir)
            // No agent: the shim remembers failures on its own.
            .arg("--shim-control-socket")
            .arg(dir.join("control.sock"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap()),
    );
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let up = wait_until(Duration::from_secs(30), || {
        log().contains("steering installed")
    });
    assert!(up.is_some(), "shim did not come up:\n{}", log());
    assert!(
        !log().contains("IPv6 steering not installed"),
        "no IPv6 steering:\n{}",
        log()
    );

    let prefix = FLOOD_BLOCK.trim_end_matches("/64");
    let started = Instant::now();
    let mut flood = Proc::spawn(
        NetnsPair::python(
            &ns.0,
            "shim_v6_flood.py",
            &[
                &svc_port.to_string(),
                prefix,
                &FLOOD_SOURCES.to_string(),
                "32",
                &FLOOD_TARGET_BYTES.to_string(),
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null()),
    );
    let line = flood.read_line();
    let took = started.elapsed();
    let out: serde_json::Value =
        serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("flood said {line:?}: {e}"));
    assert_eq!(
        out["status"]["503"].as_u64(),
        Some(FLOOD_SOURCES as u64),
        "every client got the service's answer through the shim: {out}"
    );
    let peak = peak_rss(shim.pid());
    // Refusals are reported while they happen (the shim checks every 10 s).
    let live = wait_until(Duration::from_secs(15), || {
        log().contains("shim cache full")
    });
    assert!(
        live.is_some(),
        "no live report of the full cache:\n{}",
        log()
    );
    // SIGTERM: the shim reports its counters as it stops.
    let _ = Command::new("kill")
        .args(["-TERM", &shim.pid().to_string()])
        .status();
    let stopped = wait_until(Duration::from_secs(10), || log().contains("shim stopped"));
    assert!(stopped.is_some(), "the shim did not stop:\n{}", log());
    drop(shim);
    let text = log();
    // The shim's stderr is a file: its lines are plain text (no colour codes).
    let last = text
        .lines()
        .find(|l| l.contains("shim stopped"))
        .unwrap_or_default();
    eprintln!(
        "FIGURE shim_flood sources={FLOOD_SOURCES} took_ms={} peak_rss_kib={}\n{last}",
        took.as_millis(),
        peak >> 10
    );
    // Steered: the shim carried every client's request.
    let requests = field(last, "requests").expect("requests counted");
    assert!(requests >= FLOOD_SOURCES as u64, "{last}");
    // New sources were counted as clients (the table holds 32,768 at this budget), all but the
    // first few that passed before any failure was remembered (nothing to track then).
    let clients = field(last, "clients").expect("clients reported");
    assert!(clients >= FLOOD_SOURCES as u64 * 9 / 10, "{last}");
    assert_eq!(field(last, "clients_refused"), Some(0), "{last}");
    // The failure cache kept to its bytes and counted what it could not hold.
    let cache_bytes = (SHIM_BUDGET_MIB << 20) / 4;
    let failure_bytes = field(last, "failure_bytes").expect("failure bytes reported");
    assert!(failure_bytes <= cache_bytes / 2, "{last}");
    let refused = field(last, "failures_refused").expect("refused failures reported");
    let kept = field(last, "failures").expect("failures reported");
    assert!(refused > 0, "the flood never filled the cache: {last}");
    assert_eq!(kept + refused, FLOOD_SOURCES as u64, "{last}");
    assert_eq!(field(last, "cache_evictions"), Some(refused), "{last}");
    assert!(
        peak < SHIM_BUDGET_MIB << 20,
        "shim peak RSS {} KiB over its {SHIM_BUDGET_MIB} MiB budget",
        peak >> 10
    );
    drop(ns);
    let _ = std::fs::remove_dir_all(&dir);
}
