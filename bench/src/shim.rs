//! `cargo xtask bench shim`: the shim's forwarding cost against HAProxy doing plain forwarding,
//! same box, same backend, one run each (needs root, iptables, haproxy, wrk).
//!
//! Paths measured with wrk (keep-alive, `--latency`):
//! - direct:  wrk → backend
//! - haproxy: wrk → HAProxy (`mode http`, plain forwarding) → backend
//! - shim:    wrk → (iptables REDIRECT) → retry-agent shim → backend
//!
//! The backend is HAProxy answering `http-request return` (fast and steady). Printed: requests/s,
//! p50/p99 latency, latency added over direct, and the shim/HAProxy ratios. Figures, not a test.
//! `RA_BENCH_PROFILE=debug` benches a debug build of the agent (default: release; xtask builds
//! it), `RA_BENCH_SECS` the duration.
use std::{
    net::TcpListener,
    path::PathBuf,
    process::{Child, Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Removes the bench's steering chain however the bench ends.
struct Cleanup {
    bin: PathBuf,
    chain: String,
}
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Command::new(&self.bin).args(["shim", "--cleanup", "--shim-chain", &self.chain]).stderr(Stdio::null()).status();
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn have(cmd: &str, arg: &str) -> bool {
    Command::new(cmd).arg(arg).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

fn wait_port(port: u16) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
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
}

/// "1.23ms" / "456.78us" / "1.2s" → microseconds.
fn parse_dur(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, mul) = if let Some(v) = s.strip_suffix("us") {
        (v, 1.0)
    } else if let Some(v) = s.strip_suffix("ms") {
        (v, 1e3)
    } else if let Some(v) = s.strip_suffix('s') {
        (v, 1e6)
    } else {
        return None;
    };
    num.parse::<f64>().ok().map(|n| n * mul)
}

fn parse_wrk(out: &str) -> Option<Figures> {
    let mut f = Figures { rps: f64::NAN, p50_us: f64::NAN, p99_us: f64::NAN };
    for line in out.lines() {
        let mut w = line.split_whitespace();
        match (w.next(), w.next()) {
            (Some("Requests/sec:"), Some(v)) => f.rps = v.parse().ok()?,
            (Some("50%"), Some(v)) => f.p50_us = parse_dur(v)?,
            (Some("99%"), Some(v)) => f.p99_us = parse_dur(v)?,
            _ => {}
        }
    }
    (!f.rps.is_nan() && !f.p50_us.is_nan() && !f.p99_us.is_nan()).then_some(f)
}

fn wrk(port: u16, secs: u64, conns: u32) -> Result<Figures> {
    let out = Command::new("wrk")
        .args(["-t2", &format!("-c{conns}"), &format!("-d{secs}s"), "--latency"])
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .context("running wrk")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("Non-2xx") || text.contains("Socket errors") {
        eprintln!("warning: wrk saw errors on port {port}:\n{text}");
    }
    parse_wrk(&text).with_context(|| format!("unparseable wrk output:\n{text}"))
}

pub fn run(bin: &std::path::Path) -> Result<()> {
    let uid = Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if uid.as_deref().ok() != Some("0") {
        bail!("bench shim needs root (iptables steering)");
    }
    for (c, a) in [("wrk", "-v"), ("haproxy", "-v"), ("iptables", "-V")] {
        if !have(c, a) {
            bail!("bench shim needs {c} (apt-get install {c})");
        }
    }
    let secs: u64 = std::env::var("RA_BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(8);
    let bin = bin.to_path_buf();

    let dir = std::env::temp_dir().join(format!("rabench-shim-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (b_direct, b_shim, fwd, shim_port) = (free_port()?, free_port()?, free_port()?, free_port()?);
    // Two HAProxy processes, so the forwarder does not share its threads with the backend.
    let defaults = "defaults\n    mode http\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n";
    let be_cfg = dir.join("backend.cfg");
    std::fs::write(
        &be_cfg,
        format!(
            "{defaults}frontend backend_fe\n    bind 127.0.0.1:{b_direct}\n    bind 127.0.0.1:{b_shim}\n    \
             http-request return status 200 content-type text/plain string ok\n"
        ),
    )?;
    let fwd_cfg = dir.join("forwarder.cfg");
    std::fs::write(
        &fwd_cfg,
        format!(
            "{defaults}frontend fwd\n    bind 127.0.0.1:{fwd}\n    default_backend be\n\
             backend be\n    http-reuse always\n    server s1 127.0.0.1:{b_direct}\n"
        ),
    )?;
    let _backend = Kill(Command::new("haproxy").arg("-db").arg("-f").arg(&be_cfg).stdout(Stdio::null()).spawn()?);
    let _hap = Kill(Command::new("haproxy").arg("-db").arg("-f").arg(&fwd_cfg).stdout(Stdio::null()).spawn()?);
    let chain = format!("RABENCH_{}", std::process::id() % 100_000);
    let _cleanup = Cleanup { bin: bin.clone(), chain: chain.clone() };
    let _shim = Kill(
        Command::new(&bin)
            .args(["--log", "warn", "shim", "--shim-port", &shim_port.to_string(), "--shim-chain", &chain])
            .args(["--shim-dport", &b_shim.to_string(), "--shim-control-socket"])
            .arg(dir.join("no-agent.sock"))
            .arg("--shim-run-dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .spawn()?,
    );
    if !(wait_port(b_direct) && wait_port(fwd) && wait_port(shim_port)) {
        bail!("haproxy or the shim did not come up");
    }
    sleep(Duration::from_millis(500)); // rules installed after the listener

    let conns = 32;
    eprintln!("wrk: 2 threads, {conns} connections, {secs}s per path; warming up...");
    for p in [b_direct, fwd, b_shim] {
        wrk(p, 1, conns)?;
    }
    let direct = wrk(b_direct, secs, conns)?;
    let hap = wrk(fwd, secs, conns)?;
    let shim = wrk(b_shim, secs, conns)?;

    println!("path      req/s      p50(us)   p99(us)   +p50(us) +p99(us)");
    for (name, f) in [("direct", direct), ("haproxy", hap), ("shim", shim)] {
        println!(
            "{name:<9} {:>9.0} {:>9.1} {:>9.1} {:>9.1} {:>8.1}",
            f.rps,
            f.p50_us,
            f.p99_us,
            f.p50_us - direct.p50_us,
            f.p99_us - direct.p99_us
        );
    }
    println!(
        "shim/haproxy: throughput {:.2} (target ≥ 0.9), p50 {:.2}, p99 {:.2} (target ≤ 1.1); added p99 ratio {:.2}",
        shim.rps / hap.rps,
        shim.p50_us / hap.p50_us,
        shim.p99_us / hap.p99_us,
        (shim.p99_us - direct.p99_us) / (hap.p99_us - direct.p99_us)
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_wrk_latency_output() {
        let out = "Running 1s test\n  Latency Distribution\n     50%  210.00us\n     75%    1.10ms\n     90%    2.00ms\n     99%    3.52ms\n  1000 requests in 1.00s\nRequests/sec:  12345.67\nTransfer/sec: 1MB\n";
        let f = parse_wrk(out).expect("parsed");
        assert_eq!(f.rps, 12345.67);
        assert_eq!(f.p50_us, 210.0);
        assert_eq!(f.p99_us, 3520.0);
        assert!(parse_wrk("nothing").is_none());
        assert_eq!(parse_dur("1.5s"), Some(1.5e6));
    }
}
