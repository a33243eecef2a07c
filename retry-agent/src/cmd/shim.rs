//! `retry-agent shim`: the transparent proxy, steered by iptables (default) or by cgroup eBPF
//! programs (`--shim-steer cgroup`, see `actuate::shim::cgroup`).
//!
//! Lifecycle: bind the listeners, start following the agent's control socket, then install the
//! steering rules (only once something listens, so nothing is redirected into the void). On
//! SIGTERM/SIGINT/SIGHUP the rules are removed before exit.
//!
//! Dead shim (SIGKILL, crash): a watchdog process (`--watchdog`, on by default; the shim spawns
//! `retry-agent shim --cleanup --watch-pid <shim pid>`) waits on a pidfd for the shim to die and
//! removes the rules, so new connections go direct within milliseconds; connections the shim was
//! carrying die with it (reset). If the watchdog is also gone, the supervisor runs
//! `retry-agent shim --cleanup` (e.g. systemd `ExecStopPost=`), which is idempotent; a restarted
//! shim re-installs without duplicating rules. A pid file (`/run/retry-agent/shim-<chain>.pid`)
//! keeps a late watchdog from removing the rules of a newer shim.
//!
//! With `--shim-steer cgroup` there are no rules, pid file or watchdog: the programs' links are
//! the shim's file descriptors, so the kernel detaches them however the shim dies (also with
//! its cgroup killed, which takes a watchdog along).
//!
//! Dead agent: the shim keeps forwarding; what it was told expires by TTL (fail open).
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::Context as _;
use clap::Args;

use crate::actuate::{
    DEFAULT_CONTROL_SOCKET,
    control::{self, ControlView},
    shim::{bind_reuseport, cgroup, iptables, policy, proxy, spawn_io_thread},
};
use crate::settings::{InvalidConfig, MemoryBudget, Settings};

fn parse_mark(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("bad mark {s:?}: {e}"))
}

/// How connections are steered into the shim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SteerMode {
    /// nat REDIRECT rules (outbound and inbound), removed by the shim or its watchdog.
    Iptables,
    /// eBPF programs on `--shim-steer-cgroup` (outbound) and, for `--shim-inbound-port`, on the
    /// shim's network namespace (IPv4 and, with `--shim-ipv6`, IPv6 inbound), detached by the
    /// kernel when the shim dies however it dies.
    Cgroup,
}

