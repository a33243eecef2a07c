//! `cargo xtask bench overhead`: what the agent costs a busy service, against what attaching
//! tracepoints costs at all, in one run.
//!
//! For each server (haproxy answering itself, nginx serving a 1 KiB file, Go net/http hello,
//! haproxy over TLS, and haproxy over h2c) a keep-alive load (wrk; h2load for h2c, each request to
//! one of 4,096 paths, so every `:path` is a Huffman-coded literal to decode, as in real traffic)
//! runs three ways, side by side:
//! - **none**: nothing attached;
//! - **floor**: bpftrace with empty programs on the same tracepoints the agent's object attaches
//!   (read from the object), plus empty uprobes on the libssl symbols for the TLS row: the cost of
//!   the hooks themselves, which no agent built on them can go below;
//! - **agent**: `retry-agent run` with its defaults (recorder on; `--capture-tls true` for the TLS
//!   row; once more without the Go uprobes for the Go server; once more with
//!   `--capture-summarize false` for haproxy, nginx and Go), private paths in a temporary
//!   directory.
//!
//! It prints req/s for each, floor/none and agent/floor, the agent's CPU per request (its own
//! process, user + system), the eBPF time per request its programs took from the workload
//! (`kernel.bpf_stats_enabled`, on for the floor and agent runs alike), its peak RSS and its
//! capture drops. Figures only, never pass/fail: the
//! machine is shared, so compare ratios from one run.
//!
//! `--rounds N` (default 3) measures each row N times, none → floor → agent in each round (a fresh agent per
//! round), and prints the median of each figure and of the per-round ratios, with the ratios'
//! range: on a shared machine one round's floor can be hit by a neighbour (a TLS floor at 0.38
//! of no instrumentation), and only figures taken side by side in one round compare.
//! `--rows tls,haproxy` measures only those rows; without it, haproxy, nginx, go, tls and h2c
//! (the other rows are variants for a closer look at one lever). Three rounds unless told.
use std::{
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::{Context, Result, bail};

use crate::capture::{
    CONNECTIONS, Killed, SECONDS, Said, cpu_seconds, free_port, h2load_paths, haproxy,
    haproxy_bind, spawn_until, wait_port, wrk_url,
};

/// The libssl functions the agent's TLS programs probe (entry and return).
const SSL_SYMBOLS: &[&str] = &[
    "SSL_write",
    "SSL_read",
    "SSL_write_ex",
    "SSL_read_ex",
    "SSL_do_handshake",
    "SSL_connect",
    "SSL_accept",
];
const LIBSSL: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libssl.so.3",
    "/usr/lib/aarch64-linux-gnu/libssl.so.3",
    "/usr/lib64/libssl.so.3",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Server {
    Haproxy,
    /// The same haproxy, every exchange read whole (`--capture-summarize false`).
    #[value(name = "haproxy-whole")]
    HaproxyWhole,
    Nginx,
    /// The same nginx, `--capture-summarize false`.
    #[value(name = "nginx-whole")]
    NginxWhole,
    /// The same nginx, responses captured to 256 bytes (`--capture-response-bytes`).
    #[value(name = "nginx-256")]
    NginxShortResponses,
    /// The agent's defaults: `--capture-go auto` (the Go uprobes only where a hit is cheap).
    Go,
    /// The same Go server, `--capture-summarize false`.
    #[value(name = "go-whole")]
    GoWhole,
    /// The same Go server, the Go uprobes on whatever they cost here.
    GoUprobes,
    /// The same Go server, the agent without its Go uprobes: what they cost.
    #[value(name = "go-off")]
    GoNoUprobes,
    #[value(name = "tls")]
    HaproxyTls,
    /// HAProxy answering h2c; h2load over 4,096 paths.
    #[value(name = "h2c")]
    HaproxyH2c,
}

impl Server {
    pub const ALL: [Server; 11] = [
        Server::Haproxy,
        Server::HaproxyWhole,
        Server::Nginx,
        Server::NginxWhole,
        Server::NginxShortResponses,
        Server::Go,
        Server::GoWhole,
        Server::GoUprobes,
        Server::GoNoUprobes,
        Server::HaproxyTls,
        Server::HaproxyH2c,
    ];

    /// What `--rows` measures when not given: the three servers of issue 12's table, TLS and
    /// h2c; the other rows are variants of these (whole exchanges, Go uprobes forced either
    /// way, short responses) for a closer look at one lever.
    pub const DEFAULT: [Server; 5] = [
        Server::Haproxy,
        Server::Nginx,
        Server::Go,
        Server::HaproxyTls,
        Server::HaproxyH2c,
    ];

    fn label(self) -> &'static str {
        match self {
            Server::Haproxy => "haproxy answering itself",
            Server::HaproxyWhole => "haproxy, --capture-summarize false",
            Server::Nginx => "nginx, 1 KiB file",
            Server::NginxWhole => "nginx, --capture-summarize false",
            Server::NginxShortResponses => "nginx, --capture-response-bytes 256",
            Server::Go => "Go net/http hello",
            Server::GoWhole => "Go hello, --capture-summarize false",
            Server::GoUprobes => "Go hello, --capture-go true",
            Server::GoNoUprobes => "Go hello, --capture-go false",
            Server::HaproxyTls => "haproxy over TLS",
            Server::HaproxyH2c => "haproxy h2c, 4096 paths (h2load)",
        }
    }

    fn tls(self) -> bool {
        self == Server::HaproxyTls
    }

    /// The agent's settings for this row (defaults but for TLS and, in one row, the Go uprobes).
    fn agent_args(self) -> Vec<&'static str> {
        let mut args = vec!["--capture-tls", if self.tls() { "true" } else { "false" }];
        match self {
            Server::GoUprobes => args.extend(["--capture-go", "true"]),
            Server::GoNoUprobes => args.extend(["--capture-go", "false"]),
            Server::NginxShortResponses => args.extend(["--capture-response-bytes", "256"]),
            Server::HaproxyWhole | Server::NginxWhole | Server::GoWhole => {
                args.extend(["--capture-summarize", "false"])
            }
            _ => {}
        }
        args
    }

    /// Starts the server; returns it and the URL to load.
    fn start(self, dir: &Path) -> Result<(Killed, String)> {
        let port = free_port()?;
        match self {
            Server::Haproxy | Server::HaproxyWhole | Server::HaproxyTls => {
                let scheme = if self.tls() { "https" } else { "http" };
                Ok((
                    haproxy(dir, port, self.tls())?,
                    format!("{scheme}://127.0.0.1:{port}/"),
                ))
            }
            Server::Nginx | Server::NginxWhole | Server::NginxShortResponses => {
                Ok((nginx(dir, port)?, format!("http://127.0.0.1:{port}/1k.bin")))
            }
            Server::Go | Server::GoWhole | Server::GoUprobes | Server::GoNoUprobes => {
                Ok((go_hello(dir, port)?, format!("http://127.0.0.1:{port}/")))
            }
            Server::HaproxyH2c => {
                let list = dir.join("uris.txt");
                h2load_paths(&list, port)?;
                Ok((
                    haproxy_bind(dir, port, " proto h2")?,
                    list.display().to_string(),
                ))
            }
        }
    }

    /// Requests/s of one run of this server's load against `target` (a URL, or h2c's list).
    fn load(self, target: &str) -> Result<f64> {
        if self != Server::HaproxyH2c {
            return wrk_url(target);
        }
        let out = Command::new("h2load")
            .args([
                "-t1",
                &format!("-c{CONNECTIONS}"),
                "-m1",
                &format!("-D{SECONDS}"),
                "-i",
                target,
            ])
            .output()
            .context("running h2load (apt-get install nghttp2-client)")?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find_map(|l| l.strip_prefix("finished in "))
            .and_then(|l| l.split(", ").nth(1))
            .and_then(|v| v.strip_suffix(" req/s"))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("no req/s in h2load output:\n{text}"))
    }
}

