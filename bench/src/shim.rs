//! `cargo xtask bench shim`: the proxies side by side. The same closed-loop load, on the same box
//! and the same backend, through the retry-agent shim, HAProxy and Envoy, over HTTP/1.1
//! keep-alive (wrk) and h2c (h2load, the transport gRPC uses); needs root (iptables), haproxy, wrk,
//! h2load (nghttp2-client) and Envoy (`cargo xtask setup` installs all of them).
//!
//! Paths, per protocol:
//! - direct:  client → backend
//! - haproxy: client → HAProxy (`mode http`, plain forwarding, `http-reuse always`) → backend
//! - haproxy, no reuse: the same with `http-reuse never`, each client connection's requests on
//!   upstream connections of its own — the shim's model, printed to read the h2c gap by (where
//!   `always` multiplexes many clients' streams onto few upstream connections); not a target
//! - envoy:   client → Envoy (http_connection_manager + router, no retries) → backend
//! - shim:    client → (iptables REDIRECT) → retry-agent shim (its defaults: h2c callers'
//!   streams multiplexed onto pooled upstream connections, as `http-reuse always` does) → backend
//! - shim, own upstream (h2c only): a second shim with `--shim-h2-upstream own`, each client
//!   connection's frames relayed over an upstream connection of its own (read it against
//!   `haproxy, no reuse`)
//!
//! The backend is HAProxy answering `http-request return` (fast and steady). Each proxy keeps its
//! default thread count for 2 cores (HAProxy: one per CPU; Envoy: `--concurrency 2`; the shim:
//! tokio's default). Printed: requests/s, p50/p99/p99.9 latency added over direct, and the
//! proxy's CPU time per request (utime+stime of the proxy process over the run, so the client's
//! and the backend's CPU are not in it). Figures, not a test. `RA_BENCH_PROFILE=debug` benches a
//! debug build (default: release), `RA_BENCH_SECS` the duration per path, `--rounds` (or
//! `RA_BENCH_ROUNDS`) how many times every path runs (medians printed, and each ratio's median
//! and range over the rounds' own ratios: on a shared machine one run's figures can be a
//! neighbour's).
use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use crate::{
    capture::Killed,
    rounds::{median, ratio_text},
};
use anyhow::{Context, Result, bail};

/// Removes the bench's steering chain however the bench ends.
struct Cleanup {
    bin: PathBuf,
    chain: String,
}
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Command::new(&self.bin)
            .args(["shim", "--cleanup", "--chain", &self.chain])
            .stderr(Stdio::null())
            .status();
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn have(cmd: &str, arg: &str) -> bool {
    Command::new(cmd)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

fn wait_port(port: u16) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        sleep(Duration::from_millis(20));
    }
    false
}

#[derive(Debug, Clone, Copy)]
struct Figures {
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    /// Proxy CPU time per request (µs); NaN for the direct path.
    cpu_us: f64,
}

/// "1.23ms" / "456.78us" / "1.2s" → microseconds.
fn parse_dur(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, mul) = if let Some(v) = s.strip_suffix("us") {
        (v, 1.0)
    } else if let Some(v) = s.strip_suffix("ms") {
        (v, 1e3)
    } else {
        let v = s.strip_suffix('s')?;
        (v, 1e6)
    };
    num.parse::<f64>().ok().map(|n| n * mul)
}

/// wrk's own summary, plus the `RA_P999 <us>` line [`WRK_SCRIPT`] prints.
fn parse_wrk(out: &str) -> Option<Figures> {
    let mut f = Figures {
        rps: f64::NAN,
        p50_us: f64::NAN,
        p99_us: f64::NAN,
        p999_us: f64::NAN,
        cpu_us: f64::NAN,
    };
    for line in out.lines() {
        let mut w = line.split_whitespace();
        match (w.next(), w.next()) {
            (Some("Requests/sec:"), Some(v)) => f.rps = v.parse().ok()?,
            (Some("50%"), Some(v)) => f.p50_us = parse_dur(v)?,
            (Some("99%"), Some(v)) => f.p99_us = parse_dur(v)?,
            (Some("RA_P999"), Some(v)) => f.p999_us = v.parse().ok()?,
            _ => {}
        }
    }
    (!f.rps.is_nan() && !f.p50_us.is_nan() && !f.p99_us.is_nan()).then_some(f)
}

/// wrk keeps a full latency histogram; its Lua `done` hook reads the 99.9th percentile (µs).
const WRK_SCRIPT: &str = "done = function(summary, latency, requests)\n  io.write(string.format(\"RA_P999 %d\\n\", latency:percentile(99.9)))\nend\n";

