use super::*;

const ID: &str = "3f4e2a1b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f";
const UID: &str = "1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d";

fn id() -> ContainerId {
    ContainerId::parse(ID).unwrap()
}

#[test]
fn container_forms_table() {
    let uid_us = UID.replace('-', "_");
    // (cgroup file text, runtime, pod uid, containerd namespace hint)
    let cases: Vec<(String, RuntimeKind, Option<&str>, Option<&str>)> = vec![
        // cgroup v2, kubelet with the systemd driver, containerd
        (
            format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_us}.slice/cri-containerd-{ID}.scope\n"
            ),
            RuntimeKind::Containerd,
            Some(UID),
            None,
        ),
        // cgroup v2, kubelet with the cgroupfs driver (containerd or CRI-O: a bare id)
        (
            format!("0::/kubepods/besteffort/pod{UID}/{ID}\n"),
            RuntimeKind::Unknown,
            Some(UID),
            None,
        ),
        // CRI-O, systemd driver
        (
            format!("0::/kubepods.slice/kubepods-pod{uid_us}.slice/crio-{ID}.scope\n"),
            RuntimeKind::CriO,
            Some(UID),
            None,
        ),
        // Docker, systemd driver (v2)
        (
            format!("0::/system.slice/docker-{ID}.scope\n"),
            RuntimeKind::Docker,
            None,
            None,
        ),
        // Docker, cgroup v1 cgroupfs
        (
            format!(
                "12:memory:/docker/{ID}\n11:cpu,cpuacct:/docker/{ID}\n1:name=systemd:/docker/{ID}\n"
            ),
            RuntimeKind::Docker,
            None,
            None,
        ),
        // Podman
        (
            format!(
                "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container\n"
            ),
            RuntimeKind::Podman,
            None,
            None,
        ),
        // containerd outside Kubernetes (`ctr run`), v1 hybrid host whose v2 line is just `/`
        (
            format!("9:name=systemd:/default/{ID}\n4:memory:/default/{ID}\n0::/\n"),
            RuntimeKind::Containerd,
            None,
            Some("default"),
        ),
        // Kubernetes on cgroup v1 with the systemd driver
        (
            format!(
                "11:cpu,cpuacct:/kubepods.slice/kubepods-pod{uid_us}.slice/cri-containerd-{ID}.scope\n\
                 1:name=systemd:/kubepods.slice/kubepods-pod{uid_us}.slice/cri-containerd-{ID}.scope\n0::/\n"
            ),
            RuntimeKind::Containerd,
            Some(UID),
            None,
        ),
    ];
    for (text, runtime, uid, ns) in cases {
        let got = parse(&text).unwrap_or_else(|| panic!("no container in {text:?}"));
        assert_eq!(got.id, id(), "{text}");
        assert_eq!(got.runtime, runtime, "{text}");
        assert_eq!(got.pod_uid.as_deref(), uid, "{text}");
        assert_eq!(got.namespace_hint.as_deref(), ns, "{text}");
    }
}

#[test]
fn host_processes_and_monitors_are_not_containers() {
    for text in [
        "0::/system.slice/sshd.service\n",
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "0::/init.scope\n",
        "0::/\n",
        "12:memory:/\n0::/\n",
        // CRI-O's conmon monitors a container from outside it.
        &format!("0::/kubepods.slice/crio-conmon-{ID}.scope\n"),
        // Not 64 hex digits.
        "0::/default/my-container\n",
        &format!("0::/docker/{}\n", &ID[..63]),
        "",
        "garbage without colons\n",
    ] {
        assert_eq!(parse(text), None, "{text:?}");
    }
}

#[test]
fn the_deepest_id_wins_and_case_is_normalised() {
    let outer = "a".repeat(64);
    let text = format!(
        "0::/docker/{outer}/kubepods/pod{UID}/{}\n",
        ID.to_ascii_uppercase()
    );
    let got = parse(&text).unwrap();
    assert_eq!(got.id, id());
    assert_eq!(got.pod_uid.as_deref(), Some(UID));
}
