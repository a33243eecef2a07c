//! Remote addresses → names, from a watch of the Kubernetes API (in-cluster credentials only).
//!
//! [`ClusterIndex`] is pure: it is fed Pods, ReplicaSets, Services and EndpointSlices (the
//! `k8s-openapi` types, so tests feed it recorded API objects) and answers, for an IP, which pod
//! or Service it is. A Service IP is named after the workload its endpoints belong to when they
//! all belong to one (so a caller on any node names a callee the way the callee's own node
//! does), else after the Service. hostNetwork pods share their node's IP and are not indexed by
//! IP. Every table is bounded by `--identity-max-objects`; beyond it new objects are not kept.
//!
//! [`spawn_if_in_cluster`] runs one `kube::runtime::watcher` per kind (list, then watch; it
//! re-lists by itself after errors, with backoff). RBAC it needs: get/list/watch on pods,
//! services, replicasets (apps) and endpointslices (discovery.k8s.io), cluster-wide.
use std::{
    collections::{BTreeSet, HashMap},
    net::IpAddr,
    path::Path,
    sync::{Arc, RwLock},
};

use k8s_openapi::api::{
    apps::v1::ReplicaSet, core::v1::Pod, core::v1::Service, discovery::v1::EndpointSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{
    WorkloadKind, WorkloadName,
    pod::{Owner, workload_of},
};

/// `(namespace, name)`.
type Key = (Arc<str>, Arc<str>);

#[derive(Clone, Debug)]
struct PodEntry {
    uid: Option<String>,
    ips: Vec<IpAddr>,
    owner: Option<Owner>,
    /// Declared container ports → container name.
    ports: Vec<(u16, Arc<str>)>,
}

#[derive(Clone, Debug)]
struct SliceEntry {
    service: Key,
    /// Endpoint pods (namespace, name) from `targetRef`.
    pods: Vec<Key>,
}

#[derive(Debug, Default)]
pub struct ClusterIndex {
    max: usize,
    pods: HashMap<Key, PodEntry>,
    pod_by_ip: HashMap<IpAddr, Key>,
    pod_by_uid: HashMap<String, Key>,
    replicasets: HashMap<Key, Option<Owner>>,
    services: HashMap<Key, Vec<IpAddr>>,
    service_by_ip: HashMap<IpAddr, Key>,
    slices: HashMap<Key, SliceEntry>,
}

fn key(meta: &ObjectMeta) -> Option<Key> {
    Some((
        Arc::from(meta.namespace.as_deref()?),
        Arc::from(meta.name.as_deref()?),
    ))
}

fn controller(meta: &ObjectMeta) -> Option<Owner> {
    let refs = meta.owner_references.as_ref()?;
    let r = refs
        .iter()
        .find(|r| r.controller == Some(true))
        .or(refs.first())?;
    Some(Owner {
        kind: r.kind.clone(),
        name: r.name.clone(),
    })
}

fn ips<'a>(it: impl IntoIterator<Item = &'a String>) -> Vec<IpAddr> {
    let set: BTreeSet<IpAddr> = it
        .into_iter()
        .filter_map(|s| s.parse::<IpAddr>().ok())
        .map(|ip| ip.to_canonical())
        .collect();
    set.into_iter().collect()
}

impl ClusterIndex {
    pub fn new(max_objects: usize) -> Self {
        ClusterIndex {
            max: max_objects,
            ..Default::default()
        }
    }

