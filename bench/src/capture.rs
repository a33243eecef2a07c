//! `cargo xtask bench capture`: what kernel capture costs, in one run.
//!
//! A loopback HTTP keep-alive load (wrk → haproxy answering every request itself) runs
//! alternately without and with the agent attached (`retry-agent trace --count`: the full capture
//! path — kernel programs, ring buffer, decode, process metadata, channel — minus printing). It
//! prints requests/s for both, their ratio, the events/s the agent consumed and every drop counter,
//! plus two figures other load on the machine does not distort: kernel time spent in our programs
//! (BPF run-time statistics) and the agent's own CPU time.
//! Figures only, never pass/fail: this machine is shared, so the throughput numbers are noisy.
use std::{
    io::{BufRead, BufReader, Read},
    net::TcpListener,
    path::Path,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

const ROUNDS: usize = 2;
pub(crate) const SECONDS: u64 = 8;
pub(crate) const CONNECTIONS: u32 = 16;

/// A child the bench started, killed when dropped, and by the kernel should the bench die
/// without dropping it (a signal): a floor's bpftrace left attached slowed every later run
/// and, started under `flock`, held the machine lock.
pub(crate) struct Killed(pub(crate) Child);

impl Killed {
    pub(crate) fn spawn(cmd: &mut Command) -> std::io::Result<Killed> {
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent's.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(cmd, || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.spawn().map(Killed)
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub(crate) fn wait_port(port: u16) -> Result<()> {
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if start.elapsed() > Duration::from_secs(10) {
            bail!("nothing listens on 127.0.0.1:{port}");
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// A self-signed certificate and its key in one PEM (what haproxy's `crt` takes).
fn bench_pem(dir: &Path) -> Result<std::path::PathBuf> {
    let (cert, key, pem) = (
        dir.join("cert.pem"),
        dir.join("key.pem"),
        dir.join("bench.pem"),
    );
    let ok = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("running openssl")?;
    if !ok.success() {
        bail!("openssl req failed");
    }
    let mut both = std::fs::read(&cert)?;
    both.extend(std::fs::read(&key)?);
    std::fs::write(&pem, both)?;
    Ok(pem)
}

pub(crate) fn haproxy(dir: &Path, port: u16, tls: bool) -> Result<Killed> {
    let bind = if tls {
        format!(" ssl crt {}", bench_pem(dir)?.display())
    } else {
        String::new()
    };
    haproxy_bind(dir, port, &bind)
}

/// HAProxy answering itself on `port`, `bind` added to its bind line (`ssl …`, `proto h2`).
pub(crate) fn haproxy_bind(dir: &Path, port: u16, ssl: &str) -> Result<Killed> {
    let cfg = dir.join("haproxy.cfg");
    std::fs::write(
        &cfg,
        format!(
            "global\n  nbthread 1\n  maxconn 1024\n\
             defaults\n  mode http\n  timeout client 30s\n  timeout server 30s\n  timeout connect 5s\n\
             frontend bench\n  bind 127.0.0.1:{port}{ssl}\n  http-request return status 200 content-type text/plain string ok\n"
        ),
    )?;
    let h = Killed::spawn(
        Command::new("haproxy")
            .arg("-f")
            .arg(&cfg)
            .arg("-db")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .context("starting haproxy (apt-get install haproxy)")?;
    wait_port(port)?;
    Ok(h)
}

/// Requests/s of one wrk run.
fn wrk(port: u16, tls: bool) -> Result<f64> {
    let scheme = if tls { "https" } else { "http" };
    wrk_url(&format!("{scheme}://127.0.0.1:{port}/"))
}

/// Writes `path`: 4,096 URLs on `port` with distinct paths and queries, for `h2load -i`. Each
/// `:path` is then a literal the HPACK table never keeps (nghttp2 does not index `:path`), so
/// every request's is decoded, as in real traffic; one URL is a static-table index.
pub(crate) fn h2load_paths(path: &Path, port: u16) -> Result<()> {
    let uris: String = (0..4096u32)
        .map(|i| {
            format!(
                "http://127.0.0.1:{port}/orders/{}/items?page={}&sort=desc\n",
                i.wrapping_mul(2_654_435_761) % 1_000_000,
                i % 50
            )
        })
        .collect();
    std::fs::write(path, uris).with_context(|| format!("writing {}", path.display()))
}

/// Requests/s of one wrk run against `url` (one thread, [`CONNECTIONS`] keep-alive connections).
pub(crate) fn wrk_url(url: &str) -> Result<f64> {
    let out = Command::new("wrk")
        .args(["-t1", &format!("-c{CONNECTIONS}"), &format!("-d{SECONDS}s")])
        .arg(url)
        .output()
        .context("running wrk (apt-get install wrk)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no Requests/sec in wrk output:\n{text}"))
}

struct AgentRun {
    /// Kernel time in our programs during the load (BPF stats), and their invocations.
    bpf_ns: u64,
    bpf_runs: u64,
    /// Per program: (name, ns, runs) during the load.
    per_program: Vec<(String, u64, u64)>,
    /// CPU time of the agent process during the load.
    agent_cpu_s: f64,
    seconds: f64,
    events: u64,
    kernel_drops: u64,
    channel_drops: u64,
    decode_errors: u64,
}

/// Starts `retry-agent trace --count` and waits until its programs are attached.
fn start_agent(bin: &Path, tls: bool) -> Result<Killed> {
    let mut cmd = Command::new(bin);
    cmd.args([
        "trace",
        "--count",
        "--log",
        "info",
        "--capture-tls",
        if tls { "true" } else { "false" },
    ])
    .stdout(Stdio::piped());
    spawn_until(&mut cmd, Said::Stderr, "capture attached")
        .with_context(|| format!("{} (run the bench as root)", bin.display()))
}

/// Where a child says it is ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Said {
    Stdout,
    Stderr,
}

/// Spawns `cmd` and returns once a line of its `said` stream contains `needle`; that stream is
/// drained afterwards so the child never blocks on a full pipe. An exit before it is an error
/// carrying what the child printed.
pub(crate) fn spawn_until(cmd: &mut Command, said: Said, needle: &str) -> Result<Killed> {
    match said {
        Said::Stdout => cmd.stdout(Stdio::piped()),
        Said::Stderr => cmd.stderr(Stdio::piped()),
    };
    let mut child =
        Killed::spawn(cmd).with_context(|| format!("starting {:?}", cmd.get_program()))?;
    let stream: Box<dyn Read + Send> = match said {
        Said::Stdout => Box::new(child.0.stdout.take().context("child stdout")?),
        Said::Stderr => Box::new(child.0.stderr.take().context("child stderr")?),
    };
    let mut lines = BufReader::new(stream).lines();
    let mut seen = Vec::new();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.contains(needle) => break,
            Some(Ok(l)) => seen.push(l),
            _ => {
                let _ = child.0.wait();
                bail!(
                    "{:?} exited before saying {needle:?}:\n{}",
                    cmd.get_program(),
                    seen.join("\n")
                );
            }
        }
    }
    thread::spawn(move || lines.for_each(drop));
    Ok(child)
}

/// utime + stime of a process, in seconds.
pub(crate) fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the parenthesised comm; utime and stime are the 14th and 15th overall.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // 100 ticks per second (USER_HZ) on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

/// Run time and run count of each of our programs, by program id.
fn bpf_snapshot() -> std::collections::HashMap<u32, (String, u64, u64)> {
    retry_agent::capture::program_stats()
        .into_iter()
        .map(|p| (p.id, (p.name, p.run_ns, p.runs)))
        .collect()
}

/// Per-program (name, ns, runs) between two snapshots.
fn bpf_delta(
    a: &std::collections::HashMap<u32, (String, u64, u64)>,
    b: &std::collections::HashMap<u32, (String, u64, u64)>,
) -> Vec<(String, u64, u64)> {
    b.iter()
        .map(|(id, (name, ns, runs))| {
            let (ns0, runs0) = a.get(id).map(|(_, n, r)| (*n, *r)).unwrap_or((0, 0));
            (
                name.clone(),
                ns.saturating_sub(ns0),
                runs.saturating_sub(runs0),
            )
        })
        .collect()
}

fn stop_agent(mut agent: Killed) -> Result<AgentRun> {
    let pid = agent.0.id().to_string();
    Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .context("signalling the agent")?;
    let mut out = String::new();
    if let Some(mut so) = agent.0.stdout.take() {
        so.read_to_string(&mut out)?;
    }
    let _ = agent.0.wait();
    let num = |key: &str| -> u64 {
        // Flat scan of `"key":N` in the one-line JSON the agent prints.
        out.split(&format!("\"{key}\":"))
            .nth(1)
            .and_then(|rest| rest.split([',', '}']).next())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0) as u64
    };
    let seconds = out
        .split("\"seconds\":")
        .nth(1)
        .and_then(|r| r.split([',', '}']).next())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    if out.trim().is_empty() {
        bail!("the agent printed no counters");
    }
    Ok(AgentRun {
        bpf_ns: 0,
        bpf_runs: 0,
        per_program: Vec::new(),
        agent_cpu_s: 0.0,
        seconds,
        events: num("events"),
        kernel_drops: num("kernel_drops"),
        channel_drops: num("channel_drops"),
        decode_errors: num("decode_errors"),
    })
}

pub fn run(bin: &Path, tls: bool) -> Result<()> {
    if !crate::is_root() {
        bail!("bench capture loads eBPF programs: run as root");
    }
    let dir = std::env::temp_dir().join(format!("racap-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let port = free_port()?;
    let _haproxy = haproxy(&dir, port, tls)?;
    // Warm-up: first connections, page cache, CPU frequency.
    let _ = wrk(port, tls)?;

    let (mut without, mut with) = (Vec::new(), Vec::new());
    let mut agent_runs = Vec::new();
    for round in 1..=ROUNDS {
        let a = wrk(port, tls)?;
        eprintln!("round {round}: without agent {a:.0} req/s");
        without.push(a);
        let agent = start_agent(bin, tls)?;
        let agent_pid = agent.0.id();
        // Kernel-side cost, measured exactly (not affected by other load on the machine).
        let stats_fd = retry_agent::capture::enable_bpf_stats().ok();
        let snap0 = bpf_snapshot();
        let cpu0 = cpu_seconds(agent_pid);
        let b = wrk(port, tls)?;
        let cpu1 = cpu_seconds(agent_pid);
        let snap1 = bpf_snapshot();
        drop(stats_fd);
        let mut r = stop_agent(agent)?;
        r.per_program = bpf_delta(&snap0, &snap1);
        r.bpf_ns = r.per_program.iter().map(|p| p.1).sum();
        r.bpf_runs = r.per_program.iter().map(|p| p.2).sum();
        r.agent_cpu_s = cpu1 - cpu0;
        eprintln!(
            "round {round}: with agent    {b:.0} req/s ({} events in {:.1}s, drops kernel {} channel {})",
            r.events, r.seconds, r.kernel_drops, r.channel_drops
        );
        with.push(b);
        agent_runs.push(r);
    }
    let _ = std::fs::remove_dir_all(&dir);

    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let (wo, wi) = (mean(&without), mean(&with));
    let events: u64 = agent_runs.iter().map(|r| r.events).sum();
    let secs: f64 = agent_runs.iter().map(|r| r.seconds).sum();
    let load_secs = (SECONDS * ROUNDS as u64) as f64;
    let over = if tls {
        "HTTPS (TLS uprobes on libssl)"
    } else {
        "plain HTTP"
    };
    println!(
        "bench capture: wrk -t1 -c{CONNECTIONS} -d{SECONDS}s keep-alive GETs to haproxy on loopback over {over}, {ROUNDS} rounds"
    );
    println!("  requests/s without agent   {wo:>12.0}");
    println!("  requests/s with agent      {wi:>12.0}");
    println!(
        "  ratio with/without         {:>12.3}",
        if wo > 0.0 { wi / wo } else { 0.0 }
    );
    println!(
        "  events consumed            {events:>12}  ({:.0}/s over the load, {:.0}/s over agent uptime {secs:.1}s)",
        events as f64 / load_secs,
        events as f64 / secs.max(1e-9)
    );
    println!(
        "  events per request         {:>12.2}",
        events as f64 / (wi * load_secs).max(1.0)
    );
    let bpf_ns: u64 = agent_runs.iter().map(|r| r.bpf_ns).sum();
    let bpf_runs: u64 = agent_runs.iter().map(|r| r.bpf_runs).sum();
    let requests = wi * load_secs;
    println!(
        "  eBPF program runs          {bpf_runs:>12}  ({:.0} ns per run, {:.2} µs kernel time per request)",
        bpf_ns as f64 / (bpf_runs.max(1)) as f64,
        bpf_ns as f64 / 1000.0 / requests.max(1.0)
    );
    let mut by_name: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    for (name, ns, runs) in agent_runs.iter().flat_map(|r| r.per_program.iter()) {
        let e = by_name.entry(name.clone()).or_default();
        e.0 += ns;
        e.1 += runs;
    }
    let mut top: Vec<_> = by_name.into_iter().collect();
    top.sort_by_key(|(_, (ns, _))| std::cmp::Reverse(*ns));
    for (name, (ns, runs)) in top.iter().take(8) {
        println!(
            "    {name:<24} {runs:>10} runs  {:>6.0} ns/run  {:>5.1}% of eBPF time",
            *ns as f64 / (*runs).max(1) as f64,
            100.0 * *ns as f64 / bpf_ns.max(1) as f64
        );
    }
    let cpu: f64 = agent_runs.iter().map(|r| r.agent_cpu_s).sum();
    println!(
        "  agent CPU                  {:>11.1}%  of one core ({:.0} ns per event)",
        100.0 * cpu / load_secs,
        cpu * 1e9 / (events.max(1)) as f64
    );
    println!(
        "  kernel ring drops          {:>12}",
        agent_runs.iter().map(|r| r.kernel_drops).sum::<u64>()
    );
    println!(
        "  channel drops              {:>12}",
        agent_runs.iter().map(|r| r.channel_drops).sum::<u64>()
    );
    println!(
        "  decode errors              {:>12}",
        agent_runs.iter().map(|r| r.decode_errors).sum::<u64>()
    );
    Ok(())
}