/// `retry-agent shim` settings (`--shim-*`, except the `--cleanup` mode).
#[derive(Debug, Args, Clone)]
pub struct ShimArgs {
    /// Port the shim listens on (all addresses, IPv4 and IPv6); steering redirects here.
    #[arg(
        long = "shim-port",
        alias = "port",
        env = "RETRY_AGENT_SHIM_PORT",
        default_value_t = 15001
    )]
    pub port: u16,
    /// Address to listen on for IPv4 (REDIRECT from PREROUTING needs the interface address).
    #[arg(
        long = "shim-listen",
        alias = "listen",
        env = "RETRY_AGENT_SHIM_LISTEN",
        default_value = "0.0.0.0"
    )]
    pub listen: std::net::IpAddr,
    /// Also listen on [::] and steer IPv6 (when ip6tables nat is available).
    #[arg(long = "shim-ipv6", alias = "ipv6", env = "RETRY_AGENT_SHIM_IPV6", default_value_t = true, action = clap::ArgAction::Set)]
    pub ipv6: bool,
    /// Agent control socket to follow.
    #[arg(long = "shim-control-socket", alias = "control-socket", env = "RETRY_AGENT_SHIM_CONTROL_SOCKET", default_value = DEFAULT_CONTROL_SOCKET)]
    pub control_socket: PathBuf,
    /// nat chain name (the inbound chain gets `_IN` appended).
    #[arg(
        long = "shim-chain",
        alias = "chain",
        env = "RETRY_AGENT_SHIM_CHAIN",
        default_value = "RETRY_SHIM"
    )]
    pub chain: String,
    /// SO_MARK on the shim's upstream connections; the chain lets marked packets through.
    #[arg(long = "shim-mark", alias = "mark", env = "RETRY_AGENT_SHIM_MARK", default_value = "0x52a0", value_parser = parse_mark)]
    pub mark: u32,
    /// How connections reach the shim: `iptables` (REDIRECT rules) or `cgroup` (eBPF programs on
    /// `--shim-steer-cgroup` that the kernel removes when the shim dies: fail open even when the
    /// shim and its watchdog die together).
    #[arg(
        long = "shim-steer",
        alias = "steer",
        env = "RETRY_AGENT_SHIM_STEER",
        value_enum,
        default_value_t = SteerMode::Iptables
    )]
    pub steer: SteerMode,
    /// With `--shim-steer cgroup`: steer outbound TCP connects of processes in this cgroup v2
    /// directory, a filesystem path such as /sys/fs/cgroup/kubepods.slice/… (repeatable).
    #[arg(
        long = "shim-steer-cgroup",
        alias = "steer-cgroup",
        env = "RETRY_AGENT_SHIM_STEER_CGROUP",
        value_delimiter = ','
    )]
    pub steer_cgroups: Vec<PathBuf>,
    /// Steer outbound connections of this uid (repeatable).
    #[arg(
        long = "shim-uid",
        alias = "uid",
        env = "RETRY_AGENT_SHIM_UID",
        value_delimiter = ','
    )]
    pub uids: Vec<u32>,
    /// Steer outbound connections from this cgroup v2 path (repeatable).
    #[arg(
        long = "shim-cgroup",
        alias = "cgroup",
        env = "RETRY_AGENT_SHIM_CGROUP",
        value_delimiter = ','
    )]
    pub cgroups: Vec<String>,
    /// Steer outbound connections to this destination port (repeatable).
    #[arg(
        long = "shim-dport",
        alias = "dport",
        env = "RETRY_AGENT_SHIM_DPORT",
        value_delimiter = ','
    )]
    pub dports: Vec<u16>,
    /// Steer inbound connections (PREROUTING) to this local port (repeatable).
    #[arg(
        long = "shim-inbound-port",
        alias = "inbound-port",
        env = "RETRY_AGENT_SHIM_INBOUND_PORT",
        value_delimiter = ','
    )]
    pub inbound_ports: Vec<u16>,
    /// With iptables steering, steer inbound connections only when their destination is in this
    /// block (repeatable; this node's pod CIDRs, e.g. from the node's `spec.podCIDRs`), so
    /// traffic the node only routes elsewhere is never proxied. Default: any destination.
    #[arg(
        long = "shim-inbound-dst",
        env = "RETRY_AGENT_SHIM_INBOUND_DST",
        value_delimiter = ','
    )]
    pub inbound_dsts: Vec<iptables::Cidr>,
    /// Do not touch iptables (steering is managed elsewhere).
    #[arg(
        long = "shim-no-iptables",
        alias = "no-iptables",
        env = "RETRY_AGENT_SHIM_NO_IPTABLES"
    )]
    pub no_iptables: bool,
    /// Spawn a watchdog process that removes the rules if the shim dies without cleaning up.
    #[arg(long = "shim-watchdog", alias = "watchdog", env = "RETRY_AGENT_SHIM_WATCHDOG", default_value_t = true, action = clap::ArgAction::Set)]
    pub watchdog: bool,
    /// Remove leftover rules of `--shim-chain` and exit.
    #[arg(long)]
    pub cleanup: bool,
    /// With --cleanup: first wait for this pid to exit (the watchdog mode).
    #[arg(long, requires = "cleanup", hide = true)]
    pub watch_pid: Option<i32>,
    /// A failed request repeated within this window counts as a retry.
    #[arg(
        long = "shim-retry-window-ms",
        alias = "retry-window-ms",
        env = "RETRY_AGENT_SHIM_RETRY_WINDOW_MS",
        default_value_t = 10_000
    )]
    pub retry_window_ms: u64,
    /// Per-client retry budget: retries allowed per request (e.g. 0.1). Off unless set.
    #[arg(
        long = "shim-retry-budget",
        alias = "retry-budget",
        env = "RETRY_AGENT_SHIM_RETRY_BUDGET"
    )]
    pub retry_budget: Option<f64>,
    /// Retries each client may make over the budget's 10 s window whatever its volume (a
    /// low-volume client's transient faults cross a ratio by chance).
    #[arg(
        long = "shim-retry-budget-min",
        env = "RETRY_AGENT_SHIM_RETRY_BUDGET_MIN",
        default_value_t = policy::DEFAULT_BUDGET_MIN_RETRIES
    )]
    pub retry_budget_min: f64,
    /// Client-side adaptive throttling of retries with this K (e.g. 2). Off unless set.
    #[arg(
        long = "shim-throttle-k",
        alias = "throttle-k",
        env = "RETRY_AGENT_SHIM_THROTTLE_K"
    )]
    pub throttle_k: Option<f64>,
    /// How long to wait for a client's first bytes before treating the stream as opaque.
    #[arg(
        long = "shim-detect-timeout-ms",
        alias = "detect-timeout-ms",
        env = "RETRY_AGENT_SHIM_DETECT_TIMEOUT_MS",
        default_value_t = 300
    )]
    pub detect_timeout_ms: u64,
    /// Accepted for configurations that set it, and without effect: the shim relays HTTP/1
    /// heads as each side wrote them, so header names always keep their case.
    #[arg(
        hide = true,
        long = "shim-preserve-header-case",
        env = "RETRY_AGENT_SHIM_PRESERVE_HEADER_CASE",
        default_value_t = false,
        action = clap::ArgAction::Set
    )]
    pub preserve_header_case: bool,
    /// h2c to the callee: `shared` terminates HTTP/2 and multiplexes the streams onto pooled
    /// upstream connections, one per `--shim-h2-pool-callers` callers per destination and io
    /// thread, as HAProxy's `http-reuse always` and Envoy do (HAProxy's latency at less CPU;
    /// behind a Service VIP, where a pod is picked per connection, a node's calls reach fewer
    /// pods); `own` relays each client connection's frames over an upstream connection of its
    /// own (the callee sees its callers' connections and settings).
    #[arg(
        long = "shim-h2-upstream",
        env = "RETRY_AGENT_SHIM_H2_UPSTREAM",
        value_enum,
        default_value_t = proxy::H2Upstream::Shared
    )]
    pub h2_upstream: proxy::H2Upstream,
    /// `--shim-h2-upstream shared`: client connections one pooled upstream connection carries
    /// before the next client gets a new one (fewer: a VIP's calls reach more pods; more: the
    /// callee serves fewer, busier connections).
    #[arg(
        long = "shim-h2-pool-callers",
        env = "RETRY_AGENT_SHIM_H2_POOL_CALLERS",
        default_value_t = proxy::H2Pool::default().callers_per_conn
    )]
    pub h2_pool_callers: usize,
    /// `--shim-h2-upstream shared`: a pooled upstream connection no client used for this long
    /// is closed (as HAProxy's `pool-purge-delay`).
    #[arg(
        long = "shim-h2-pool-idle-ms",
        env = "RETRY_AGENT_SHIM_H2_POOL_IDLE_MS",
        default_value_t = proxy::H2Pool::default().idle.as_millis() as u64
    )]
    pub h2_pool_idle_ms: u64,
    /// Upstream connect timeout.
    #[arg(
        long = "shim-connect-timeout-ms",
        alias = "connect-timeout-ms",
        env = "RETRY_AGENT_SHIM_CONNECT_TIMEOUT_MS",
        default_value_t = 10_000
    )]
    pub connect_timeout_ms: u64,
    /// IO threads (each with its own listener and runtime); default: one per CPU.
    #[arg(
        long = "shim-threads",
        alias = "threads",
        env = "RETRY_AGENT_SHIM_THREADS"
    )]
    pub threads: Option<usize>,
    /// Directory for the ownership pid file.
    #[arg(
        long = "shim-run-dir",
        alias = "run-dir",
        env = "RETRY_AGENT_SHIM_RUN_DIR",
        default_value = "/run/retry-agent"
    )]
    pub run_dir: PathBuf,
    /// Memory for remembered failures and per-client counters, in MiB (half each; beyond it the
    /// shim forgets, failing open, and counts it). Default: derived from --memory-budget-mib.
    #[arg(
        long = "shim-cache-mib",
        env = "RETRY_AGENT_SHIM_CACHE_MIB",
        default_value_t = 16
    )]
    pub cache_mib: u64,
    #[command(flatten)]
    pub budget: MemoryBudget,
}

