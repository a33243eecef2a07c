//! `cargo xtask bench capture`: what kernel capture costs, in one run.
//!
//! A loopback HTTP keep-alive load (wrk → haproxy answering every request itself) runs
//! alternately without and with the agent attached (`retry-agent trace --count`: the full capture
//! path — kernel programs, ring buffer, decode, process metadata, channel — minus printing). It
//! prints requests/s for both, their ratio, the events/s the agent consumed and every drop counter.
//! Figures only, never pass/fail: this machine is shared, so the numbers are noisy.
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
const SECONDS: u64 = 8;
const CONNECTIONS: u32 = 16;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn wait_port(port: u16) -> Result<()> {
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if start.elapsed() > Duration::from_secs(10) {
            bail!("nothing listens on 127.0.0.1:{port}");
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn haproxy(dir: &Path, port: u16) -> Result<Killed> {
    let cfg = dir.join("haproxy.cfg");
    std::fs::write(
        &cfg,
        format!(
            "global\n  nbthread 1\n  maxconn 1024\n\
             defaults\n  mode http\n  timeout client 30s\n  timeout server 30s\n  timeout connect 5s\n\
             frontend bench\n  bind 127.0.0.1:{port}\n  http-request return status 200 content-type text/plain string ok\n"
        ),
    )?;
    let child = Command::new("haproxy")
        .arg("-f")
        .arg(&cfg)
        .arg("-db")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting haproxy (apt-get install haproxy)")?;
    let h = Killed(child);
    wait_port(port)?;
    Ok(h)
}

/// Requests/s of one wrk run.
fn wrk(port: u16) -> Result<f64> {
    let out = Command::new("wrk")
        .args(["-t1", &format!("-c{CONNECTIONS}"), &format!("-d{SECONDS}s")])
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .context("running wrk (apt-get install wrk)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no Requests/sec in wrk output:\n{text}"))
}

struct AgentRun {
    seconds: f64,
    events: u64,
    kernel_drops: u64,
    channel_drops: u64,
    decode_errors: u64,
}

/// Starts `retry-agent trace --count` and waits until its programs are attached.
fn start_agent(bin: &Path) -> Result<Killed> {
    let mut child = Command::new(bin)
        .args(["trace", "--count", "--log", "info"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let err = child.stderr.take().context("agent stderr")?;
    let mut lines = BufReader::new(err).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.contains("capture attached") => break,
            Some(Ok(_)) => {}
            _ => {
                let _ = child.wait();
                bail!("the agent exited before attaching (run the bench as root)");
            }
        }
    }
    // Keep draining its log so it never blocks on a full pipe.
    thread::spawn(move || lines.for_each(drop));
    Ok(Killed(child))
}

fn stop_agent(mut agent: Killed) -> Result<AgentRun> {
    let pid = agent.0.id().to_string();
    Command::new("kill").args(["-INT", &pid]).status().context("signalling the agent")?;
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
        seconds,
        events: num("events"),
        kernel_drops: num("kernel_drops"),
        channel_drops: num("channel_drops"),
        decode_errors: num("decode_errors"),
    })
}

pub fn run() -> Result<()> {
    if !crate::setup::is_root() {
        bail!("bench capture loads eBPF programs: run as root");
    }
    eprintln!("building the agent (release)…");
    let bin = crate::build::agent(true)?;
    let dir = std::env::temp_dir().join(format!("racap-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let port = free_port()?;
    let _haproxy = haproxy(&dir, port)?;
    // Warm-up: first connections, page cache, CPU frequency.
    let _ = wrk(port)?;

    let (mut without, mut with) = (Vec::new(), Vec::new());
    let mut agent_runs = Vec::new();
    for round in 1..=ROUNDS {
        let a = wrk(port)?;
        eprintln!("round {round}: without agent {a:.0} req/s");
        without.push(a);
        let agent = start_agent(&bin)?;
        let b = wrk(port)?;
        let r = stop_agent(agent)?;
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
    println!("bench capture: wrk -t1 -c{CONNECTIONS} -d{SECONDS}s keep-alive GETs to haproxy on loopback, {ROUNDS} rounds");
    println!("  requests/s without agent   {wo:>12.0}");
    println!("  requests/s with agent      {wi:>12.0}");
    println!("  ratio with/without         {:>12.3}", if wo > 0.0 { wi / wo } else { 0.0 });
    println!("  events consumed            {events:>12}  ({:.0}/s over the load, {:.0}/s over agent uptime {secs:.1}s)", events as f64 / load_secs, events as f64 / secs.max(1e-9));
    println!("  events per request         {:>12.2}", events as f64 / (wi * load_secs).max(1.0));
    println!("  kernel ring drops          {:>12}", agent_runs.iter().map(|r| r.kernel_drops).sum::<u64>());
    println!("  channel drops              {:>12}", agent_runs.iter().map(|r| r.channel_drops).sum::<u64>());
    println!("  decode errors              {:>12}", agent_runs.iter().map(|r| r.decode_errors).sum::<u64>());
    Ok(())
}