/// The `q`-quantile of sorted samples (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

/// h2load's `--log-file`: `start_us \t status \t duration_us` per request → (p50, p99, p99.9, n 2xx).
fn parse_h2load_log(text: &str) -> (f64, f64, f64, usize) {
    let mut d: Vec<f64> = text
        .lines()
        .filter_map(|l| {
            let mut c = l.split('\t');
            let (_, status, dur) = (c.next()?, c.next()?, c.next()?);
            status
                .trim()
                .starts_with('2')
                .then(|| dur.trim().parse::<f64>().ok())
                .flatten()
        })
        .collect();
    d.sort_by(f64::total_cmp);
    (
        quantile(&d, 0.50),
        quantile(&d, 0.99),
        quantile(&d, 0.999),
        d.len(),
    )
}

/// CPU time (utime + stime, all threads) of a process, in µs.
fn cpu_us(pid: Option<u32>) -> f64 {
    let Some(pid) = pid else { return f64::NAN };
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th overall.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        f.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) * 1e6 / hz
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Proto {
    Http1,
    H2c,
    /// h2c, each request to one of 4,096 paths with a query, as real traffic: h2load (nghttp2)
    /// sends `:path` as a Huffman-coded literal the table never keeps, so every request's is
    /// decoded (one path, as `H2c`, is a static-table index after the first request).
    H2cPaths,
}

struct Load<'a> {
    dir: &'a Path,
    conns: u32,
}

impl Load<'_> {
    /// One run against `port`; `proxy` is the process whose CPU is charged to it.
    fn run(&self, proto: Proto, port: u16, secs: u64, proxy: Option<u32>) -> Result<Figures> {
        let cpu0 = cpu_us(proxy);
        let mut f = match proto {
            Proto::Http1 => self.wrk(port, secs)?,
            Proto::H2c => self.h2load(port, secs, false)?,
            Proto::H2cPaths => self.h2load(port, secs, true)?,
        };
        let requests = f.rps * secs as f64;
        f.cpu_us = (cpu_us(proxy) - cpu0) / requests;
        Ok(f)
    }

    fn wrk(&self, port: u16, secs: u64) -> Result<Figures> {
        let script = self.dir.join("p999.lua");
        std::fs::write(&script, WRK_SCRIPT)?;
        let out = Command::new("wrk")
            .args([
                "-t2",
                &format!("-c{}", self.conns),
                &format!("-d{secs}s"),
                "--latency",
                "-s",
            ])
            .arg(&script)
            .arg(format!("http://127.0.0.1:{port}/"))
            .output()
            .context("running wrk")?;
        let text = String::from_utf8_lossy(&out.stdout);
        if text.contains("Non-2xx") || text.contains("Socket errors") {
            eprintln!("warning: wrk saw errors on port {port}:\n{text}");
        }
        parse_wrk(&text).with_context(|| format!("unparseable wrk output:\n{text}"))
    }

    /// h2c with prior knowledge, one stream in flight per connection (as wrk's keep-alive).
    fn h2load(&self, port: u16, secs: u64, paths: bool) -> Result<Figures> {
        let log = self.dir.join(format!("h2load-{port}.log"));
        let _ = std::fs::remove_file(&log);
        let target = if paths {
            let list = self.dir.join(format!("uris-{port}.txt"));
            crate::capture::h2load_paths(&list, port)?;
            vec!["-i".to_string(), list.display().to_string()]
        } else {
            vec![format!("http://127.0.0.1:{port}/")]
        };
        let out = Command::new("h2load")
            .args([
                "-t2",
                &format!("-c{}", self.conns),
                "-m1",
                &format!("-D{secs}"),
            ])
            .arg(format!("--log-file={}", log.display()))
            .args(&target)
            .output()
            .context("running h2load")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        let (p50, p99, p999, n) = parse_h2load_log(&logged);
        if n == 0 {
            bail!("h2load completed no request on port {port}:\n{text}");
        }
        if text
            .lines()
            .any(|l| l.starts_with("requests:") && !l.contains(" 0 failed, 0 errored"))
        {
            eprintln!("warning: h2load saw failures on port {port}:\n{text}");
        }
        Ok(Figures {
            rps: n as f64 / secs as f64,
            p50_us: p50,
            p99_us: p99,
            p999_us: p999,
            cpu_us: f64::NAN,
        })
    }
}