/// Derives `--shim-cache-mib` from the budget unless `given` says it was set.
pub fn apply_budget(args: &mut ShimArgs, given: impl Fn(&str) -> bool) {
    if !given("shim-cache-mib") {
        args.cache_mib = (super::budget::shim_cache_bytes(args.budget) >> 20).max(1);
    }
}

impl ShimArgs {
    pub fn steering(&self) -> iptables::Steering {
        iptables::Steering {
            chain: self.chain.clone(),
            listen_port: self.port,
            mark: self.mark,
            uids: self.uids.clone(),
            cgroups: self.cgroups.clone(),
            dports: self.dports.clone(),
            inbound_ports: self.inbound_ports.clone(),
            inbound_dsts: self.inbound_dsts.clone(),
        }
    }

    pub fn cgroup_steering(&self, ipv6: bool) -> cgroup::CgroupSteering {
        cgroup::CgroupSteering {
            cgroups: self.steer_cgroups.clone(),
            shim_port: self.port,
            mark: self.mark,
            dports: self.dports.clone(),
            ipv6,
            inbound_ports: self.inbound_ports.clone(),
        }
    }

    /// Whether this shim installs iptables rules (and so owes their removal).
    fn uses_iptables(&self) -> bool {
        self.steer == SteerMode::Iptables && !self.no_iptables
    }

