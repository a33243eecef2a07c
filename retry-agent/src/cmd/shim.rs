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
use std::{net::SocketAddr, path::Path, sync::Arc, time::Duration};

use anyhow::Context as _;

use crate::actuate::{
    control::{self, ControlView},
    shim::{bind_reuseport, iptables, policy, proxy, spawn_io_thread},
};
use crate::settings::Settings;

mod args;

pub use args::{ShimArgs, SteerMode, apply_budget};

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