fn nginx(dir: &Path, port: u16) -> Result<Killed> {
    let root = dir.join("nginx");
    let www = root.join("www");
    std::fs::create_dir_all(&www)?;
    std::fs::write(www.join("1k.bin"), vec![b'x'; 1024])?;
    let r = root.display();
    let conf = root.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\nerror_log {r}/error.log;\npid {r}/nginx.pid;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {r}/body;\n  proxy_temp_path {r}/proxy;\n  \
             fastcgi_temp_path {r}/fastcgi;\n  uwsgi_temp_path {r}/uwsgi;\n  scgi_temp_path {r}/scgi;\n  \
             keepalive_requests 1000000;\n  server {{ listen 127.0.0.1:{port}; root {r}/www; }}\n}}\n"
        ),
    )?;
    let n = Killed::spawn(
        Command::new("nginx")
            .arg("-c")
            .arg(&conf)
            .arg("-p")
            .arg(&root)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .context("starting nginx (apt-get install nginx)")?;
    wait_port(port)?;
    Ok(n)
}

fn go_hello(dir: &Path, port: u16) -> Result<Killed> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hello.go");
    let bin = dir.join("hello");
    let built = Command::new("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg(&src)
        .env("GOCACHE", dir.join("gocache"))
        .env("GO111MODULE", "off")
        .status()
        .context("running go build (apt-get install golang-go)")?;
    if !built.success() {
        bail!("go build {} failed", src.display());
    }
    let g = Killed::spawn(
        Command::new(&bin)
            .arg(format!("127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .context("starting the Go server")?;
    wait_port(port)?;
    Ok(g)
}

/// bpftrace with empty programs on the agent's tracepoints (and the libssl symbols for TLS).
fn floor(tls: bool) -> Result<Killed> {
    let tps =
        retry_agent::capture::tracepoints().context("reading the embedded object's tracepoints")?;
    if tps.is_empty() {
        bail!("the embedded eBPF object has no tracepoint programs");
    }
    let mut probes: Vec<String> = tps
        .iter()
        .map(|(c, n)| format!("tracepoint:{c}:{n}"))
        .collect();
    if tls {
        let lib = LIBSSL
            .iter()
            .find(|p| Path::new(p).exists())
            .context("no libssl.so.3 found")?;
        for s in SSL_SYMBOLS {
            probes.push(format!("uprobe:{lib}:{s}"));
            probes.push(format!("uretprobe:{lib}:{s}"));
        }
    }
    let script = format!("{} {{ }}", probes.join(",\n"));
    // bpftrace prints "Attaching N probes..." once it starts attaching them.
    let floor = spawn_until(
        Command::new("bpftrace")
            .arg("-e")
            .arg(&script)
            .stderr(Stdio::null()),
        Said::Stdout,
        "Attaching",
    )
    .context("bpftrace (apt-get install bpftrace)")?;
    // "Attaching" is printed as attaching starts; give it the moment attaching ~40 probes takes.
    thread::sleep(Duration::from_secs(2));
    Ok(floor)
}

struct Agent {
    proc: Killed,
    api_port: u16,
}

fn start_agent(bin: &Path, dir: &Path, args: &[&str]) -> Result<Agent> {
    let api_port = free_port()?;
    let state = dir.join("agent");
    std::fs::create_dir_all(&state)?;
    let mut cmd = Command::new(bin);
    cmd.arg("run")
        .args(["--api-addr", &format!("127.0.0.1:{api_port}")])
        .arg("--api-socket")
        .arg(state.join("api.sock"))
        .arg("--recorder-dump-dir")
        .arg(state.join("dumps"))
        .arg("--recorder-digest-key-file")
        .arg(state.join("digest.key"))
        .args(args)
        .stdout(Stdio::null());
    let proc = spawn_until(&mut cmd, Said::Stderr, "retry-agent running")
        .context("the agent (run the bench as root)")?;
    Ok(Agent { proc, api_port })
}

/// (VmRSS, VmHWM) of a process, in bytes.
fn rss(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (kb("VmRSS:"), kb("VmHWM:"))
}

/// One sample's value from the agent's /metrics (0 when absent).
fn metric(api_port: u16, name: &str) -> f64 {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", api_port)) else {
        return 0.0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// One round's figures: none, floor and agent side by side.
#[derive(Default)]
struct Round {
    none: f64,
    floor: f64,
    agent: f64,
    cpu_per_request_us: f64,
    ebpf_per_request_us: f64,
    rss_peak: u64,
    events: f64,
    drops: f64,
    /// eBPF time by program under the agent's load: (name, runs, ns), dearest first.
    programs: Vec<(String, u64, u64)>,
}

impl Round {
    fn floor_ratio(&self) -> f64 {
        ratio(self.floor, self.none)
    }
    fn agent_ratio(&self) -> f64 {
        ratio(self.agent, self.floor)
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// A row: its rounds (at least one).
struct Row {
    rounds: Vec<Round>,
}

impl Row {
    /// The median of one figure over the rounds.
    fn median(&self, f: impl Fn(&Round) -> f64) -> f64 {
        crate::rounds::median(self.rounds.iter().map(f))
    }

    /// A ratio's median and, over several rounds, its range.
    fn ratio_text(&self, f: impl Fn(&Round) -> f64) -> String {
        crate::rounds::ratio_text(&self.rounds.iter().map(f).collect::<Vec<_>>())
    }

    /// The round whose agent/floor is the median's (or nearest): its program breakdown.
    fn typical(&self) -> Option<&Round> {
        let m = self.median(Round::agent_ratio);
        self.rounds.iter().min_by(|a, b| {
            (a.agent_ratio() - m)
                .abs()
                .total_cmp(&(b.agent_ratio() - m).abs())
        })
    }
}

fn measure(server: Server, bin: &Path, dir: &Path, rounds: usize) -> Result<Row> {
    let (_server, url) = server.start(dir)?;
    // Warm-up: first connections, page cache, CPU frequency.
    let _ = server.load(&url)?;
    let mut row = Row { rounds: Vec::new() };
    for i in 0..rounds {
        if rounds > 1 {
            eprintln!("bench overhead: {}, round {}…", server.label(), i + 1);
        }
        row.rounds.push(round(server, &url, bin, dir)?);
    }
    Ok(row)
}

fn round(server: Server, url: &str, bin: &Path, dir: &Path) -> Result<Round> {
    let mut r = Round {
        none: server.load(url)?,
        ..Round::default()
    };
    let _stats = crate::bpf_stats::StatsOn::enable();
    {
        let _floor = floor(server.tls())?;
        r.floor = server.load(url)?;
    }
    let agent = start_agent(bin, dir, &server.agent_args())?;
    let pid = agent.proc.0.id();
    // Let the start-up scans (/proc, Go executables) settle before the load.
    thread::sleep(Duration::from_secs(2));
    let (cpu0, progs0) = (cpu_seconds(pid), crate::bpf_stats::programs(pid));
    r.agent = server.load(url)?;
    let (cpu1, progs1) = (cpu_seconds(pid), crate::bpf_stats::programs(pid));
    r.programs = crate::bpf_stats::delta(&progs0, &progs1);
    // Figures are published once a second.
    thread::sleep(Duration::from_millis(1500));
    r.rss_peak = rss(pid).1;
    r.events = metric(agent.api_port, "retry_agent_capture_events_total");
    r.drops = metric(agent.api_port, "retry_agent_capture_drops_total");
    let requests = r.agent * SECONDS as f64;
    r.cpu_per_request_us = (cpu1 - cpu0) * 1e6 / requests.max(1.0);
    let bpf_ns: u64 = r.programs.iter().map(|p| p.2).sum();
    r.ebpf_per_request_us = bpf_ns as f64 / 1e3 / requests.max(1.0);
    Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .context("signalling the agent")?;
    drop(agent);
    Ok(r)
}

/// `rows`: the rows to measure (empty: all); `rounds`: how many times each (at least one).
pub fn run(bin: &Path, rows_wanted: &[Server], rounds: usize) -> Result<()> {
    if !crate::is_root() {
        bail!("bench overhead loads eBPF programs: run as root");
    }
    let dir: PathBuf = std::env::temp_dir().join(format!("raover-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut rows = Vec::new();
    let servers = Server::ALL.into_iter().filter(|s| {
        if rows_wanted.is_empty() {
            Server::DEFAULT.contains(s)
        } else {
            rows_wanted.contains(s)
        }
    });
    for server in servers {
        eprintln!("bench overhead: {}…", server.label());
        match measure(server, bin, &dir, rounds) {
            Ok(r) => rows.push((server, r)),
            Err(e) => eprintln!("bench overhead: {} skipped: {e:#}", server.label()),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "bench overhead: wrk -t1 -c{CONNECTIONS} -d{SECONDS}s keep-alive on loopback (h2c: h2load -t1 -c{CONNECTIONS} -m1 -D{SECONDS}); floor = bpftrace, empty programs on the agent's {} tracepoints (+ libssl uprobes for TLS); agent = `retry-agent run` defaults; {}",
        retry_agent::capture::tracepoints()
            .map(|t| t.len())
            .unwrap_or(0),
        if rounds > 1 {
            format!(
                "median of {rounds} rounds (none → floor → agent in each), ratios per round: median (range)"
            )
        } else {
            "one round".to_string()
        }
    );
    println!();
    println!(
        "| server | none req/s | floor | agent | floor/none | agent/floor | agent CPU per request | eBPF per request | agent RSS (peak) | events per request | capture drops |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (s, r) in &rows {
        let events = r.median(|x| x.events / (x.agent * SECONDS as f64).max(1.0));
        let rss_peak = r.rounds.iter().map(|x| x.rss_peak).max().unwrap_or(0);
        let drops: f64 = r.rounds.iter().map(|x| x.drops).sum();
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {} | {} | {:.1} µs | {:.2} µs | {:.0} MiB | {:.1} | {:.0} |",
            s.label(),
            r.median(|x| x.none),
            r.median(|x| x.floor),
            r.median(|x| x.agent),
            r.ratio_text(Round::floor_ratio),
            r.ratio_text(Round::agent_ratio),
            r.median(|x| x.cpu_per_request_us),
            r.median(|x| x.ebpf_per_request_us),
            rss_peak as f64 / (1 << 20) as f64,
            events,
            drops
        );
    }
    if rows.is_empty() {
        bail!("no server could be measured");
    }
    // Where the eBPF time goes (kernel.bpf_stats_enabled): the programs that take most of it.
    println!();
    println!("eBPF time by program under the agent's load (runs per request × ns per run):");
    for (s, r) in &rows {
        let Some(r) = r.typical() else { continue };
        let requests = (r.agent * SECONDS as f64).max(1.0);
        let top: Vec<String> = r
            .programs
            .iter()
            .take(4)
            .map(|(name, runs, ns)| {
                format!(
                    "{name} {:.2} × {:.0} ns",
                    *runs as f64 / requests,
                    *ns as f64 / (*runs).max(1) as f64
                )
            })
            .collect();
        println!("- {}: {}", s.label(), top.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(none: f64, floor: f64, agent: f64) -> Round {
        Round {
            none,
            floor,
            agent,
            ..Round::default()
        }
    }

    #[test]
    fn rounds_give_medians_of_figures_and_of_their_own_ratios() {
        // The second round's floor was hit by a neighbour: its agent/floor (1.5) is not read as
        // the row's, and the median of the ratios is not the ratio of the medians.
        let row = Row {
            rounds: vec![
                round(100.0, 95.0, 57.0),
                round(100.0, 40.0, 60.0),
                round(90.0, 90.0, 54.0),
            ],
        };
        assert_eq!(row.median(|r| r.none), 100.0);
        assert_eq!(row.median(Round::agent_ratio), 0.6);
        assert_eq!(row.ratio_text(Round::agent_ratio), "0.60 (0.60–1.50)");
        assert_eq!(row.typical().map(|r| r.floor), Some(95.0));
        let two = Row {
            rounds: vec![round(100.0, 80.0, 40.0), round(100.0, 100.0, 60.0)],
        };
        assert_eq!(two.median(|r| r.floor), 90.0);
        let one = Row {
            rounds: vec![round(100.0, 0.0, 60.0)],
        };
        // A floor that measured nothing gives no ratio, and one round no range.
        assert_eq!(one.ratio_text(Round::agent_ratio), "0.00");
    }
}