    fn pid_file(&self) -> PathBuf {
        self.run_dir.join(format!("shim-{}.pid", self.chain))
    }
}

impl Default for ShimArgs {
    fn default() -> Self {
        crate::settings::defaults()
    }
}

impl Settings for ShimArgs {
    fn check(&self, p: &mut InvalidConfig) {
        let chain = &self.chain;
        p.check(
            iptables::valid_chain(chain),
            "shim-chain",
            chain,
            "1-24 characters of [A-Za-z0-9_-]",
        );
        if self.cleanup {
            return;
        }
        let steers = self.uses_iptables();
        let selectors =
            self.uids.len() + self.cgroups.len() + self.dports.len() + self.inbound_ports.len();
        let what =
            "set, or one of --shim-uid, --shim-cgroup, --shim-inbound-port, to say what to steer";
        p.check(!steers || selectors > 0, "shim-dport", "unset", what);
        let dsts = || {
            self.inbound_dsts
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        p.check(
            self.inbound_dsts.is_empty() || !self.inbound_ports.is_empty(),
            "shim-inbound-dst",
            dsts(),
            "only with --shim-inbound-port (it limits inbound steering)",
        );
        p.check(
            self.inbound_dsts.is_empty() || self.steer == SteerMode::Iptables,
            "shim-inbound-dst",
            dsts(),
            "only with --shim-steer iptables (cgroup steering takes only local arrivals already)",
        );
        p.check(
            self.h2_pool_callers > 0,
            "shim-h2-pool-callers",
            self.h2_pool_callers,
            "at least 1",
        );
        p.check(
            self.h2_pool_idle_ms > 0,
            "shim-h2-pool-idle-ms",
            self.h2_pool_idle_ms,
            "at least 1",
        );
        if self.steer == SteerMode::Cgroup {
            let n = self.steer_cgroups.len() + self.inbound_ports.len();
            p.check(
                n > 0,
                "shim-steer-cgroup",
                "unset",
                "at least one cgroup v2 directory (or --shim-inbound-port) with --shim-steer cgroup",
            );
            let unsupported = "unset with --shim-steer cgroup (iptables selectors; select by --shim-steer-cgroup and --shim-dport)";
            p.check(
                self.uids.is_empty(),
                "shim-uid",
                format!("{:?}", self.uids),
                unsupported,
            );
            p.check(
                self.cgroups.is_empty(),
                "shim-cgroup",
                format!("{:?}", self.cgroups),
                unsupported,
            );
            // Connects are rewritten to loopback: the listener must be reachable there.
            let l = self.listen;
            p.check(
                l.is_unspecified() || l.is_loopback(),
                "shim-listen",
                l,
                "0.0.0.0 or 127.0.0.1 with --shim-steer cgroup",
            );
        } else {
            p.check(
                self.steer_cgroups.is_empty(),
                "shim-steer-cgroup",
                format!("{:?}", self.steer_cgroups),
                "only with --shim-steer cgroup",
            );
        }
        crate::actuate::check_socket_path(p, "shim-control-socket", &self.control_socket);
        p.check(self.port != 0, "shim-port", self.port, "a port (1-65535)");
        if let Some(b) = self.retry_budget {
            p.check(
                (0.0..=10.0).contains(&b),
                "shim-retry-budget",
                b,
                "a ratio like 0.1 (0 to 10)",
            );
        }
        p.check(
            (0.0..=1_000.0).contains(&self.retry_budget_min),
            "shim-retry-budget-min",
            self.retry_budget_min,
            "a number of retries like 3 (0 to 1000)",
        );
        if let Some(k) = self.throttle_k {
            p.check(
                k > 0.0 && k.is_finite(),
                "shim-throttle-k",
                k,
                "a positive number like 2",
            );
        }
        p.check(
            self.retry_window_ms > 0,
            "shim-retry-window-ms",
            self.retry_window_ms,
            "at least 1",
        );
        p.check(
            self.detect_timeout_ms > 0,
            "shim-detect-timeout-ms",
            self.detect_timeout_ms,
            "at least 1",
        );
        p.check(
            self.connect_timeout_ms > 0,
            "shim-connect-timeout-ms",
            self.connect_timeout_ms,
            "at least 1",
        );
        if let Some(t) = self.threads {
            p.check(t > 0, "shim-threads", t, "at least 1");
        }
        p.check(
            self.cache_mib > 0,
            "shim-cache-mib",
            self.cache_mib,
            "at least 1",
        );
        p.add(&self.budget);
    }
}

pub async fn run(args: ShimArgs) -> anyhow::Result<()> {
    args.validate()?;
    if args.cleanup {
        return cleanup_mode(&args).await;
    }
    // Handlers first: a SIGTERM that lands while rules are being installed must still lead to
    // their removal, not to the default (die with rules in place).
    let mut signals = Signals::new();
    // Thread per core, each with its own SO_REUSEPORT listeners and a current-thread runtime:
    // a connection and its upstream live on one thread (no work-stealing hops), as in HAProxy.
    // Bound here, before any rule exists, so a bind error stops us with nothing redirected.
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
        .max(1);
    let v4_addr = SocketAddr::new(args.listen, args.port);
    let v6_addr = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, args.port));
    let kernel = args.steer == SteerMode::Cgroup;
    // Kernel steering rewrites IPv6 connects to [::1]: it needs our [::] listener, not ip6tables.
    let mut v6_ok = args.ipv6 && (kernel || iptables::Family::V6.available());
    let mut per_thread = Vec::with_capacity(threads);
    for _ in 0..threads {
        let mut ls = vec![bind_reuseport(v4_addr).with_context(|| format!("binding {v4_addr}"))?];
        if v6_ok {
            match bind_reuseport(v6_addr) {
                Ok(l) => ls.push(l),
                Err(e) => {
                    tracing::warn!(error = %e, "no IPv6 listener; IPv6 not steered");
                    v6_ok = false;
                }
            }
        }
        per_thread.push(ls);
    }
    // Kernel steering: attached once the listeners exist (connects queue in their backlog until
    // the io threads run), before any io thread needs the map.
    let (links, orig_dsts) = if kernel {
        let t0 = std::time::Instant::now();
        let (links, orig) = args
            .cgroup_steering(v6_ok)
            .attach(&per_thread[0][0], per_thread[0].get(1).filter(|_| v6_ok))
            .context("attaching the kernel steering programs")?;
        tracing::info!(cgroups = ?args.steer_cgroups, port = args.port, ipv6 = v6_ok, took_ms = t0.elapsed().as_millis() as u64, inbound_ports = ?args.inbound_ports, "steering installed (kernel programs)");
        (Some(links), Some(orig))
    } else {
        (None, None)
    };
    let ctx = Arc::new(proxy::Ctx {
        view: ControlView::new(),
        tracker: policy::SharedTracker::new(policy::PolicyConfig {
            window: Duration::from_millis(args.retry_window_ms),
            budget_ratio: args.retry_budget,
            budget_min_retries: args.retry_budget_min,
            throttle_k: args.throttle_k,
            ..policy::PolicyConfig::within(args.cache_mib << 20)
        }),
        mark: args.mark,
        listen_port: args.port,
        kernel_steering: orig_dsts.map(Arc::new),
        connect_timeout: Duration::from_millis(args.connect_timeout_ms),
        detect_timeout: Duration::from_millis(args.detect_timeout_ms),
        stats: proxy::Stats::default(),
        h2_upstream: args.h2_upstream,
        h2_pool: proxy::H2Pool {
            callers_per_conn: args.h2_pool_callers,
            idle: Duration::from_millis(args.h2_pool_idle_ms),
        },
    });

    for (i, ls) in per_thread.into_iter().enumerate() {
        spawn_io_thread(i, ls, ctx.clone()).context("starting an io thread")?;
    }

    tokio::spawn(control::follow(
        args.control_socket.clone(),
        ctx.view.clone(),
    ));
    tokio::spawn(report_cache(ctx.clone()));

    let pid_file = args.pid_file();
    if args.uses_iptables() {
        // Pid file and watchdog before the first rule: a crash mid-install is cleaned up too.
        if let Err(e) = write_pid_file(&pid_file) {
            tracing::warn!(error = %e, "cannot write the pid file");
        }
        if args.watchdog {
            spawn_watchdog(&args);
        }
        let t0 = std::time::Instant::now();
        let st = args.steering();
        if let Err(e) = st.install(iptables::Family::V4) {
            let _ = iptables::cleanup(&args.chain);
            let _ = std::fs::remove_file(&pid_file);
            return Err(e).context("installing IPv4 steering");
        }
        if v6_ok && let Err(e) = st.install(iptables::Family::V6) {
            tracing::warn!(error = %e, "IPv6 steering not installed");
        }
        tracing::info!(chain = %args.chain, port = args.port, took_ms = t0.elapsed().as_millis() as u64, "steering installed");
    }

    let s = signals.wait().await;
    tracing::info!(signal = s, "shutting down");
    // Links first: from here on new connections go direct.
    drop(links);
    if args.uses_iptables() {
        // Rules first: from here on new connections go direct.
        if let Err(e) = iptables::cleanup(&args.chain) {
            tracing::warn!(error = %e, "removing steering failed; run `retry-agent shim --cleanup`");
        }
        let _ = std::fs::remove_file(&pid_file);
    }
    tracing::info!(
        stats = %ctx.stats.summary(),
        cache_evictions = ctx.tracker.evictions(),
        cache = %ctx.tracker.stats(),
        "shim stopped"
    );
    Ok(())
}

