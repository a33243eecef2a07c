//! The one set of fixtures every kernel test uses: whether the test can run here, loading the
//! capture in-process and collecting its events, fresh ports, peer programs (the Python and Node
//! files under `tests/fixtures/`, parameterised by argv) started and waited for, child processes
//! and network namespaces that clean up after themselves.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use std::{
    collections::HashSet,
    net::TcpListener,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use retry_agent::capture::{
    Capture, CaptureConfig, CaptureError, ConnEvent, DataEvent, Event, GapReason, GoMode,
};

/// Whether the capture tests can run here; prints why not.
pub fn can_run() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc_geteuid() } != 0 {
        eprintln!("skip: capture tests need root");
        return false;
    }
    if retry_agent::capture::EBPF_OBJECT.is_empty() {
        eprintln!("skip: no embedded eBPF object (cargo xtask build-ebpf)");
        return false;
    }
    if !std::path::Path::new("/sys/kernel/tracing/events/syscalls").exists() {
        eprintln!("skip: syscall tracepoints unavailable");
        return false;
    }
    true
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

/// Loads the capture; `None` (with the reason printed) when the kernel refuses in a way that means
/// "feature missing here" rather than a bug.
/// The Go uprobes are on whatever a uprobe costs on the machine (`--capture-go true`): the tests
/// check what they link, not whether `auto` would keep them.
pub fn load() -> Option<Capture> {
    load_with(&CaptureConfig {
        go: GoMode::On,
        ..CaptureConfig::default()
    })
}

/// `load` with every exchange read whole (`--capture-summarize false`): for tests of the data
/// path itself (records, their bytes, framing), which quiet exchanges would otherwise skip.
pub fn load_whole() -> Option<Capture> {
    load_with(&CaptureConfig {
        go: GoMode::On,
        summarize: false,
        ..CaptureConfig::default()
    })
}

/// `load` with every quiet exchange summarised, none sampled whole and each sent: tests of the
/// summaries themselves, deterministic whatever the default sampling.
pub fn load_summarizing() -> Option<Capture> {
    load_with(&CaptureConfig {
        go: GoMode::On,
        summarize: true,
        summary_sample: 0,
        summary_every: 1,
        ..CaptureConfig::default()
    })
}

/// `load` with every quiet exchange summarised, none sampled whole, and one in `every` sent,
/// counted within `window_ms` of its connection's last record: tests of counting.
pub fn load_counting(every: u16, window_ms: u64) -> Option<Capture> {
    load_with(&CaptureConfig {
        summarize: true,
        summary_sample: 0,
        summary_every: every,
        summary_window_ms: window_ms,
        ..CaptureConfig::default()
    })
}

/// `load` with explicit settings. Every program the kernel has a tracepoint for must load: the
/// capture would run without one the kernel refused (`Capture::gaps`), and a test suite that
/// let it would not notice a program grown past what this kernel's verifier or JIT takes.
pub fn load_with(cfg: &CaptureConfig) -> Option<Capture> {
    match Capture::load(cfg) {
        Ok(c) => {
            let refused: Vec<_> = c
                .gaps()
                .iter()
                .filter(|g| g.reason != GapReason::NoTracepoint)
                .collect();
            assert!(
                refused.is_empty(),
                "programs the kernel refused: {refused:#?}"
            );
            Some(c)
        }
        Err(
            e @ (CaptureError::MissingCapability(_)
            | CaptureError::TracefsNotMounted
            | CaptureError::KernelTooOld(_)),
        ) => {
            eprintln!("skip: {e}");
            None
        }
        Err(e) => panic!("capture failed to load: {e:?}\n{e}"),
    }
}

/// Drains events for `dur` (or until `done` says enough), keeping those `keep` selects.
pub async fn collect(
    cap: &mut Capture,
    dur: Duration,
    mut keep: impl FnMut(&Event) -> bool,
    mut done: impl FnMut(&[Event]) -> bool,
) -> Vec<Event> {
    let deadline = tokio::time::Instant::now() + dur;
    let mut out = Vec::new();
    while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, cap.events().recv()).await {
        if keep(&ev) {
            out.push(ev);
            if done(&out) {
                break;
            }
        }
    }
    out
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

