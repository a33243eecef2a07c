//! The agent binary as users run it: what it observes and what it leaves out.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use std::{
    collections::HashSet,
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use integration_tests::{
    actuate::agent_bin,
    fixture::{Proc, can_run, free_port, python, wait_listening},
};

/// The process whose I/O a `trace` line shows: a data record's, or a kernel summary's (a quiet
/// exchange, sent as one record).
fn io_pid(v: &serde_json::Value) -> Option<u32> {
    let pid = match v["type"].as_str()? {
        "data" => &v["pid"],
        "summary" => &v["request"]["pid"],
        _ => return None,
    };
    pid.as_u64().and_then(|p| u32::try_from(p).ok())
}

/// The agent's own shims are proxy hops, not services: another process running the agent's
/// binary is not observed, while its peers (and everyone else) still are, including a workload
/// that took the agent's name (it is recognised by its executable, not its name).
#[test]
fn other_agent_processes_are_not_observed_but_their_peers_are() {
    if !can_run() {
        return;
    }
    let bin = agent_bin();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let _server = Proc::spawn(
        python("static_http_server.py", &[&port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    wait_listening(&addr, None);

    let other_port = free_port();
    let namesake_port = free_port();
    let mut trace = Command::new(&bin)
        .args([
            "trace",
            "--port",
            &port.to_string(),
            "--port",
            &other_port.to_string(),
            "--port",
            &namesake_port.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting retry-agent trace");
    // Attached once it says so on stderr.
    let stderr = BufReader::new(trace.stderr.take().unwrap());
    let mut attached = false;
    for line in stderr.lines().map_while(Result::ok) {
        // stderr is a pipe here, as in a container: logs must not carry terminal colour codes.
        assert!(
            !line.contains('\u{1b}'),
            "escape codes in a piped log line: {line:?}"
        );
        if line.contains("capture attached") {
            attached = true;
            break;
        }
    }
    assert!(attached, "retry-agent trace never attached");

    // Another long-lived retry-agent process (as a shim is) talks TCP: a second agent serving
    // its API, which curl asks.
    let dir = std::env::temp_dir().join(format!("ra-agent-test-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let other = Proc::spawn(
        Command::new(&bin)
            .args([
                "run",
                "--api-addr",
                &format!("127.0.0.1:{other_port}"),
                "--actuate",
                "decision-log",
                "--recorder",
                "false",
            ])
            .arg("--actuate-decision-log")
            .arg(dir.join("decisions.jsonl"))
            .arg("--actuate-control-socket")
            .arg(dir.join("control.sock"))
            .arg("--api-socket")
            .arg(dir.join("api.sock"))
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let other_pid = other.pid();
    wait_listening(&format!("127.0.0.1:{other_port}"), None);
    let healthz = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            &format!("http://127.0.0.1:{other_port}/healthz"),
        ])
        .status();
    assert!(
        healthz.is_ok_and(|s| s.success()),
        "the second agent answers"
    );
    // A short-lived CLI call of the agent's binary (exits before userspace could read its
    // name): the kernel leaves its sockets untracked by the file it runs. (Dumps are
    // not served over TCP, so the agent answers 404: the TCP exchange is what matters here.)
    let cli = Command::new(&bin)
        .args([
            "dump",
            "--api",
            &format!("http://127.0.0.1:{other_port}"),
            "--timeout-secs",
            "2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("retry-agent dump");
    let cli_pid = cli.id();
    let _ = cli.wait_with_output();
    // A workload named like the agent: Python run from a copy named `retry-agent`, asked by curl.
    let namesake_bin = dir.join("retry-agent");
    std::fs::copy(
        std::fs::canonicalize("/usr/bin/python3").unwrap(),
        &namesake_bin,
    )
    .unwrap();
    let namesake = Proc::spawn(
        Command::new(&namesake_bin)
            .arg("-u")
            .arg(integration_tests::fixture::fixture("static_http_server.py"))
            .arg(namesake_port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let namesake_pid = namesake.pid();
    wait_listening(&format!("127.0.0.1:{namesake_port}"), None);
    let asked = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            &format!("http://127.0.0.1:{namesake_port}/"),
        ])
        .status();
    assert!(asked.is_ok_and(|s| s.success()), "the namesake answers");
    // ...and curl talks to the Python server too.
    let curl = Command::new("curl")
        .args(["-s", "-o", "/dev/null", &format!("http://{addr}/")])
        .spawn()
        .expect("curl");
    let curl_pid = curl.id();
    let _ = curl.wait_with_output();

    let stdout = BufReader::new(trace.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut pids = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(&line).expect("trace prints JSON lines");
        pids.extend(io_pid(&v));
        if pids.contains(&curl_pid) && pids.contains(&namesake_pid) && pids.len() >= 3 {
            // curl and the server's side of its connection are in; give late records a moment.
            std::thread::sleep(Duration::from_millis(300));
            while let Ok(line) = rx.try_recv() {
                let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                pids.extend(io_pid(&v));
            }
            break;
        }
    }
    let _ = trace.kill();
    let _ = trace.wait();
    drop(other);
    drop(namesake);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        pids.contains(&curl_pid),
        "curl's I/O was not observed: {pids:?}"
    );
    assert!(
        pids.contains(&namesake_pid),
        "a workload named retry-agent hid from capture: {pids:?}"
    );
    assert!(
        !pids.contains(&other_pid),
        "the other retry-agent process was observed: {pids:?}"
    );
    assert!(
        !pids.contains(&cli_pid),
        "a short-lived retry-agent CLI call was observed: {pids:?}"
    );
}