/// One path's figures, one per round.
type PathRounds = (&'static str, Vec<Figures>);

/// Ports of one protocol's paths.
struct Ports {
    direct: u16,
    haproxy: u16,
    /// HAProxy with `http-reuse never`: each client connection's requests on upstream
    /// connections of its own, the shim's model (a reading aid, not a target).
    haproxy_own: u16,
    envoy: u16,
    shim: u16,
    /// The shim with `--shim-h2-upstream own` (h2c only).
    shim_own: u16,
}

fn envoy_config(h1: &Ports, h2: &Ports) -> String {
    let listener = |name: &str, port: u16, cluster: &str| {
        format!(
            r#"  - name: {name}
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {name}
          codec_type: AUTO
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}
          route_config:
            virtual_hosts: [{{name: all, domains: ["*"], routes: [{{match: {{prefix: "/"}}, route: {{cluster: {cluster}}}}}]}}]
"#
        )
    };
    let cluster = |name: &str, port: u16, h2: bool| {
        let opts = if h2 {
            "    typed_extension_protocol_options:\n      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\n        explicit_http_config: {http2_protocol_options: {}}\n"
        } else {
            ""
        };
        format!(
            "  - name: {name}\n    type: STATIC\n    connect_timeout: 2s\n{opts}    load_assignment:\n      cluster_name: {name}\n      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]\n"
        )
    };
    format!(
        "static_resources:\n  listeners:\n{}{}  clusters:\n{}{}",
        listener("h1", h1.envoy, "be_h1"),
        listener("h2", h2.envoy, "be_h2"),
        cluster("be_h1", h1.direct, false),
        cluster("be_h2", h2.direct, true)
    )
}

/// xtask installs Envoy and names its binary (`RETRY_AGENT_ENVOY`), as it builds the agent.
fn envoy_bin() -> Result<PathBuf> {
    std::env::var_os("RETRY_AGENT_ENVOY")
        .map(PathBuf::from)
        .context("no Envoy binary: run through `cargo xtask bench shim`")
}

