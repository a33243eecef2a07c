//! Who a process or a remote address is, in the names operators use: Kubernetes namespace,
//! workload, pod and container.
//!
//! Sits between `capture` and `l7` in the data flow because it enriches what capture says about
//! a process (`ProcessInfo`: pid, cgroup, network namespace) and nothing after it: the pipeline
//! stays a pure function of events once the names ride on them. Like capture it does IO — the
//! container runtime's socket (`containerd`), the Kubernetes API (`cluster`) and `/proc/PID/cgroup`
//! (`cgroup`) — and all of it off the pipeline task: [`Identity::pid`] and [`Identity::ip`] read
//! caches and never block; [`Identity::observe`] queues a process for resolution, and a resolved
//! container is announced on the channel [`Identity::start`] returns so the caller can describe its
//! processes again. Anything unnamed (no runtime socket, a vanished container, labels missing)
//! falls back to `comm:port` ([`fallback_name`]) and is counted by [`FailureReason`].
use std::{
    net::IpAddr,
    path::PathBuf,
    sync::{
        Arc, RwLock,
        atomic::{AtomicU64, Ordering},
    },
};

pub mod cgroup;
pub mod cluster;
pub mod containerd;
pub mod pod;
mod resolver;

use crate::settings::{InvalidConfig, Settings};

pub use cgroup::{ContainerId, ContainerRef, RuntimeKind};
// The name types ride on capture's `ProcessInfo`, so they live in capture (the earlier layer).
pub use crate::capture::{WorkloadKind, WorkloadName};
pub use resolver::Resolved;

/// The name of a process nothing better names: `comm:port`, plus `@netns:<inode>` when the
/// process is not in the host's network namespace, so two processes listening on the same port
/// in two namespaces never share a name by accident.
pub fn fallback_name(
    comm: &str,
    port: Option<u16>,
    netns: Option<u64>,
    host_netns: Option<u64>,
) -> String {
    let mut s = match port {
        Some(p) => format!("{comm}:{p}"),
        None => comm.to_string(),
    };
    if let Some(ns) = netns
        && host_netns.is_some_and(|h| h != ns)
    {
        s.push_str(&format!("@netns:{ns}"));
    }
    s
}

/// Why a process or an address stayed unnamed. A closed set: it is a metric label
/// (`retry_agent_identity_failures_total{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureReason {
    /// No runtime socket answered (missing, refused, timed out).
    RuntimeUnreachable,
    /// The runtime does not know the container (it exited, or another runtime runs it).
    ContainerNotFound,
    /// The container has no `io.kubernetes.*` labels (not started by a kubelet).
    LabelsMissing,
    /// The runtime answered with an error other than not-found.
    RuntimeError,
    /// The process exited before its cgroup was read.
    ProcessGone,
    /// The resolution queue was full: the process is retried when it is described again.
    QueueFull,
    /// The Kubernetes API watch failed (it restarts by itself).
    ApiWatch,
}

impl FailureReason {
    pub const ALL: [FailureReason; 7] = [
        FailureReason::RuntimeUnreachable,
        FailureReason::ContainerNotFound,
        FailureReason::LabelsMissing,
        FailureReason::RuntimeError,
        FailureReason::ProcessGone,
        FailureReason::QueueFull,
        FailureReason::ApiWatch,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::RuntimeUnreachable => "runtime_unreachable",
            FailureReason::ContainerNotFound => "container_not_found",
            FailureReason::LabelsMissing => "labels_missing",
            FailureReason::RuntimeError => "runtime_error",
            FailureReason::ProcessGone => "process_gone",
            FailureReason::QueueFull => "queue_full",
            FailureReason::ApiWatch => "api_watch",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// When to watch the Kubernetes API.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum KubeMode {
    /// When in-cluster credentials are present (KUBERNETES_SERVICE_HOST and the service
    /// account token); otherwise run without remote names.
    #[default]
    Auto,
    Off,
}

#[derive(clap::Args, Debug, Clone)]
pub struct IdentityConfig {
    /// Container runtime sockets speaking containerd's API, tried in order.
    #[arg(
        long = "identity-runtime-sockets",
        env = "RETRY_AGENT_IDENTITY_RUNTIME_SOCKETS",
        value_delimiter = ',',
        default_value = "/run/containerd/containerd.sock,/run/k3s/containerd/containerd.sock"
    )]
    pub runtime_sockets: Vec<PathBuf>,
    /// containerd namespaces a container is looked up in, in order (kubelet's is k8s.io).
    #[arg(
        long = "identity-containerd-namespaces",
        env = "RETRY_AGENT_IDENTITY_CONTAINERD_NAMESPACES",
        value_delimiter = ',',
        default_value = "k8s.io,default,moby"
    )]
    pub containerd_namespaces: Vec<String>,
    /// Watch pods, EndpointSlices, Services and ReplicaSets to name remote addresses.
    #[arg(long = "identity-kube", env = "RETRY_AGENT_IDENTITY_KUBE", value_enum, default_value_t = KubeMode::Auto)]
    pub kube: KubeMode,
    /// Containers (and pods in the API index) kept; beyond it new ones stay unnamed and counted.
    #[arg(
        long = "identity-max-containers",
        env = "RETRY_AGENT_IDENTITY_MAX_CONTAINERS",
        default_value_t = 4096
    )]
    pub max_containers: usize,
    /// Pods, Services and ReplicaSets kept from the API watch.
    #[arg(
        long = "identity-max-objects",
        env = "RETRY_AGENT_IDENTITY_MAX_OBJECTS",
        default_value_t = 100_000
    )]
    pub max_objects: usize,
    /// Where /proc is (the host's, under hostPID).
    #[arg(
        id = "identity_proc_root",
        long = "identity-proc-root",
        env = "RETRY_AGENT_IDENTITY_PROC_ROOT",
        default_value = "/proc"
    )]
    pub proc_root: PathBuf,
}

