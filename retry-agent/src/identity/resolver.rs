//! The resolver task and the caches lookups read: pid → container, container → name.
//!
//! One task owns every runtime call; lookups take a read lock for a map probe. Both maps are
//! bounded (`--identity-max-containers`, and pids at 16× that); a container that could not be
//! named is asked again only after [`RETRY_AFTER`], when a new process of it appears.
use std::{
    collections::HashMap,
    fs,
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{
    FailureReason, Failures, IdentityConfig, WorkloadName,
    cgroup::{self, ContainerId, ContainerRef},
    cluster::ClusterIndex,
    containerd::{self, RuntimeError},
    pod,
};

/// A container that could not be named is asked again after this long.
const RETRY_AFTER: Duration = Duration::from_secs(30);
/// Pids waiting for resolution; beyond it `observe` counts `queue_full`.
const QUEUE: usize = 1024;

/// A container was named: these are the pids seen in it so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub container: ContainerId,
    pub name: WorkloadName,
    pub pids: Vec<u32>,
}

#[derive(Clone, Debug)]
enum Entry {
    Named(WorkloadName),
    Failed { at: Instant },
}

/// What a pid resolved to.
#[derive(Clone, Debug)]
enum PidEntry {
    /// Not in a container (or its cgroup could not be read).
    Host,
    Container(ContainerId),
}

pub(crate) struct Shared {
    cfg: IdentityConfig,
    pub(crate) host_netns: Option<u64>,
    pub(crate) failures: Failures,
    pids: RwLock<HashMap<u32, PidEntry>>,
    containers: RwLock<HashMap<ContainerId, Entry>>,
}

impl Shared {
    pub(crate) fn new(cfg: IdentityConfig, host_netns: Option<u64>) -> Self {
        Shared {
            cfg,
            host_netns,
            failures: Failures::default(),
            pids: RwLock::new(HashMap::new()),
            containers: RwLock::new(HashMap::new()),
        }
    }

    pub(crate) fn knows_pid(&self, pid: u32) -> bool {
        self.pids.read().is_ok_and(|m| m.contains_key(&pid))
    }

    pub(crate) fn forget(&self, pid: u32) {
        if let Ok(mut m) = self.pids.write() {
            m.remove(&pid);
        }
    }

    pub(crate) fn inherit(&self, pid: u32, parent: u32) {
        let entry = self.pids.read().ok().and_then(|m| m.get(&parent).cloned());
        if let Some(e) = entry {
            self.set_pid(pid, e);
        }
    }

    pub(crate) fn name_of_pid(&self, pid: u32) -> Option<WorkloadName> {
        let id = match self.pids.read().ok()?.get(&pid)? {
            PidEntry::Host => return None,
            PidEntry::Container(id) => id.clone(),
        };
        match self.containers.read().ok()?.get(&id)? {
            Entry::Named(n) => Some(n.clone()),
            Entry::Failed { .. } => None,
        }
    }

    fn set_pid(&self, pid: u32, e: PidEntry) {
        if let Ok(mut m) = self.pids.write() {
            if m.len() >= self.cfg.max_containers.saturating_mul(16) && !m.contains_key(&pid) {
                // Exits normally keep this small; a lost exit must not grow it without bound.
                m.clear();
            }
            m.insert(pid, e);
        }
    }

    fn pids_in(&self, id: &ContainerId) -> Vec<u32> {
        let Ok(m) = self.pids.read() else {
            return Vec::new();
        };
        let mut v: Vec<u32> = m
            .iter()
            .filter(|(_, e)| matches!(e, PidEntry::Container(c) if c == id))
            .map(|(p, _)| *p)
            .collect();
        v.sort_unstable();
        v
    }

    /// Whether the container needs a runtime call now.
    fn needs_lookup(&self, id: &ContainerId) -> bool {
        match self.containers.read().ok().and_then(|m| m.get(id).cloned()) {
            None => true,
            Some(Entry::Named(_)) => false,
            Some(Entry::Failed { at }) => at.elapsed() >= RETRY_AFTER,
        }
    }

    /// Stores the outcome; `false` when the cache is full (the name is then not kept).
    fn set_container(&self, id: ContainerId, e: Entry) -> bool {
        let Ok(mut m) = self.containers.write() else {
            return false;
        };
        if m.len() >= self.cfg.max_containers && !m.contains_key(&id) {
            // Make room from failures first; named containers stay (they are the useful ones).
            m.retain(|_, e| matches!(e, Entry::Named(_)));
            if m.len() >= self.cfg.max_containers {
                return false;
            }
        }
        m.insert(id, e);
        true
    }
}