/// `rounds`: how many times every path runs (at least one).
pub fn run(bin: &Path, rounds: usize) -> Result<()> {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if uid.as_deref().ok() != Some("0") {
        bail!("bench shim needs root (iptables steering)");
    }
    for (c, a, pkg) in [
        ("wrk", "-v", "wrk"),
        ("haproxy", "-v", "haproxy"),
        ("iptables", "-V", "iptables"),
        ("h2load", "--version", "nghttp2-client"),
    ] {
        if !have(c, a) {
            bail!("bench shim needs {c} (apt-get install {pkg})");
        }
    }
    let envoy = envoy_bin()?;
    let secs: u64 = std::env::var("RA_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let bin = bin.to_path_buf();

    let dir = std::env::temp_dir().join(format!("rabench-shim-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let ports = || -> Result<Ports> {
        Ok(Ports {
            direct: free_port()?,
            haproxy: free_port()?,
            haproxy_own: free_port()?,
            envoy: free_port()?,
            shim: free_port()?,
            shim_own: free_port()?,
        })
    };
    let (h1, h2) = (ports()?, ports()?);
    // The backend in its own HAProxy process, so no forwarder shares its threads with it. The
    // shim paths have their own backend ports (steered by destination port).
    let defaults = "defaults\n    mode http\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n";
    let be_cfg = dir.join("backend.cfg");
    std::fs::write(
        &be_cfg,
        format!(
            "{defaults}frontend backend_fe\n    bind 127.0.0.1:{}\n    bind 127.0.0.1:{}\n    bind 127.0.0.1:{} proto h2\n    \
             bind 127.0.0.1:{} proto h2\n    bind 127.0.0.1:{} proto h2\n    \
             http-request return status 200 content-type text/plain string ok\n",
            h1.direct, h1.shim, h2.direct, h2.shim, h2.shim_own
        ),
    )?;
    let fwd_cfg = dir.join("forwarder.cfg");
    std::fs::write(
        &fwd_cfg,
        format!(
            "{defaults}frontend fwd_h1\n    bind 127.0.0.1:{}\n    default_backend be_h1\n\
             frontend fwd_h2\n    bind 127.0.0.1:{} proto h2\n    default_backend be_h2\n\
             frontend own_h1\n    bind 127.0.0.1:{}\n    default_backend own_h1\n\
             frontend own_h2\n    bind 127.0.0.1:{} proto h2\n    default_backend own_h2\n\
             backend be_h1\n    http-reuse always\n    server s1 127.0.0.1:{}\n\
             backend be_h2\n    http-reuse always\n    server s1 127.0.0.1:{} proto h2\n\
             backend own_h1\n    http-reuse never\n    server s1 127.0.0.1:{}\n\
             backend own_h2\n    http-reuse never\n    server s1 127.0.0.1:{} proto h2\n",
            h1.haproxy,
            h2.haproxy,
            h1.haproxy_own,
            h2.haproxy_own,
            h1.direct,
            h2.direct,
            h1.direct,
            h2.direct
        ),
    )?;
    let envoy_cfg = dir.join("envoy.yaml");
    std::fs::write(&envoy_cfg, envoy_config(&h1, &h2))?;
    let _backend = Killed::spawn(
        Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&be_cfg)
            .stdout(Stdio::null()),
    )?;
    let hap = Killed::spawn(
        Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&fwd_cfg)
            .stdout(Stdio::null()),
    )?;
    let env = Killed::spawn(
        Command::new(&envoy)
            .arg("-c")
            .arg(&envoy_cfg)
            .args([
                "--concurrency",
                "2",
                "--disable-hot-restart",
                "--log-level",
                "error",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )?;
    let chain = format!("RABENCH_{}", std::process::id() % 100_000);
    let _cleanup = Cleanup {
        bin: bin.clone(),
        chain: chain.clone(),
    };
    // The shim on its defaults, and one with the other h2c upstream mode, each steering its
    // own backend ports.
    let chain_own = format!("{chain}O");
    let _cleanup_own = Cleanup {
        bin: bin.clone(),
        chain: chain_own.clone(),
    };
    let start_shim = |name: &str, port: u16, chain: &str, dports: String, flags: &[&str]| {
        let run = dir.join(format!("shim-{name}"));
        std::fs::create_dir_all(&run)?;
        anyhow::Ok(Killed::spawn(
            Command::new(&bin)
                .args(["--log", "warn", "shim", "--port", &port.to_string()])
                .args(["--chain", chain, "--dport", &dports])
                .args(flags)
                .arg("--control-socket")
                .arg(run.join("no-agent.sock"))
                .arg("--run-dir")
                .arg(&run)
                .stdout(Stdio::null()),
        )?)
    };
    let shim_port = free_port()?;
    let dports = format!("{},{}", h1.shim, h2.shim);
    let shim = start_shim("defaults", shim_port, &chain, dports, &[])?;
    let own_port = free_port()?;
    let shim_own = start_shim(
        "own",
        own_port,
        &chain_own,
        h2.shim_own.to_string(),
        &["--shim-h2-upstream", "own"],
    )?;
    if ![
        h1.direct,
        h2.direct,
        h1.haproxy,
        h2.haproxy,
        h1.haproxy_own,
        h2.haproxy_own,
        h1.envoy,
        h2.envoy,
        shim_port,
        own_port,
    ]
    .into_iter()
    .all(wait_port)
    {
        bail!("haproxy, envoy or the shim did not come up");
    }
    sleep(Duration::from_millis(500)); // rules installed after the listener

    let load = Load {
        dir: &dir,
        conns: 32,
    };
    let pids = [
        ("direct", None),
        ("haproxy", Some(hap.0.id())),
        ("haproxy, no reuse", Some(hap.0.id())),
        ("envoy", Some(env.0.id())),
        ("shim", Some(shim.0.id())),
        ("shim, own upstream", Some(shim_own.0.id())),
    ];
    let load1 = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!(
        "{} connections, one request in flight each, {secs}s per path; load average before: {}",
        load.conns,
        load1.trim()
    );
    let protos = [
        (Proto::Http1, "http1", &h1),
        (Proto::H2c, "h2c", &h2),
        (Proto::H2cPaths, "h2c, 4096 paths", &h2),
    ];
    let mut rows: Vec<(&str, Vec<PathRounds>)> = protos
        .iter()
        .map(|(_, name, _)| {
            (
                *name,
                pids.iter().map(|(path, _)| (*path, Vec::new())).collect(),
            )
        })
        .collect();
    for round in 0..rounds {
        if rounds > 1 {
            eprintln!("round {} of {rounds}…", round + 1);
        }
        for ((proto, _, p), (_, figs)) in protos.iter().zip(rows.iter_mut()) {
            // The upstream mode is h2c's only: HTTP/1 has one shim path.
            let own = (*proto != Proto::Http1).then_some(p.shim_own);
            let port_of = [p.direct, p.haproxy, p.haproxy_own, p.envoy, p.shim]
                .map(Some)
                .into_iter()
                .chain([own]);
            let paths: Vec<_> = port_of.zip(pids).collect();
            for (port, (_, pid)) in &paths {
                if let Some(port) = port {
                    load.run(*proto, *port, 1, *pid)?; // warm-up: connections, pools, caches
                }
            }
            for ((port, (_, pid)), (_, got)) in paths.iter().zip(figs.iter_mut()) {
                if let Some(port) = port {
                    got.push(load.run(*proto, *port, secs, *pid)?);
                }
            }
        }
    }
    let load2 = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();

    if rounds > 1 {
        println!(
            "median of {rounds} rounds (every path once per round); ratios: median of the rounds' own (range)\n"
        );
    }
    println!(
        "| proto | path | req/s | p50 µs | p99 µs | p99.9 µs | +p50 µs | +p99 µs | +p99.9 µs | proxy CPU µs/req |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (proto, figs) in &rows {
        let med = |v: &[Figures], f: fn(&Figures) -> f64| median(v.iter().map(f));
        let Some((_, direct)) = figs.first() else {
            continue;
        };
        for (path, v) in figs.iter().filter(|(_, v)| !v.is_empty()) {
            let cpu = med(v, |f| f.cpu_us);
            println!(
                "| {proto} | {path} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} |",
                med(v, |f| f.rps),
                med(v, |f| f.p50_us),
                med(v, |f| f.p99_us),
                med(v, |f| f.p999_us),
                med(v, |f| f.p50_us) - med(direct, |f| f.p50_us),
                med(v, |f| f.p99_us) - med(direct, |f| f.p99_us),
                med(v, |f| f.p999_us) - med(direct, |f| f.p999_us),
                if cpu.is_nan() {
                    "-".to_string()
                } else {
                    format!("{cpu:.1}")
                }
            );
        }
        let get = |n: &str| {
            figs.iter()
                .find(|(p, _)| *p == n)
                .map(|(_, v)| v.as_slice())
        };
        // A ratio of two paths, round by round (figures taken minutes apart do not compare).
        let ratio = |a: &[Figures], b: &[Figures], f: fn(&Figures) -> f64| {
            ratio_text(
                &a.iter()
                    .zip(b)
                    .map(|(x, y)| f(x) / f(y))
                    .collect::<Vec<_>>(),
            )
        };
        if let (Some(s), Some(h), Some(e)) = (get("shim"), get("haproxy"), get("envoy")) {
            println!(
                "\n{proto}: shim/haproxy req/s {} (target ≥ 0.9), p99 {} (target ≤ 1.1); shim/envoy p99 {} (target ≤ 1.0)\n",
                ratio(s, h, |f| f.rps),
                ratio(s, h, |f| f.p99_us),
                ratio(s, e, |f| f.p99_us)
            );
        }
        let own = get("shim, own upstream").filter(|v| !v.is_empty());
        if let (Some(s), Some(h), Some(e)) = (own, get("haproxy"), get("envoy")) {
            println!(
                "{proto}: shim with --shim-h2-upstream own / haproxy req/s {}, p99 {}; /envoy p99 {}\n",
                ratio(s, h, |f| f.rps),
                ratio(s, h, |f| f.p99_us),
                ratio(s, e, |f| f.p99_us)
            );
        }
        // HTTP/1's shim keeps a connection per caller whatever the h2c mode.
        if let (Some(s), Some(h)) = (own.or(get("shim")), get("haproxy, no reuse")) {
            println!(
                "{proto}: in the shim's connection model (HAProxy with `http-reuse never`): shim/haproxy req/s {}, p99 {}\n",
                ratio(s, h, |f| f.rps),
                ratio(s, h, |f| f.p99_us)
            );
        }
    }
    println!(
        "load average before: {} after: {}",
        load1.trim(),
        load2.trim()
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_wrk_latency_output() {
        let out = "Running 1s test\n  Latency Distribution\n     50%  210.00us\n     75%    1.10ms\n     90%    2.00ms\n     99%    3.52ms\n  1000 requests in 1.00s\nRequests/sec:  12345.67\nTransfer/sec: 1MB\nRA_P999 7010\n";
        let f = parse_wrk(out).expect("parsed");
        assert_eq!(f.rps, 12345.67);
        assert_eq!(f.p50_us, 210.0);
        assert_eq!(f.p99_us, 3520.0);
        assert_eq!(f.p999_us, 7010.0);
        assert!(parse_wrk("nothing").is_none());
        assert_eq!(parse_dur("1.5s"), Some(1.5e6));
    }

    #[test]
    fn h2load_log_gives_quantiles_of_successes() {
        let mut log = String::new();
        for i in 1..=1000 {
            log.push_str(&format!("1700000000000000\t200\t{i}\n"));
        }
        log.push_str("1700000000000000\t503\t999999\nbroken line\n");
        let (p50, p99, p999, n) = parse_h2load_log(&log);
        assert_eq!((p50, p99, p999, n), (500.0, 990.0, 999.0, 1000));
        assert!(parse_h2load_log("").0.is_nan());
    }
}
