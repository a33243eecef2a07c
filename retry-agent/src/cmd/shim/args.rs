//! `retry-agent shim`'s settings: the flags (`--shim-*`), what they steer and how they are
//! checked; `super` runs the shim they describe.
use std::path::PathBuf;

use clap::Args;

use crate::actuate::{
    DEFAULT_CONTROL_SOCKET,
    shim::{cgroup, iptables, policy, proxy},
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
        args.cache_mib = (super::super::budget::shim_cache_bytes(args.budget) >> 20).max(1);
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
    pub(super) fn uses_iptables(&self) -> bool {
        self.steer == SteerMode::Iptables && !self.no_iptables
    }

    pub(super) fn pid_file(&self) -> PathBuf {
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
