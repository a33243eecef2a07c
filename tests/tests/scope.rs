//! An agent scoped to part of the machine (`--capture-netns`, `--capture-cgroup`): real
//! programs, real clients and servers on both sides of the scope's border, in namespaces and
//! cgroups the tests create and remove. Only the scoped side's sockets are tracked, on connect
//! and on accept alike. `cargo test -p integration-tests --test scope` as root.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::fixture::{
    NetnsPair, Proc, can_run, collect, conn_events, dump, fixture, free_port, involving, io_events,
    load_with, wait_listening,
};
use retry_agent::capture::{Capture, CaptureConfig, Event, Role};

fn tracked(evs: &[Event], pid: u32, role: Role) -> bool {
    conn_events(evs)
        .iter()
        .any(|c| c.pid == pid && c.role == role)
        && io_events(evs).iter().any(|d| d.pid == pid)
}

fn untouched(evs: &[Event], pid: u32) -> bool {
    conn_events(evs).iter().all(|c| c.pid != pid) && io_events(evs).iter().all(|d| d.pid != pid)
}

fn curl(cmd: &mut Command, url: &str) -> Proc {
    Proc::spawn(cmd.args(["-s", "-o", "/dev/null", "--max-time", "5", url]))
}

/// After both clients finished: the scoped client and server (`inside`: client, server) are
/// tracked on their side of the connection, the other pair is never seen.
async fn only_inside_tracked(cap: &mut Capture, inside: [u32; 2], outside: [u32; 2]) {
    let pids = [inside[0], inside[1], outside[0], outside[1]];
    let evs = collect(cap, Duration::from_secs(3), involving(&pids), |_| false).await;
    assert!(
        tracked(&evs, inside[0], Role::Client),
        "the scoped client is tracked:\n{}",
        dump(&evs)
    );
    assert!(
        tracked(&evs, inside[1], Role::Server),
        "the scoped server is tracked:\n{}",
        dump(&evs)
    );
    for pid in outside {
        assert!(
            untouched(&evs, pid),
            "pid {pid} is outside the scope:\n{}",
            dump(&evs)
        );
    }
}

/// Scoped to namespace `a`: `a`'s client calling into `b` is tracked at connect and `b`'s
/// server is not; `b`'s client calling into `a` is not, and `a`'s server is, at accept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn netns_scope_tracks_only_the_scoped_namespace() {
    if !can_run() {
        return;
    }
    let Some(ns) = NetnsPair::create("s", 74) else {
        return;
    };
    let cfg = CaptureConfig {
        netns: vec![format!("/run/netns/{}", ns.a)],
        go: retry_agent::capture::GoMode::Off,
        ..CaptureConfig::default()
    };
    let Some(mut cap) = load_with(&cfg) else {
        return;
    };
    let port = 8080u16.to_string();
    let in_server = Proc::spawn(
        NetnsPair::python(&ns.a, "http_tid_server.py", &[&port, &ns.ip_a]).stdout(Stdio::null()),
    );
    let out_server = Proc::spawn(
        NetnsPair::python(&ns.b, "http_tid_server.py", &[&port, &ns.ip_b]).stdout(Stdio::null()),
    );
    wait_listening(&format!("{}:{port}", ns.ip_a), Some(&ns.b));
    wait_listening(&format!("{}:{port}", ns.ip_b), Some(&ns.a));
    let mut in_client = curl(
        &mut NetnsPair::exec(&ns.a, "curl"),
        &format!("http://{}:{port}/from-a", ns.ip_b),
    );
    let mut out_client = curl(
        &mut NetnsPair::exec(&ns.b, "curl"),
        &format!("http://{}:{port}/from-b", ns.ip_a),
    );
    assert!(in_client.wait(Duration::from_secs(10)).success());
    assert!(out_client.wait(Duration::from_secs(10)).success());
    only_inside_tracked(
        &mut cap,
        [in_client.pid(), in_server.pid()],
        [out_client.pid(), out_server.pid()],
    )
    .await;
}

/// A cgroup v2 directory made for the test, removed (after its processes) on drop.
struct TestCgroup(PathBuf);

impl TestCgroup {
    fn procs_file(&self) -> PathBuf {
        self.0.join("cgroup.procs")
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // Children first; a cgroup with live processes cannot go (theirs are killed by Proc).
        for sub in ["in", "out", ""] {
            let _ = std::fs::remove_dir(self.0.join(sub));
        }
    }
}

/// Where the unified (v2) hierarchy is mounted, from /proc/self/mounts.
fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_, dir, ty) = (f.next()?, f.next()?, f.next()?);
        (ty == "cgroup2").then(|| PathBuf::from(dir))
    })
}

/// `program args…` run inside cgroup `procs` (the shell joins it, then execs the program).
fn in_cgroup(procs: &Path, program: &str, args: &[&str]) -> Command {
    let mut c = Command::new("sh");
    c.args([
        "-c",
        "echo $$ > \"$0\" && exec \"$@\"",
        &procs.display().to_string(),
        program,
    ])
    .args(args);
    c
}

/// Scoped to cgroup `…/in` (two levels below the root): its server and client are tracked,
/// the sibling `…/out`'s are not, though all four talk to each other over loopback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cgroup_scope_tracks_only_the_scoped_subtree() {
    if !can_run() {
        return;
    }
    let Some(mount) = cgroup2_mount() else {
        eprintln!("skip: no cgroup v2 hierarchy mounted");
        return;
    };
    let top = TestCgroup(mount.join(format!("ra-scope-{}", std::process::id())));
    let made = std::fs::create_dir(&top.0)
        .and_then(|_| std::fs::create_dir(top.0.join("in")))
        .and_then(|_| std::fs::create_dir(top.0.join("out")));
    if let Err(e) = made {
        eprintln!("skip: cannot make cgroups under {}: {e}", mount.display());
        return;
    }
    let inside = TestCgroup(top.0.join("in"));
    let outside = TestCgroup(top.0.join("out"));
    let cfg = CaptureConfig {
        cgroups: vec![inside.0.clone()],
        go: retry_agent::capture::GoMode::Off,
        ..CaptureConfig::default()
    };
    let Some(mut cap) = load_with(&cfg) else {
        return;
    };
    let server = |cg: &TestCgroup| {
        let port = free_port();
        let p = Proc::spawn(
            in_cgroup(
                &cg.procs_file(),
                "python3",
                &[
                    "-u",
                    &fixture("http_tid_server.py").display().to_string(),
                    &port.to_string(),
                ],
            )
            .stdout(Stdio::null()),
        );
        wait_listening(&format!("127.0.0.1:{port}"), None);
        (p, port)
    };
    let (in_server, in_port) = server(&inside);
    let (out_server, out_port) = server(&outside);
    let mut in_client = curl(
        &mut in_cgroup(&inside.procs_file(), "curl", &[]),
        &format!("http://127.0.0.1:{out_port}/from-in"),
    );
    let mut out_client = curl(
        &mut in_cgroup(&outside.procs_file(), "curl", &[]),
        &format!("http://127.0.0.1:{in_port}/from-out"),
    );
    assert!(in_client.wait(Duration::from_secs(10)).success());
    assert!(out_client.wait(Duration::from_secs(10)).success());
    only_inside_tracked(
        &mut cap,
        [in_client.pid(), in_server.pid()],
        [out_client.pid(), out_server.pid()],
    )
    .await;
    drop((in_server, out_server, in_client, out_client));
}
