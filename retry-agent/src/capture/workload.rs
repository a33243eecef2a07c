//! The Kubernetes name of a process or an address, as data: `identity` produces it, capture's
//! `ProcessInfo` carries it (so recordings and replays keep names), correlate names services by it.
use std::{fmt, sync::Arc};

use serde::{Deserialize, Serialize};

/// What owns a pod (or, for an address, what it belongs to).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadKind {
    Deployment,
    StatefulSet,
    DaemonSet,
    Job,
    CronJob,
    /// A ReplicaSet no Deployment owns.
    ReplicaSet,
    /// A Service IP whose endpoints are not one workload's pods.
    Service,
    /// A bare pod (no owner), or one whose owner kind is not one of the above.
    Pod,
    /// Guessed from the pod name's shape (no API access): the kind is not known.
    Unknown,
}

impl WorkloadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "deployment",
            WorkloadKind::StatefulSet => "statefulset",
            WorkloadKind::DaemonSet => "daemonset",
            WorkloadKind::Job => "job",
            WorkloadKind::CronJob => "cronjob",
            WorkloadKind::ReplicaSet => "replicaset",
            WorkloadKind::Service => "service",
            WorkloadKind::Pod => "pod",
            WorkloadKind::Unknown => "unknown",
        }
    }
}

/// The Kubernetes name of a process or an address. Cheap to clone.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WorkloadName {
    pub namespace: Arc<str>,
    /// The owning workload's name (Deployment, StatefulSet, ...), or the pod's (or the
    /// Service's) own name when nothing owns it.
    pub workload: Arc<str>,
    pub workload_kind: WorkloadKind,
    /// Empty for a Service IP.
    pub pod: Arc<str>,
    /// Known for a local process (its container's labels) and for a remote pod IP whose port a
    /// container of the pod declares; `None` otherwise.
    pub container: Option<Arc<str>>,
}

impl WorkloadName {
    /// The service name for edges, verdicts and metrics: `namespace/workload`. Stable across
    /// pods, restarts and nodes (the caller on another node names the callee's IP the same way),
    /// and bounded by the number of workloads, not pods.
    pub fn service_name(&self) -> String {
        format!("{}/{}", self.namespace, self.workload)
    }
}

impl fmt::Display for WorkloadName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.workload)?;
        if let Some(c) = &self.container {
            write!(f, "/{c}")?;
        }
        Ok(())
    }
}