/// A child process killed (and reaped) on drop; its stdout is read through one buffered reader
/// (one per line would drop whatever the previous read had buffered).
pub struct Proc(
    pub Child,
    Option<std::io::BufReader<std::process::ChildStdout>>,
);

impl Proc {
    pub fn spawn(cmd: &mut Command) -> Proc {
        let child = cmd
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
        Proc(child, None)
    }
    pub fn from_child(child: Child) -> Proc {
        Proc(child, None)
    }
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
    /// One line of its stdout (spawned with `Stdio::piped()`); empty at EOF.
    pub fn read_line(&mut self) -> String {
        use std::io::BufRead;
        let mut line = String::new();
        if self.1.is_none() {
            self.1 = self.0.stdout.take().map(std::io::BufReader::new);
        }
        if let Some(r) = self.1.as_mut() {
            let _ = r.read_line(&mut line);
        }
        line
    }
    /// Every line of its stdout that it has not been read yet, trimmed, until it exits (or was
    /// killed).
    pub fn output_lines(&mut self) -> Vec<String> {
        use std::io::BufRead;
        if self.1.is_none() {
            self.1 = self.0.stdout.take().map(std::io::BufReader::new);
        }
        let Some(r) = self.1.as_mut() else {
            return Vec::new();
        };
        r.lines()
            .map_while(Result::ok)
            .map(|l| l.trim().to_string())
            .collect()
    }
    /// Kills it (it keeps its stdout, so what it printed can still be read).
    pub fn kill(&mut self) {
        let _ = self.0.kill();
    }
    /// Waits for it to exit by itself; panics after `limit`.
    pub fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Ok(Some(st)) = self.0.try_wait() {
                return st;
            }
            assert!(
                start.elapsed() < limit,
                "process {} did not finish in {limit:?}",
                self.pid()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A peer program under `tests/fixtures/`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures")).join(name)
}

/// Runs the Python fixture `name` (`python3 -u tests/fixtures/<name>`), with args.
pub fn python(name: &str, args: &[&str]) -> Command {
    let mut c = Command::new("python3");
    c.arg("-u").arg(fixture(name)).args(args);
    c
}

/// Runs the Node fixture `name` (`node tests/fixtures/<name>`), with args.
pub fn node(name: &str, args: &[&str]) -> Command {
    let mut c = Command::new("node");
    c.arg(fixture(name)).args(args);
    c
}

/// How a server fixture says it is ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ready {
    /// Probed with a connection (from the test process, which the capture ignores).
    Listening,
    /// It prints `ready` on stdout (a server that accepts once must not be probed).
    SaysReady,
}

/// Starts a server fixture on a fresh loopback port, passed as its first argument before
/// `extra`, with stdout piped (servers that log their requests are read with `output_lines`);
/// returns once it is ready.
pub fn serve(
    program: fn(&str, &[&str]) -> Command,
    name: &str,
    extra: &[&str],
    ready: Ready,
) -> (Proc, u16) {
    let port = free_port();
    let ps = port.to_string();
    let mut args = vec![ps.as_str()];
    args.extend_from_slice(extra);
    let mut server = Proc::spawn(program(name, &args).stdout(Stdio::piped()));
    match ready {
        Ready::Listening => wait_listening(&format!("127.0.0.1:{port}"), None),
        Ready::SaysReady => assert_eq!(server.read_line().trim(), "ready", "{name} did not start"),
    }
    (server, port)
}

/// A Python server fixture, listening on a fresh loopback port.
pub fn python_server(name: &str, extra: &[&str]) -> (Proc, u16) {
    serve(python, name, extra, Ready::Listening)
}

/// Whether `tool arg` runs here; says so when not.
pub fn have(tool: &str, arg: &str) -> bool {
    let ok = Command::new(tool)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skip part: {tool} not available");
    }
    ok
}

