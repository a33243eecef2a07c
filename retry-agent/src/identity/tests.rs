use super::*;

#[test]
fn fallback_names_carry_the_netns_only_off_the_host() {
    let host = Some(4026531840);
    assert_eq!(fallback_name("node", Some(8080), host, host), "node:8080");
    assert_eq!(
        fallback_name("node", Some(8080), Some(4026532001), host),
        "node:8080@netns:4026532001"
    );
    assert_ne!(
        fallback_name("node", Some(8080), Some(4026532001), host),
        fallback_name("node", Some(8080), Some(4026532002), host),
        "two namespaces, same comm and port: two names"
    );
    // Unknown namespaces add nothing rather than guess.
    assert_eq!(fallback_name("node", Some(8080), None, host), "node:8080");
    assert_eq!(fallback_name("node", None, Some(4026532001), None), "node");
}

#[test]
fn names_display_and_service_names() {
    let n = WorkloadName {
        namespace: "shop".into(),
        workload: "orders".into(),
        workload_kind: WorkloadKind::Deployment,
        pod: "orders-7d9f8c6b5-x2k4p".into(),
        container: Some("app".into()),
    };
    assert_eq!(n.to_string(), "shop/orders/app");
    assert_eq!(n.service_name(), "shop/orders");
    let json = serde_json::to_value(&n).unwrap();
    assert_eq!(json["workload_kind"], "deployment");
}

#[test]
fn failure_reasons_are_a_closed_distinct_set() {
    let names: std::collections::HashSet<&str> =
        FailureReason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(names.len(), FailureReason::ALL.len());
    for (i, r) in FailureReason::ALL.iter().enumerate() {
        assert_eq!(r.index(), i);
    }
}

#[tokio::test]
async fn a_disabled_identity_names_nothing_and_an_unreachable_runtime_is_counted() {
    let off = Identity::disabled();
    off.observe(1);
    assert_eq!(off.pid(1), None);
    assert_eq!(off.ip("10.0.0.1".parse().unwrap(), 80), None);

    // A fake /proc whose process sits in a containerd cgroup, and no runtime socket.
    let dir = std::env::temp_dir().join(format!("ra-identity-{}", std::process::id()));
    let id = "3f4e2a1b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f";
    std::fs::create_dir_all(dir.join("42")).unwrap();
    std::fs::write(
        dir.join("42/cgroup"),
        format!("0::/kubepods/besteffort/pod1b2c/{id}\n"),
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("43")).unwrap();
    std::fs::write(dir.join("43/cgroup"), "0::/system.slice/sshd.service\n").unwrap();
    let cfg = IdentityConfig {
        runtime_sockets: vec![dir.join("absent.sock")],
        kube: KubeMode::Off,
        proc_root: dir.clone(),
        ..IdentityConfig::default()
    };
    let (ident, _resolved) = Identity::start(cfg);
    for pid in [42, 43, 44] {
        ident.observe(pid);
    }
    let counted = |r: FailureReason| {
        ident
            .failures()
            .into_iter()
            .find(|(x, _)| *x == r)
            .map_or(0, |(_, n)| n)
    };
    for _ in 0..200 {
        if counted(FailureReason::RuntimeUnreachable) == 1
            && counted(FailureReason::ProcessGone) == 1
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        counted(FailureReason::RuntimeUnreachable),
        1,
        "{:?}",
        ident.failures()
    );
    assert_eq!(
        counted(FailureReason::ProcessGone),
        1,
        "pid 44 has no /proc entry"
    );
    assert_eq!(ident.pid(42), None);
    assert_eq!(ident.pid(43), None);
    // Known pids are not queued again: the failure is not counted twice.
    ident.observe(42);
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert_eq!(counted(FailureReason::RuntimeUnreachable), 1);
    let _ = std::fs::remove_dir_all(&dir);
}
