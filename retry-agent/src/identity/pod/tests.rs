use super::*;

fn owner(kind: &str, name: &str) -> Owner {
    Owner {
        kind: kind.into(),
        name: name.into(),
    }
}

#[test]
fn labels_name_the_pod_and_container() {
    let labels: HashMap<String, String> = [
        (LABEL_POD_NAME, "orders-7d9f8c6b5-x2k4p"),
        (LABEL_POD_NAMESPACE, "shop"),
        (LABEL_POD_UID, "1b2c"),
        (LABEL_CONTAINER_NAME, "app"),
        ("io.cri-containerd.kind", "container"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let p = pod_labels(&labels).unwrap();
    assert_eq!(
        p,
        PodLabels {
            namespace: "shop".into(),
            pod: "orders-7d9f8c6b5-x2k4p".into(),
            uid: Some("1b2c".into()),
            container: Some("app".into())
        }
    );
    let n = name_container(&p, None);
    assert_eq!(n.to_string(), "shop/orders/app");
    assert_eq!(n.service_name(), "shop/orders");
    assert_eq!(n.workload_kind, WorkloadKind::Deployment);
}

#[test]
fn missing_or_empty_labels_name_nothing() {
    let mut labels: HashMap<String, String> = HashMap::new();
    assert_eq!(pod_labels(&labels), None);
    labels.insert(LABEL_POD_NAME.into(), "x".into());
    assert_eq!(pod_labels(&labels), None);
    labels.insert(LABEL_POD_NAMESPACE.into(), String::new());
    assert_eq!(pod_labels(&labels), None);
    labels.insert(LABEL_POD_NAMESPACE.into(), "ns".into());
    assert_eq!(pod_labels(&labels).unwrap().container, None);
}

#[test]
fn owners_map_to_workloads() {
    let cases: Vec<(Option<Owner>, Option<Owner>, &str, WorkloadKind)> = vec![
        (None, None, "the-pod", WorkloadKind::Pod),
        (
            Some(owner("ReplicaSet", "web-5f6b7c8d9")),
            Some(owner("Deployment", "web")),
            "web",
            WorkloadKind::Deployment,
        ),
        // ReplicaSet not in the index yet: its name's hash is stripped.
        (
            Some(owner("ReplicaSet", "web-5f6b7c8d9")),
            None,
            "web",
            WorkloadKind::Deployment,
        ),
        // A ReplicaSet owned by something else stays the workload.
        (
            Some(owner("ReplicaSet", "rs-x")),
            Some(owner("Rollout", "r")),
            "rs-x",
            WorkloadKind::ReplicaSet,
        ),
        (
            Some(owner("StatefulSet", "db")),
            None,
            "db",
            WorkloadKind::StatefulSet,
        ),
        (
            Some(owner("DaemonSet", "fluentd")),
            None,
            "fluentd",
            WorkloadKind::DaemonSet,
        ),
        (
            Some(owner("Job", "migrate")),
            None,
            "migrate",
            WorkloadKind::Job,
        ),
        (
            Some(owner("Job", "backup-29012345")),
            None,
            "backup",
            WorkloadKind::CronJob,
        ),
        (
            Some(owner("Node", "node-1")),
            None,
            "node-1",
            WorkloadKind::Pod,
        ),
    ];
    for (o, rs, want, kind) in cases {
        assert_eq!(
            workload_of("the-pod", o.as_ref(), rs.as_ref()),
            (want.to_string(), kind),
            "{o:?}"
        );
    }
}

#[test]
fn workloads_guessed_from_pod_names() {
    for (pod, want, kind) in [
        ("orders-7d9f8c6b5-x2k4p", "orders", WorkloadKind::Deployment),
        (
            "my-api-v2-56bd8f6c4d-qk5lz",
            "my-api-v2",
            WorkloadKind::Deployment,
        ),
        ("fluentd-x7k2p", "fluentd", WorkloadKind::Unknown),
        ("db-0", "db", WorkloadKind::Unknown),
        ("db-12", "db", WorkloadKind::Unknown),
        ("etcd-node-01", "etcd-node-01", WorkloadKind::Pod),
        ("standalone", "standalone", WorkloadKind::Pod),
        // vowels are never generated: a human-chosen suffix
        ("web-hello", "web-hello", WorkloadKind::Pod),
        ("-", "-", WorkloadKind::Pod),
        ("", "", WorkloadKind::Pod),
    ] {
        assert_eq!(guess_workload(pod), (want.to_string(), kind), "{pod}");
    }
}