pub(super) fn spawn(
    shared: Arc<Shared>,
    cluster: Arc<RwLock<ClusterIndex>>,
) -> (mpsc::Sender<u32>, mpsc::Receiver<Resolved>) {
    let (tx, rx) = mpsc::channel::<u32>(QUEUE);
    let (resolved_tx, resolved_rx) = mpsc::channel::<Resolved>(QUEUE);
    tokio::spawn(run(shared, cluster, rx, resolved_tx));
    (tx, resolved_rx)
}

async fn run(
    shared: Arc<Shared>,
    cluster: Arc<RwLock<ClusterIndex>>,
    mut rx: mpsc::Receiver<u32>,
    out: mpsc::Sender<Resolved>,
) {
    let clients: Vec<containerd::Client> = shared
        .cfg
        .runtime_sockets
        .iter()
        .filter_map(|s| containerd::Client::new(s.clone()).ok())
        .collect();
    let mut warned = false;
    while let Some(pid) = rx.recv().await {
        if shared.knows_pid(pid) {
            continue;
        }
        let text =
            match fs::read_to_string(shared.cfg.proc_root.join(pid.to_string()).join("cgroup")) {
                Ok(t) => t,
                Err(_) => {
                    shared.failures.count(FailureReason::ProcessGone);
                    continue;
                }
            };
        let Some(cref) = cgroup::parse(&text) else {
            shared.set_pid(pid, PidEntry::Host);
            continue;
        };
        shared.set_pid(pid, PidEntry::Container(cref.id.clone()));
        if !shared.needs_lookup(&cref.id) {
            // A new process of a container already named: announce it too, or the caller never
            // learns its name (only the container's first lookup announces otherwise).
            if let Some(name) = shared.name_of_pid(pid)
                && out
                    .try_send(Resolved {
                        container: cref.id,
                        name,
                        pids: vec![pid],
                    })
                    .is_err()
            {
                shared.failures.count(FailureReason::QueueFull);
            }
            continue;
        }
        let entry = match resolve(&shared, &clients, &cluster, &cref).await {
            Ok(name) => Entry::Named(name),
            Err(reason) => {
                shared.failures.count(reason);
                if reason == FailureReason::RuntimeUnreachable && !warned {
                    warned = true;
                    warn!(sockets = ?shared.cfg.runtime_sockets, "no container runtime socket answers: containers are named comm:port");
                }
                Entry::Failed { at: Instant::now() }
            }
        };
        let named = match &entry {
            Entry::Named(n) => Some(n.clone()),
            Entry::Failed { .. } => None,
        };
        if shared.set_container(cref.id.clone(), entry)
            && let Some(name) = named
        {
            debug!(container = %cref.id, %name, "container named");
            let pids = shared.pids_in(&cref.id);
            if out
                .try_send(Resolved {
                    container: cref.id,
                    name,
                    pids,
                })
                .is_err()
            {
                // The consumer is behind: the names are still in the cache for lookups.
                shared.failures.count(FailureReason::QueueFull);
            }
        }
    }
    info!("identity resolver stopped");
}

/// Names one container: its labels from the runtime, its workload from the API index when it
/// knows the pod, else guessed. Without a runtime answer, a kubelet-made cgroup's pod UID can
/// still be named from the API index.
async fn resolve(
    shared: &Shared,
    clients: &[containerd::Client],
    cluster: &RwLock<ClusterIndex>,
    cref: &ContainerRef,
) -> Result<WorkloadName, FailureReason> {
    let mut namespaces: Vec<String> = cref.namespace_hint.iter().cloned().collect();
    namespaces.extend(
        shared
            .cfg
            .containerd_namespaces
            .iter()
            .filter(|n| Some(*n) != cref.namespace_hint.as_ref())
            .cloned(),
    );
    let mut failure = FailureReason::RuntimeUnreachable;
    for client in clients {
        match client.labels(&cref.id, &namespaces).await {
            Ok(labels) => {
                let Some(p) = pod::pod_labels(&labels) else {
                    return Err(FailureReason::LabelsMissing);
                };
                let owner = cluster
                    .read()
                    .ok()
                    .and_then(|c| c.workload_of_pod(&p.namespace, &p.pod));
                return Ok(pod::name_container(&p, owner));
            }
            Err(RuntimeError::NotFound { .. }) => failure = FailureReason::ContainerNotFound,
            Err(RuntimeError::Unreachable { .. }) => {}
            Err(RuntimeError::Call {
                code: tonic::Code::Unavailable | tonic::Code::DeadlineExceeded,
                ..
            }) => {}
            Err(e) => {
                debug!(error = %e, socket = %client.socket().display(), "runtime lookup failed");
                failure = FailureReason::RuntimeError;
            }
        }
    }
    if let Some(uid) = &cref.pod_uid
        && let Some(name) = cluster.read().ok().and_then(|c| c.name_of_pod_uid(uid))
    {
        return Ok(name);
    }
    Err(failure)
}