/// How often the shim says its caches refused entries (only when they did since the last time).
const CACHE_REPORT_EVERY: Duration = Duration::from_secs(10);

/// Logs what the failure cache and client table hold whenever their bounds refused something
/// since the last report: a flood of new sources is visible while it happens, at most one line
/// per [`CACHE_REPORT_EVERY`].
async fn report_cache(ctx: Arc<proxy::Ctx>) {
    let mut tick = tokio::time::interval(CACHE_REPORT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = 0;
    loop {
        tick.tick().await;
        let st = ctx.tracker.stats();
        let refused = st.failures_refused + st.clients_refused;
        if refused > last {
            tracing::warn!(cache = %st, new = refused - last, "shim cache full: refused entries fail open (retries forwarded, clients uncounted)");
            last = refused;
        }
    }
}

/// SIGTERM, SIGINT and SIGHUP, registered once at start.
struct Signals(Option<[tokio::signal::unix::Signal; 3]>);

impl Signals {
    fn new() -> Signals {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::hangup()),
        ) {
            (Ok(t), Ok(i), Ok(h)) => Signals(Some([t, i, h])),
            _ => {
                tracing::warn!(
                    "cannot install signal handlers; the watchdog or --cleanup must remove the rules"
                );
                Signals(None)
            }
        }
    }

    async fn wait(&mut self) -> &'static str {
        let Some([t, i, h]) = self.0.as_mut() else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = t.recv() => "SIGTERM",
            _ = i.recv() => "SIGINT",
            _ = h.recv() => "SIGHUP",
        }
    }
}