impl Default for IdentityConfig {
    fn default() -> Self {
        crate::settings::defaults()
    }
}

impl Settings for IdentityConfig {
    fn check(&self, p: &mut InvalidConfig) {
        // Zero would name nothing while still paying for the runtime calls.
        p.check(
            self.max_containers > 0,
            "identity-max-containers",
            self.max_containers,
            "at least 1",
        );
        p.check(
            self.max_objects > 0,
            "identity-max-objects",
            self.max_objects,
            "at least 1",
        );
    }
}

/// Failure counters, one per [`FailureReason`].
#[derive(Debug, Default)]
pub(crate) struct Failures([AtomicU64; FailureReason::ALL.len()]);

impl Failures {
    pub(crate) fn count(&self, r: FailureReason) {
        self.0[r.index()].fetch_add(1, Ordering::Relaxed);
    }
    fn snapshot(&self) -> Vec<(FailureReason, u64)> {
        FailureReason::ALL
            .iter()
            .map(|r| (*r, self.0[r.index()].load(Ordering::Relaxed)))
            .collect()
    }
}

/// The lookup handle: cheap to clone, every method non-blocking.
#[derive(Clone)]
pub struct Identity {
    pub(crate) shared: Arc<resolver::Shared>,
    pub(crate) cluster: Arc<RwLock<cluster::ClusterIndex>>,
    queue: Option<tokio::sync::mpsc::Sender<u32>>,
}

impl Identity {
    /// Names nothing: lookups return `None` (tests, replays, `--identity-*` off).
    pub fn disabled() -> Self {
        Identity {
            shared: Arc::new(resolver::Shared::new(IdentityConfig::default(), None)),
            cluster: Arc::new(RwLock::new(cluster::ClusterIndex::new(0))),
            queue: None,
        }
    }

    /// Starts the resolver task (and the API watch when credentials are present); must be
    /// called inside a tokio runtime. The receiver yields each container once it is named,
    /// with the pids seen in it, so the caller can describe those processes again.
    pub fn start(cfg: IdentityConfig) -> (Self, tokio::sync::mpsc::Receiver<Resolved>) {
        let host_netns = crate::capture::procfs::host_netns(&cfg.proc_root);
        let cluster = Arc::new(RwLock::new(cluster::ClusterIndex::new(cfg.max_objects)));
        let shared = Arc::new(resolver::Shared::new(cfg.clone(), host_netns));
        let (queue, resolved) = resolver::spawn(shared.clone(), cluster.clone());
        if cfg.kube == KubeMode::Auto {
            cluster::spawn_if_in_cluster(cluster.clone(), shared.clone());
        }
        (
            Identity {
                shared,
                cluster,
                queue: Some(queue),
            },
            resolved,
        )
    }

    /// A process was described (new pid, or its metadata changed): resolve its container if
    /// that is not known yet. Never blocks; a full queue is counted and retried next time.
    pub fn observe(&self, pid: u32) {
        let Some(q) = &self.queue else { return };
        if self.shared.knows_pid(pid) {
            return;
        }
        if q.try_send(pid).is_err() {
            self.shared.failures.count(FailureReason::QueueFull);
        }
    }

    /// `pid` was forked from `parent` (and has not exec'd: capture saw it serve what the parent
    /// accepted): it is in the parent's container, so it takes the parent's entry without a
    /// /proc read a short-lived child would often lose. Nothing happens while the parent is
    /// unknown (`observe` then resolves the child itself).
    pub fn inherit(&self, pid: u32, parent: u32) {
        self.shared.inherit(pid, parent);
    }

    /// The process exited.
    pub fn forget(&self, pid: u32) {
        self.shared.forget(pid);
    }

    /// The name of a local process, once its container is resolved.
    pub fn pid(&self, pid: u32) -> Option<WorkloadName> {
        self.shared.name_of_pid(pid)
    }

    /// The name of a remote address (a pod IP, or a Service IP) from the API watch; `port`
    /// picks the container when the pod declares it.
    pub fn ip(&self, ip: IpAddr, port: u16) -> Option<WorkloadName> {
        self.cluster.read().ok()?.name_of_ip(ip, port)
    }

    /// The host's network namespace inode (for [`fallback_name`]).
    pub fn host_netns(&self) -> Option<u64> {
        self.shared.host_netns
    }

    /// Totals of what could not be named, by reason (for the metric).
    pub fn failures(&self) -> Vec<(FailureReason, u64)> {
        self.shared.failures.snapshot()
    }
}

#[cfg(test)]
mod tests;
