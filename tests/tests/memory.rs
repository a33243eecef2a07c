//! Memory bounds under floods: the agent as users run it stays within its budget and counts what
//! its bounds let go; the kernel's per-thread argument maps count the inserts they refuse.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use integration_tests::{
    actuate::agent_bin,
    fixture::{Proc, can_run, free_port, load_with, python, wait_listening},
};
use retry_agent::capture::CaptureConfig;
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

/// What a release build's executable keeps resident (text and read-only data), which the
/// budget's fixed part counts.
const RELEASE_EXE_BYTES: u64 = 9 << 20;

/// Resident pages of the mappings of a process's own executable, in bytes.
fn exe_rss(pid: u32) -> u64 {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    let exe = exe.to_string_lossy().into_owned();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut ours = false;
    let mut kib = 0u64;
    for line in smaps.lines() {
        if let Some(rss) = line.strip_prefix("Rss:") {
            if ours {
                kib += rss
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap_or(0);
            }
        } else if line
            .split_whitespace()
            .next()
            .is_some_and(|f| f.contains('-') && !f.ends_with(':'))
        {
            ours = line.ends_with(&exe);
        }
    }
    kib << 10
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// 20,000 short connections, 4,000 of them open at once on each side (the default budget's l7
/// table holds 3,072): the agent's peak RSS stays under its 64 MiB budget, with the recorder on,
/// and the connections its tables could not hold are counted as evictions.
#[test]
fn a_flood_of_short_connections_stays_within_the_budget() {
    if !can_run() {
        return;
    }
    let bin = agent_bin();
    let api = free_port();
    let dir = std::env::temp_dir().join(format!("ra-memory-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let agent = Proc::spawn(
        Command::new(&bin)
            .args(["run", "--api-addr", &format!("127.0.0.1:{api}")])
            .args(["--actuate", "decision-log", "--capture-go", "false"])
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
            .arg("--recorder-auto-dump")
            .arg("false")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    wait_listening(&format!("127.0.0.1:{api}"), None);

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
    let out = Command::new("curl")
        .args(["-s", &format!("http://127.0.0.1:{api}/metrics")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let peak = peak_rss(agent.pid());
    // The budget counts a release build's own pages (~9 MiB); a debug build's are larger.
    let exe = exe_rss(agent.pid());
    let allowed = (64 << 20) + exe.saturating_sub(RELEASE_EXE_BYTES);
    eprintln!(
        "flood of 20000 connections in {took:?}: agent peak RSS {} KiB (its executable's pages {} KiB)",
        peak >> 10,
        exe >> 10
    );
    assert!(
        peak < allowed,
        "peak RSS {} KiB over the 64 MiB budget ({} KiB allowed)",
        peak >> 10,
        allowed >> 10
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
    let io = arg_map::IO as usize;
    assert_eq!(
        capture.stats().arg_insert_failures[io],
        0,
        "no data syscall was refused"
    );
    blocked.kill();
}