fn write_pid_file(p: &Path) -> std::io::Result<()> {
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d)?;
    }
    std::fs::write(p, std::process::id().to_string())
}

fn spawn_watchdog(args: &ShimArgs) {
    use std::os::unix::process::CommandExt;
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(error = %e, "no watchdog: cannot find our executable");
            return;
        }
    };
    let r = std::process::Command::new(exe)
        .args([
            "shim",
            "--cleanup",
            "--shim-chain",
            &args.chain,
            "--watch-pid",
            &std::process::id().to_string(),
        ])
        .arg("--shim-run-dir")
        .arg(&args.run_dir)
        .stdin(std::process::Stdio::null())
        // Own process group: a Ctrl-C or group kill aimed at the shim leaves the watchdog to clean.
        .process_group(0)
        .spawn();
    match r {
        Ok(child) => tracing::debug!(pid = child.id(), "watchdog started"),
        Err(e) => tracing::warn!(error = %e, "watchdog not started"),
    }
}

/// `--cleanup`, optionally after waiting for `--watch-pid` to exit.
async fn cleanup_mode(args: &ShimArgs) -> anyhow::Result<()> {
    if let Some(pid) = args.watch_pid {
        wait_for_exit(pid).await?;
        // Only the shim we watched may be cleaned up after: a newer one owns the file now.
        let owner = std::fs::read_to_string(args.pid_file())
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        if owner != Some(pid) {
            let owner = owner.map_or_else(|| "none".to_string(), |o| o.to_string());
            tracing::debug!(%owner, pid, "the watched shim cleaned up or was replaced; nothing to do");
            return Ok(());
        }
        tracing::warn!(pid, chain = %args.chain, "shim died without cleaning up; removing its rules");
        let _ = std::fs::remove_file(args.pid_file());
    }
    let found = iptables::cleanup(&args.chain)?;
    tracing::info!(chain = %args.chain, found, "cleanup done");
    Ok(())
}

/// Waits on a pidfd until `pid` exits (returns at once if it is already gone).
async fn wait_for_exit(pid: i32) -> anyhow::Result<()> {
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ESRCH) {
            return Ok(());
        }
        return Err(e).context("pidfd_open");
    }
    // SAFETY: fd is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: the AsyncFd owns the pidfd and nothing else closes or replaces it.
    let afd = unsafe { tokio::io::unix::AsyncFd::register(fd) }.context("watching the pidfd")?;
    // A pidfd becomes readable when the process exits.
    let _ = afd.readable().await.context("waiting on the pidfd")?;
    Ok(())
}