/// Keeps the events of these processes.
pub fn involving(pids: &[u32]) -> impl FnMut(&Event) -> bool + use<> {
    let pids: HashSet<u32> = pids.iter().copied().collect();
    move |e| pids.contains(&e.pid())
}

/// The data records of `evs`, and those a kernel summary stands for (its request, with its
/// line as payload, then its response, without bytes): every I/O the capture reported.
pub fn io_events(evs: &[Event]) -> Vec<&DataEvent> {
    let mut out = Vec::new();
    for e in evs {
        match e {
            Event::Data(d) => out.push(d),
            Event::Summary(s) => out.extend([&s.request, &s.response]),
            _ => {}
        }
    }
    out
}

pub fn data_events(evs: &[Event]) -> Vec<&DataEvent> {
    evs.iter()
        .filter_map(|e| {
            if let Event::Data(d) = e {
                Some(d)
            } else {
                None
            }
        })
        .collect()
}

pub fn conn_events(evs: &[Event]) -> Vec<&ConnEvent> {
    evs.iter()
        .filter_map(|e| {
            if let Event::Conn(c) = e {
                Some(c)
            } else {
                None
            }
        })
        .collect()
}

/// The events as JSON lines, for failure messages.
pub fn dump(evs: &[Event]) -> String {
    evs.iter()
        .map(|e| serde_json::to_string(e).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// HAProxy answering itself on 127.0.0.1:`port` (`bind` added to its bind line, e.g.
/// ` proto h2`), with `rules` (`http-request …` lines) before its default 200: its config
/// written to `cfg`, listening when this returns, killed when dropped.
pub fn haproxy_answering(cfg: &std::path::Path, port: u16, bind: &str, rules: &[&str]) -> Proc {
    let mut text = format!(
        "global\n  nbthread 1\ndefaults\n  mode http\n  timeout client 30s\n  timeout server 30s\n  timeout connect 5s\n\
         frontend f\n  bind 127.0.0.1:{port}{bind}\n"
    );
    for r in rules {
        text.push_str(&format!("  {r}\n"));
    }
    text.push_str("  http-request return status 200 content-type text/plain string ok\n");
    std::fs::write(cfg, text).unwrap_or_else(|e| panic!("writing {}: {e}", cfg.display()));
    let p = Proc::spawn(
        Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(cfg)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    wait_listening(&format!("127.0.0.1:{port}"), None);
    p
}

/// Waits until something accepts TCP connections at `addr` (probing from the test process, which
/// the capture ignores as the agent's own pid), optionally inside a netns. The limit only bounds
/// a broken start: an agent's programs can spend 20 s in the verifier on a loaded 2-core box.
pub fn wait_listening(addr: &str, netns: Option<&str>) {
    let start = Instant::now();
    loop {
        let ok = match netns {
            None => std::net::TcpStream::connect_timeout(
                &addr.parse().expect("addr"),
                Duration::from_millis(200),
            )
            .is_ok(),
            Some(ns) => {
                // Probe with bash's /dev/tcp inside the namespace: a separate short-lived process.
                let (host, port) = addr.rsplit_once(':').expect("host:port");
                // bash takes an IPv6 address without its brackets.
                let host = host.trim_start_matches('[').trim_end_matches(']');
                Command::new("ip")
                    .args([
                        "netns",
                        "exec",
                        ns,
                        "bash",
                        "-c",
                        &format!("exec 3<>/dev/tcp/{host}/{port}"),
                    ])
                    .stderr(Stdio::null())
                    .status()
                    .map(|s| s.success())
                    .unwrap_or(false)
            }
        };
        if ok {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "nothing listening at {addr}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Two network namespaces joined by a veth pair: `a` has `ip_a`, `b` has `ip_b` (/24).
/// Everything is removed on drop, also when the test panics.
pub struct NetnsPair {
    pub a: String,
    pub b: String,
    pub ip_a: String,
    pub ip_b: String,
    /// The veth ends, in `a` and in `b`.
    pub veth_a: String,
    pub veth_b: String,
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

impl NetnsPair {
    /// `None` (printing why) when namespaces or veth cannot be made here.
    pub fn create(tag: &str, subnet: u8) -> Option<NetnsPair> {
        let p = NetnsPair {
            a: format!("racap{tag}a"),
            b: format!("racap{tag}b"),
            ip_a: format!("10.213.{subnet}.1"),
            ip_b: format!("10.213.{subnet}.2"),
            veth_a: format!("racap{tag}va"),
            veth_b: format!("racap{tag}vb"),
        };
        // Leftovers of an earlier crashed run.
        let _ = ip(&["netns", "del", &p.a]);
        let _ = ip(&["netns", "del", &p.b]);
        let va = p.veth_a.clone();
        let vb = p.veth_b.clone();
        let steps: Vec<Vec<String>> = vec![
            vec!["netns".into(), "add".into(), p.a.clone()],
            vec!["netns".into(), "add".into(), p.b.clone()],
            vec![
                "link".into(),
                "add".into(),
                va.clone(),
                "type".into(),
                "veth".into(),
                "peer".into(),
                "name".into(),
                vb.clone(),
            ],
            vec![
                "link".into(),
                "set".into(),
                va.clone(),
                "netns".into(),
                p.a.clone(),
            ],
            vec![
                "link".into(),
                "set".into(),
                vb.clone(),
                "netns".into(),
                p.b.clone(),
            ],
            vec![
                "-n".into(),
                p.a.clone(),
                "addr".into(),
                "add".into(),
                format!("{}/24", p.ip_a),
                "dev".into(),
                va.clone(),
            ],
            vec![
                "-n".into(),
                p.b.clone(),
                "addr".into(),
                "add".into(),
                format!("{}/24", p.ip_b),
                "dev".into(),
                vb.clone(),
            ],
            vec![
                "-n".into(),
                p.a.clone(),
                "link".into(),
                "set".into(),
                va.clone(),
                "up".into(),
            ],
            vec![
                "-n".into(),
                p.b.clone(),
                "link".into(),
                "set".into(),
                vb.clone(),
                "up".into(),
            ],
            vec![
                "-n".into(),
                p.a.clone(),
                "link".into(),
                "set".into(),
                "lo".into(),
                "up".into(),
            ],
            vec![
                "-n".into(),
                p.b.clone(),
                "link".into(),
                "set".into(),
                "lo".into(),
                "up".into(),
            ],
        ];
        for s in steps {
            let args: Vec<&str> = s.iter().map(String::as_str).collect();
            if !ip(&args) {
                eprintln!(
                    "skip: `ip {}` failed (no netns/veth support?)",
                    args.join(" ")
                );
                // Drop cleans up whatever was made.
                return None;
            }
        }
        Some(p)
    }

    /// IPv6 on the veth pair too: `fd00:13:<subnet>::1` in `a`, `::2` in `b` (/64, `nodad` so
    /// they are usable at once). `None` (printing why) where IPv6 is off.
    pub fn add_ipv6(&self, subnet: u8) -> Option<(std::net::Ipv6Addr, std::net::Ipv6Addr)> {
        let a: std::net::Ipv6Addr = format!("fd00:13:{subnet:x}::1").parse().ok()?;
        let b: std::net::Ipv6Addr = format!("fd00:13:{subnet:x}::2").parse().ok()?;
        for (ns, dev, addr) in [(&self.a, &self.veth_a, a), (&self.b, &self.veth_b, b)] {
            let cidr = format!("{addr}/64");
            if !ip(&["-n", ns, "addr", "add", &cidr, "dev", dev, "nodad"]) {
                eprintln!("skip: cannot add {cidr} in {ns} (IPv6 disabled?)");
                return None;
            }
        }
        Some((a, b))
    }

    /// A command run inside namespace `ns`.
    pub fn exec(ns: &str, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, program]);
        c
    }

    /// The Python fixture `name` run inside namespace `ns`.
    pub fn python(ns: &str, name: &str, args: &[&str]) -> Command {
        let mut c = Self::exec(ns, "python3");
        c.arg("-u").arg(fixture(name)).args(args);
        c
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        // Deleting a namespace removes its end of the veth, which removes the pair.
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}