    /// Objects held (every kind).
    pub fn len(&self) -> usize {
        self.pods.len() + self.replicasets.len() + self.services.len() + self.slices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn full(&self) -> bool {
        self.len() >= self.max
    }

    pub fn apply_pod(&mut self, pod: &Pod) {
        let Some(k) = key(&pod.metadata) else { return };
        self.delete_pod_key(&k);
        if self.full() {
            return;
        }
        let spec = pod.spec.as_ref();
        let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
        let status = pod.status.as_ref();
        let mut addrs: Vec<&String> = status
            .and_then(|s| s.pod_ips.as_ref())
            .map(|v| v.iter().map(|p| &p.ip).collect())
            .unwrap_or_default();
        if let Some(ip) = status.and_then(|s| s.pod_ip.as_ref()) {
            addrs.push(ip);
        }
        let ips = if host_network { Vec::new() } else { ips(addrs) };
        let ports = spec
            .map(|s| {
                s.containers
                    .iter()
                    .flat_map(|c| {
                        let name: Arc<str> = Arc::from(c.name.as_str());
                        c.ports.iter().flatten().filter_map(move |p| {
                            Some((u16::try_from(p.container_port).ok()?, name.clone()))
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        let uid = pod.metadata.uid.clone();
        for ip in &ips {
            self.pod_by_ip.insert(*ip, k.clone());
        }
        if let Some(u) = &uid {
            self.pod_by_uid.insert(u.clone(), k.clone());
        }
        self.pods.insert(
            k,
            PodEntry {
                uid,
                ips,
                owner: controller(&pod.metadata),
                ports,
            },
        );
    }

    pub fn delete_pod(&mut self, pod: &Pod) {
        if let Some(k) = key(&pod.metadata) {
            self.delete_pod_key(&k);
        }
    }

    fn delete_pod_key(&mut self, k: &Key) {
        let Some(old) = self.pods.remove(k) else {
            return;
        };
        for ip in old.ips {
            // A recycled IP may already belong to a newer pod.
            if self.pod_by_ip.get(&ip) == Some(k) {
                self.pod_by_ip.remove(&ip);
            }
        }
        if let Some(u) = old.uid {
            self.pod_by_uid.remove(&u);
        }
    }

    pub fn apply_replicaset(&mut self, rs: &ReplicaSet) {
        let Some(k) = key(&rs.metadata) else { return };
        if self.full() && !self.replicasets.contains_key(&k) {
            return;
        }
        self.replicasets.insert(k, controller(&rs.metadata));
    }

    pub fn delete_replicaset(&mut self, rs: &ReplicaSet) {
        if let Some(k) = key(&rs.metadata) {
            self.replicasets.remove(&k);
        }
    }

    pub fn apply_service(&mut self, svc: &Service) {
        let Some(k) = key(&svc.metadata) else { return };
        self.delete_service_key(&k);
        if self.full() {
            return;
        }
        let spec = svc.spec.as_ref();
        let mut addrs: Vec<&String> = spec
            .and_then(|s| s.cluster_ips.as_ref())
            .map(|v| v.iter().collect())
            .unwrap_or_default();
        if let Some(ip) = spec.and_then(|s| s.cluster_ip.as_ref()) {
            addrs.push(ip);
        }
        // "None" (headless) does not parse and is skipped: its DNS names pod IPs directly.
        let ips = ips(addrs);
        for ip in &ips {
            self.service_by_ip.insert(*ip, k.clone());
        }
        self.services.insert(k, ips);
    }

    pub fn delete_service(&mut self, svc: &Service) {
        if let Some(k) = key(&svc.metadata) {
            self.delete_service_key(&k);
        }
    }

    fn delete_service_key(&mut self, k: &Key) {
        for ip in self.services.remove(k).unwrap_or_default() {
            if self.service_by_ip.get(&ip) == Some(k) {
                self.service_by_ip.remove(&ip);
            }
        }
    }

    pub fn apply_slice(&mut self, slice: &EndpointSlice) {
        let Some(k) = key(&slice.metadata) else {
            return;
        };
        let Some(service) = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/service-name"))
        else {
            return;
        };
        if self.full() && !self.slices.contains_key(&k) {
            return;
        }
        let pods = slice
            .endpoints
            .iter()
            .filter_map(|e| {
                let t = e.target_ref.as_ref()?;
                if t.kind.as_deref() != Some("Pod") {
                    return None;
                }
                let ns = t.namespace.as_deref().unwrap_or(&k.0);
                Some((Arc::from(ns), Arc::from(t.name.as_deref()?)))
            })
            .collect();
        self.slices.insert(
            k.clone(),
            SliceEntry {
                service: (k.0.clone(), Arc::from(service.as_str())),
                pods,
            },
        );
    }

    pub fn delete_slice(&mut self, slice: &EndpointSlice) {
        if let Some(k) = key(&slice.metadata) {
            self.slices.remove(&k);
        }
    }

    /// Forgets every object of a kind (a watcher re-list starts over).
    pub fn clear(&mut self, kind: ObjectKind) {
        match kind {
            ObjectKind::Pod => {
                self.pods.clear();
                self.pod_by_ip.clear();
                self.pod_by_uid.clear();
            }
            ObjectKind::ReplicaSet => self.replicasets.clear(),
            ObjectKind::Service => {
                self.services.clear();
                self.service_by_ip.clear();
            }
            ObjectKind::EndpointSlice => self.slices.clear(),
        }
    }

    /// A pod's workload from its owner (and its ReplicaSet's owner); `None` if the pod is not
    /// indexed.
    pub fn workload_of_pod(&self, namespace: &str, pod: &str) -> Option<(String, WorkloadKind)> {
        let k: Key = (Arc::from(namespace), Arc::from(pod));
        let p = self.pods.get(&k)?;
        Some(self.workload(&k, p))
    }

    fn workload(&self, k: &Key, p: &PodEntry) -> (String, WorkloadKind) {
        let rs_owner = match &p.owner {
            Some(o) if o.kind == "ReplicaSet" => self
                .replicasets
                .get(&(k.0.clone(), Arc::from(o.name.as_str())))
                .cloned()
                .flatten(),
            _ => None,
        };
        workload_of(&k.1, p.owner.as_ref(), rs_owner.as_ref())
    }

    fn pod_name(&self, k: &Key, container: Option<Arc<str>>) -> Option<WorkloadName> {
        let p = self.pods.get(k)?;
        let (workload, kind) = self.workload(k, p);
        Some(WorkloadName {
            namespace: k.0.clone(),
            workload: Arc::from(workload),
            workload_kind: kind,
            pod: k.1.clone(),
            container,
        })
    }

    /// The pod with this UID (a kubelet cgroup names it when the runtime cannot be asked).
    pub fn name_of_pod_uid(&self, uid: &str) -> Option<WorkloadName> {
        let k = self.pod_by_uid.get(uid)?;
        self.pod_name(k, None)
    }

    /// A pod IP (with the container declaring `port`, if one does) or a Service IP.
    pub fn name_of_ip(&self, ip: IpAddr, port: u16) -> Option<WorkloadName> {
        let ip = ip.to_canonical();
        if let Some(k) = self.pod_by_ip.get(&ip) {
            let container = self
                .pods
                .get(k)?
                .ports
                .iter()
                .find(|(p, _)| *p == port)
                .map(|(_, c)| c.clone());
            return self.pod_name(k, container);
        }
        let svc = self.service_by_ip.get(&ip)?;
        // The workloads behind the Service's endpoints: one → that workload's name.
        let mut workloads: BTreeSet<(String, WorkloadKind)> = BTreeSet::new();
        for s in self.slices.values().filter(|s| &s.service == svc) {
            for pk in &s.pods {
                if let Some(p) = self.pods.get(pk) {
                    workloads.insert(self.workload(pk, p));
                }
            }
        }
        let mut only = workloads.into_iter();
        match (only.next(), only.next()) {
            (Some((workload, kind)), None) => Some(WorkloadName {
                namespace: svc.0.clone(),
                workload: Arc::from(workload),
                workload_kind: kind,
                pod: Arc::from(""),
                container: None,
            }),
            _ => Some(WorkloadName {
                namespace: svc.0.clone(),
                workload: svc.1.clone(),
                workload_kind: WorkloadKind::Service,
                pod: Arc::from(""),
                container: None,
            }),
        }
    }
}

/// The kinds watched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectKind {
    Pod,
    ReplicaSet,
    Service,
    EndpointSlice,
}

const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// Whether in-cluster credentials are present (the API host and the service account token).
pub fn in_cluster() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() && Path::new(TOKEN_PATH).is_file()
}

/// Starts the watches when the agent runs in a cluster; otherwise does nothing.
pub(super) fn spawn_if_in_cluster(
    index: Arc<RwLock<ClusterIndex>>,
    shared: Arc<super::resolver::Shared>,
) {
    if !in_cluster() {
        tracing::info!(
            "no in-cluster credentials: remote addresses are not named from the Kubernetes API"
        );
        return;
    }
    tokio::spawn(watch::run(index, shared));
}

mod watch;

#[cfg(test)]
mod tests;
