//! The index fed API objects as the API server serves them (fixtures/*.json).
use super::*;

fn load<T: serde::de::DeserializeOwned>(json: &str) -> Vec<T> {
    serde_json::from_str(json).unwrap()
}

fn pods() -> Vec<Pod> {
    load(include_str!("fixtures/pods.json"))
}

fn full_index() -> ClusterIndex {
    let mut ix = ClusterIndex::new(1000);
    for p in pods() {
        ix.apply_pod(&p);
    }
    for rs in load::<ReplicaSet>(include_str!("fixtures/replicasets.json")) {
        ix.apply_replicaset(&rs);
    }
    for s in load::<Service>(include_str!("fixtures/services.json")) {
        ix.apply_service(&s);
    }
    for s in load::<EndpointSlice>(include_str!("fixtures/endpointslices.json")) {
        ix.apply_slice(&s);
    }
    ix
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn pod_ips_name_the_workload_and_the_declaring_container() {
    let ix = full_index();
    let n = ix.name_of_ip(ip("10.244.1.17"), 8080).unwrap();
    assert_eq!(n.to_string(), "shop/orders/app");
    assert_eq!(n.workload_kind, WorkloadKind::Deployment);
    assert_eq!(&*n.pod, "orders-7d9f8c6b5-x2k4p");
    // The sidecar's port names the sidecar; an undeclared port names only the workload.
    assert_eq!(
        ix.name_of_ip(ip("10.244.1.17"), 15001)
            .unwrap()
            .container
            .as_deref(),
        Some("envoy")
    );
    assert_eq!(
        ix.name_of_ip(ip("10.244.1.17"), 9999).unwrap().container,
        None
    );
    // Dual-stack: the second pod IP names the same pod.
    assert_eq!(
        ix.name_of_ip(ip("fd00:10:244:1::11"), 8080)
            .unwrap()
            .service_name(),
        "shop/orders"
    );
    // An IPv4-mapped address is the IPv4 one.
    assert_eq!(
        ix.name_of_ip(ip("::ffff:10.244.2.9"), 8080)
            .unwrap()
            .service_name(),
        "shop/orders"
    );
    let db = ix.name_of_ip(ip("10.244.1.30"), 5432).unwrap();
    assert_eq!(
        (db.to_string(), db.workload_kind),
        ("shop/db/postgres".to_string(), WorkloadKind::StatefulSet)
    );
}

#[test]
fn host_network_and_unknown_ips_are_not_named() {
    let ix = full_index();
    // kube-proxy runs in the host network: its IP is the node's, shared by every such pod.
    assert_eq!(ix.name_of_ip(ip("192.168.0.10"), 10256), None);
    assert_eq!(ix.name_of_ip(ip("10.1.2.3"), 80), None);
}

#[test]
fn service_ips_name_the_one_workload_behind_them_else_the_service() {
    let ix = full_index();
    let n = ix.name_of_ip(ip("10.96.12.34"), 80).unwrap();
    assert_eq!(
        (n.service_name(), n.workload_kind),
        ("shop/orders".to_string(), WorkloadKind::Deployment)
    );
    assert_eq!(&*n.pod, "");
    let m = ix.name_of_ip(ip("10.96.50.1"), 80).unwrap();
    assert_eq!(
        (m.service_name(), m.workload_kind),
        ("shop/mixed".to_string(), WorkloadKind::Service)
    );
}

#[test]
fn without_the_replicaset_the_deployment_is_read_from_its_name() {
    let mut ix = ClusterIndex::new(1000);
    for p in pods() {
        ix.apply_pod(&p);
    }
    assert_eq!(
        ix.workload_of_pod("shop", "orders-7d9f8c6b5-x2k4p"),
        Some(("orders".into(), WorkloadKind::Deployment))
    );
    assert_eq!(
        ix.workload_of_pod("shop", "pending-pod"),
        Some(("pending-pod".into(), WorkloadKind::Pod))
    );
    assert_eq!(
        ix.workload_of_pod("kube-system", "kube-proxy-7xq2w"),
        Some(("kube-proxy".into(), WorkloadKind::DaemonSet))
    );
    assert_eq!(ix.workload_of_pod("shop", "absent"), None);
    let n = ix
        .name_of_pod_uid("3b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d")
        .unwrap();
    assert_eq!(n.service_name(), "shop/db");
}

#[test]
fn deletes_relists_and_ip_reuse() {
    let mut ix = full_index();
    let all = pods();
    ix.delete_pod(&all[0]);
    assert_eq!(ix.name_of_ip(ip("10.244.1.17"), 8080), None);
    // A new pod takes the old IP; deleting the old one again must not unname the new one.
    let mut newer = all[2].clone();
    newer.metadata.name = Some("db-1".into());
    newer.metadata.uid = Some("new".into());
    newer.status.as_mut().unwrap().pod_ips = Some(vec![k8s_openapi::api::core::v1::PodIP {
        ip: "10.244.1.30".into(),
    }]);
    ix.apply_pod(&newer);
    ix.delete_pod(&all[2]);
    assert_eq!(
        &*ix.name_of_ip(ip("10.244.1.30"), 5432).unwrap().pod,
        "db-1"
    );
    // A re-list starts from nothing.
    ix.clear(ObjectKind::Pod);
    assert_eq!(ix.name_of_ip(ip("10.244.2.9"), 8080), None);
    ix.clear(ObjectKind::Service);
    assert_eq!(ix.name_of_ip(ip("10.96.12.34"), 80), None);
}

#[test]
fn the_index_is_bounded() {
    let mut ix = ClusterIndex::new(2);
    for p in pods() {
        ix.apply_pod(&p);
    }
    assert_eq!(ix.len(), 2);
    // An update of a held object still applies.
    let mut first = pods()[0].clone();
    first.status.as_mut().unwrap().pod_ips = Some(vec![k8s_openapi::api::core::v1::PodIP {
        ip: "10.244.9.9".into(),
    }]);
    first.status.as_mut().unwrap().pod_ip = None;
    ix.apply_pod(&first);
    assert!(ix.name_of_ip(ip("10.244.9.9"), 8080).is_some());
    assert_eq!(ix.len(), 2);
}
