//! From a container's labels to its pod, and from a pod to its workload. Pure.
//!
//! A kubelet labels every container it starts (through CRI) with `io.kubernetes.pod.name`,
//! `io.kubernetes.pod.namespace`, `io.kubernetes.pod.uid` and `io.kubernetes.container.name`.
//! The workload is the pod's owner: from the API index when it is watched (exact), otherwise
//! guessed from the shape of the names controllers generate (documented below; the kind is then
//! `Unknown` unless the shape is unambiguous).
use std::{collections::HashMap, sync::Arc};

use super::{WorkloadKind, WorkloadName};

pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";

/// The pod a container belongs to, as its labels say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodLabels {
    pub namespace: String,
    pub pod: String,
    pub uid: Option<String>,
    /// Absent on a pod's sandbox (pause) container.
    pub container: Option<String>,
}

/// `None` unless both the pod name and namespace labels are present and non-empty.
pub fn pod_labels(labels: &HashMap<String, String>) -> Option<PodLabels> {
    let get = |k: &str| labels.get(k).filter(|v| !v.is_empty()).cloned();
    Some(PodLabels {
        namespace: get(LABEL_POD_NAMESPACE)?,
        pod: get(LABEL_POD_NAME)?,
        uid: get(LABEL_POD_UID),
        container: get(LABEL_CONTAINER_NAME),
    })
}

/// A pod's controller as its `ownerReferences` say (the one with `controller: true`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub kind: String,
    pub name: String,
}

/// The workload of a pod owned by `owner`; a ReplicaSet is followed to its Deployment through
/// `rs_owner` (the ReplicaSet's own owner, from the index) and a Job to its CronJob by name.
pub fn workload_of(
    pod: &str,
    owner: Option<&Owner>,
    rs_owner: Option<&Owner>,
) -> (String, WorkloadKind) {
    let Some(owner) = owner else {
        return (pod.to_string(), WorkloadKind::Pod);
    };
    match owner.kind.as_str() {
        "ReplicaSet" => match rs_owner {
            Some(o) if o.kind == "Deployment" => (o.name.clone(), WorkloadKind::Deployment),
            Some(_) => (owner.name.clone(), WorkloadKind::ReplicaSet),
            // The ReplicaSet is not in the index (yet): its name is `<deployment>-<pod-template-hash>`.
            None => match strip_hash(&owner.name) {
                Some(d) => (d.to_string(), WorkloadKind::Deployment),
                None => (owner.name.clone(), WorkloadKind::ReplicaSet),
            },
        },
        "StatefulSet" => (owner.name.clone(), WorkloadKind::StatefulSet),
        "DaemonSet" => (owner.name.clone(), WorkloadKind::DaemonSet),
        "Job" => match cronjob_of_job(&owner.name) {
            Some(c) => (c.to_string(), WorkloadKind::CronJob),
            None => (owner.name.clone(), WorkloadKind::Job),
        },
        _ => (owner.name.clone(), WorkloadKind::Pod),
    }
}

/// The workload guessed from a pod name alone (no API access):
/// - `<deployment>-<pod-template-hash>-<5>` → the Deployment (kind `Deployment`: the two
///   generated suffixes in those alphabets are specific to it);
/// - `<name>-<ordinal>` → the StatefulSet (kind `Unknown`: a person may name a pod `x-1`);
/// - `<name>-<5>` → `<name>` (a DaemonSet, Job or bare ReplicaSet: kind `Unknown`);
/// - anything else → the pod itself (kind `Pod`).
pub fn guess_workload(pod: &str) -> (String, WorkloadKind) {
    if let Some(base) = strip_random(pod) {
        if let Some(dep) = strip_hash(base) {
            return (dep.to_string(), WorkloadKind::Deployment);
        }
        return (base.to_string(), WorkloadKind::Unknown);
    }
    if let Some((base, ord)) = pod.rsplit_once('-')
        && !base.is_empty()
        && !ord.is_empty()
        && ord.bytes().all(|b| b.is_ascii_digit())
        && (ord == "0" || !ord.starts_with('0'))
    {
        return (base.to_string(), WorkloadKind::Unknown);
    }
    (pod.to_string(), WorkloadKind::Pod)
}

/// Kubernetes' generated-name alphabet (`utilrand.String`): no vowels, no 0/1/3, no l.
fn is_safe_char(b: u8) -> bool {
    b"bcdfghjklmnpqrstvwxz2456789".contains(&b)
}

/// `<base>-<5 random>` → base.
fn strip_random(name: &str) -> Option<&str> {
    let (base, suffix) = name.rsplit_once('-')?;
    (!base.is_empty() && suffix.len() == 5 && suffix.bytes().all(is_safe_char)).then_some(base)
}

/// `<base>-<pod-template-hash>` (a ReplicaSet name) → base. The hash is 6 to 10 safe characters.
fn strip_hash(name: &str) -> Option<&str> {
    let (base, hash) = name.rsplit_once('-')?;
    (!base.is_empty() && (6..=10).contains(&hash.len()) && hash.bytes().all(is_safe_char))
        .then_some(base)
}

/// `<cronjob>-<scheduled minutes since the epoch>` → the CronJob.
fn cronjob_of_job(job: &str) -> Option<&str> {
    let (base, ts) = job.rsplit_once('-')?;
    (!base.is_empty() && (8..=10).contains(&ts.len()) && ts.bytes().all(|b| b.is_ascii_digit()))
        .then_some(base)
}

/// The name of a container from its labels, with the workload from `owner_lookup` (the API
/// index, when watched) or guessed from the pod name.
pub fn name_container(labels: &PodLabels, owner: Option<(String, WorkloadKind)>) -> WorkloadName {
    let (workload, kind) = owner.unwrap_or_else(|| guess_workload(&labels.pod));
    WorkloadName {
        namespace: Arc::from(labels.namespace.as_str()),
        workload: Arc::from(workload.as_str()),
        workload_kind: kind,
        pod: Arc::from(labels.pod.as_str()),
        container: labels.container.as_deref().map(Arc::from),
    }
}

#[cfg(test)]
mod tests;
