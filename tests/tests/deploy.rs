//! The deployment as a cluster would read it: the rendered manifests parsed into the Kubernetes
//! API types (no helm binary installs from the registries here, so the chart's defaults are
//! rendered into deploy/kubernetes/retry-agent.yaml by hand and this test holds the two
//! together), and the Grafana dashboard against the metrics the agent registers.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use std::{collections::BTreeSet, fs, path::PathBuf};

use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{Container, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use serde::Deserialize;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[derive(Default)]
struct Rendered {
    daemonset: Option<DaemonSet>,
    role: Option<ClusterRole>,
    binding: Option<ClusterRoleBinding>,
    account: Option<ServiceAccount>,
    kinds: Vec<String>,
}

fn rendered() -> Rendered {
    let text = fs::read_to_string(root().join("deploy/kubernetes/retry-agent.yaml")).unwrap();
    let mut r = Rendered::default();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v = serde_yaml::Value::deserialize(doc).unwrap();
        let kind = v["kind"].as_str().unwrap().to_string();
        match kind.as_str() {
            "DaemonSet" => r.daemonset = Some(serde_yaml::from_value(v).unwrap()),
            "ClusterRole" => r.role = Some(serde_yaml::from_value(v).unwrap()),
            "ClusterRoleBinding" => r.binding = Some(serde_yaml::from_value(v).unwrap()),
            "ServiceAccount" => r.account = Some(serde_yaml::from_value(v).unwrap()),
            "Namespace" => {}
            other => panic!("unexpected kind {other} in the rendered manifests"),
        }
        r.kinds.push(kind);
    }
    r
}

fn values() -> serde_yaml::Value {
    serde_yaml::from_str(
        &fs::read_to_string(root().join("deploy/helm/retry-agent/values.yaml")).unwrap(),
    )
    .unwrap()
}

fn int(v: &serde_yaml::Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("not an integer: {v:?}"))
}

fn agent(ds: &DaemonSet) -> Container {
    let spec = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    spec.containers
        .iter()
        .find(|c| c.name == "agent")
        .unwrap()
        .clone()
}

fn env(c: &Container, name: &str) -> Option<String> {
    c.env
        .as_ref()?
        .iter()
        .find(|e| e.name == name)?
        .value
        .clone()
}

#[test]
fn the_agent_runs_with_least_privilege() {
    let ds = rendered().daemonset.unwrap();
    let pod = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(
        pod.host_pid,
        Some(true),
        "names processes and reads /proc/PID of every pod"
    );
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.containers.len(), 1, "the shim is off by default");
    let sc = agent(&ds).security_context.unwrap();
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let caps = sc.capabilities.unwrap();
    assert_eq!(caps.drop.unwrap(), vec!["ALL".to_string()]);
    let added: BTreeSet<String> = caps.add.unwrap().into_iter().collect();
    let want: BTreeSet<String> = ["BPF", "PERFMON", "SYS_RESOURCE", "SYS_PTRACE"]
        .map(String::from)
        .into();
    assert_eq!(added, want, "no SYS_ADMIN, and NET_ADMIN only on the shim");
    // Every mount has its volume, and the read-only root has the writable places it needs.
    let volumes: BTreeSet<String> = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .map(|v| v.name.clone())
        .collect();
    let mounts = agent(&ds).volume_mounts.unwrap();
    for m in &mounts {
        assert!(volumes.contains(&m.name), "mount {} has no volume", m.name);
    }
    for writable in ["/run/retry-agent", "/var/lib/retry-agent", "/sys/fs/bpf"] {
        let m = mounts
            .iter()
            .find(|m| m.mount_path == writable)
            .unwrap_or_else(|| panic!("{writable} not mounted"));
        assert_ne!(m.read_only, Some(true), "{writable}");
    }
}

#[test]
fn probes_reach_the_api_under_host_network() {
    let ds = rendered().daemonset.unwrap();
    let c = agent(&ds);
    let vals = values();
    let port = int(&vals["api"]["port"]);
    // The API binds the node's IP (the pod's IP under hostNetwork), where the kubelet probes.
    assert_eq!(vals["api"]["listen"].as_str(), Some("hostIP"));
    assert_eq!(
        env(&c, "RETRY_AGENT_API_ADDR").as_deref(),
        Some(format!("$(HOST_IP):{port}").as_str())
    );
    let envs = c.env.as_ref().unwrap();
    let host_ip = envs.iter().position(|e| e.name == "HOST_IP").unwrap();
    let api = envs
        .iter()
        .position(|e| e.name == "RETRY_AGENT_API_ADDR")
        .unwrap();
    assert!(
        host_ip < api,
        "$(HOST_IP) expands only from an earlier variable"
    );
    let field = envs[host_ip]
        .value_from
        .as_ref()
        .unwrap()
        .field_ref
        .as_ref()
        .unwrap();
    assert_eq!(field.field_path, "status.hostIP");
    let named = c
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .unwrap();
    assert_eq!(named.container_port as u64, port);
    for probe in [
        c.readiness_probe.as_ref().unwrap(),
        c.liveness_probe.as_ref().unwrap(),
    ] {
        let get = probe.http_get.as_ref().unwrap();
        assert_eq!(get.path.as_deref(), Some("/healthz"));
        assert_eq!(
            get.port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("metrics".into())
        );
        assert_eq!(
            get.host, None,
            "the probe goes to the pod IP, which is the node's"
        );
    }
}

#[test]
fn memory_limit_and_bounds_follow_the_values() {
    let ds = rendered().daemonset.unwrap();
    let c = agent(&ds);
    let v = values();
    let (b, m) = (&v["bounds"], &v["memory"]);
    let budget = int(&v["memoryBudgetMiB"]);
    let limit = (budget + int(&m["kernelMiB"])) * (100 + int(&m["headroomPercent"])) / 100;
    let res = c.resources.as_ref().unwrap();
    assert_eq!(
        res.limits.as_ref().unwrap()["memory"].0,
        format!("{limit}Mi")
    );
    // The agent keeps its RSS within the budget; the limit has room for the maps beyond it.
    assert!(limit > budget, "limit {limit} MiB");
    assert_eq!(
        res.requests.as_ref().unwrap()["memory"].0,
        format!("{}Mi", int(&m["requestMiB"]))
    );
    assert_eq!(
        env(&c, "RETRY_AGENT_MEMORY_BUDGET_MIB"),
        Some(budget.to_string())
    );
    // The bounds derive from the budget: none is set on its own (it would win over the budget).
    for flag in retry_agent::cmd::budget::DERIVED_FLAGS {
        let var = format!("RETRY_AGENT_{}", flag.to_uppercase().replace('-', "_"));
        assert_eq!(env(&c, &var), None, "{var} overrides the budget");
    }
    for legacy in ["RETRY_AGENT_RING_BYTES", "RETRY_AGENT_CHANNEL_CAPACITY"] {
        assert_eq!(env(&c, legacy), None, "{legacy} overrides the budget");
    }
    assert_eq!(
        env(&c, "RETRY_AGENT_CAPTURE_PAYLOAD_BYTES"),
        Some(int(&b["payloadBytes"]).to_string())
    );
    let image = format!(
        "{}:{}",
        v["image"]["repository"].as_str().unwrap(),
        v["image"]["tag"].as_str().unwrap()
    );
    assert_eq!(c.image.as_deref(), Some(image.as_str()));
    // The tag follows the workspace version, which `cargo xtask image` tags with.
    assert_eq!(v["image"]["tag"].as_str(), Some(env!("CARGO_PKG_VERSION")));
    let socket = v["identity"]["runtimeSocket"].as_str().unwrap();
    assert_eq!(
        env(&c, "RETRY_AGENT_IDENTITY_RUNTIME_SOCKETS").as_deref(),
        Some(socket)
    );
}

#[test]
fn rbac_is_read_only_on_what_the_watcher_indexes() {
    let r = rendered();
    let role = r.role.unwrap();
    let mut granted: BTreeSet<(String, String)> = BTreeSet::new();
    for rule in role.rules.unwrap() {
        let verbs: BTreeSet<String> = rule.verbs.into_iter().collect();
        assert_eq!(
            verbs,
            ["get", "list", "watch"].map(String::from).into(),
            "read-only"
        );
        for g in rule.api_groups.unwrap() {
            for res in rule.resources.clone().unwrap() {
                granted.insert((g.clone(), res));
            }
        }
    }
    let want: BTreeSet<(String, String)> = [
        ("", "pods"),
        ("", "services"),
        ("discovery.k8s.io", "endpointslices"),
        ("apps", "replicasets"),
    ]
    .map(|(g, r)| (g.to_string(), r.to_string()))
    .into();
    assert_eq!(granted, want);
    let binding = r.binding.unwrap();
    let account = r.account.unwrap();
    let subject = &binding.subjects.unwrap()[0];
    assert_eq!(Some(&subject.name), account.metadata.name.as_ref());
    assert_eq!(subject.namespace, account.metadata.namespace);
    let ds = r.daemonset.unwrap();
    assert_eq!(
        ds.spec.unwrap().template.spec.unwrap().service_account_name,
        account.metadata.name
    );
    assert_eq!(
        r.kinds.first().map(String::as_str),
        Some("Namespace"),
        "created before what lives in it"
    );
}

#[test]
fn the_chart_template_says_what_the_rendered_manifest_says() {
    let tpl = fs::read_to_string(root().join("deploy/helm/retry-agent/templates/daemonset.yaml"))
        .unwrap();
    let rendered = fs::read_to_string(root().join("deploy/kubernetes/retry-agent.yaml")).unwrap();
    // Lines without template expressions must appear in the rendered file as they are, except
    // inside the blocks the defaults leave out (the shim, an empty nodeSelector).
    let mut in_shim = false;
    for line in tpl.lines() {
        if line.contains("{{- if .Values.shim.enabled }}")
            || line.contains("{{- with .Values.nodeSelector }}")
        {
            in_shim = true;
            continue;
        }
        if in_shim {
            in_shim = !line.contains("{{- end }}");
            continue;
        }
        if line.contains("{{") || line.trim().is_empty() {
            continue;
        }
        assert!(
            rendered.contains(line),
            "template line missing from the rendered manifest: {line:?}"
        );
    }
    // The shim's container is in the chart, with its cleanup on termination.
    assert!(tpl.contains(r#"command: ["/usr/bin/retry-agent", "shim", "--cleanup"]"#));
    assert!(tpl.contains("add: [NET_ADMIN, NET_RAW]"));
}

#[test]
fn the_dashboard_reads_metrics_the_agent_registers() {
    let dash: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(root().join("deploy/helm/retry-agent/dashboards/retry-agent.json"))
            .unwrap(),
    )
    .unwrap();
    let src = fs::read_to_string(root().join("retry-agent/src/metrics/mod.rs")).unwrap();
    // Registered names: the first string literal after each `register(` / `register_with_unit(`.
    let mut registered: BTreeSet<String> = BTreeSet::new();
    for part in src.split("register").skip(1) {
        if let Some(start) = part.find('"') {
            let rest = &part[start + 1..];
            if let Some(end) = rest.find('"') {
                registered.insert(format!("retry_agent_{}", &rest[..end]));
            }
        }
    }
    let exprs: Vec<String> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| {
            p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["expr"].as_str().unwrap().to_string())
        })
        .collect();
    assert!(exprs.len() >= 8);
    let mut used = BTreeSet::new();
    for e in &exprs {
        for (i, _) in e.match_indices("retry_agent_") {
            let name: String = e[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let base = name
                .strip_suffix("_total")
                .or_else(|| name.strip_suffix("_per_second"))
                .unwrap_or(&name);
            assert!(
                registered.contains(base),
                "dashboard uses {name}, which the agent does not register"
            );
            used.insert(base.to_string());
        }
    }
    for must in [
        "retry_agent_amplification_factor",
        "retry_agent_verdicts",
        "retry_agent_decisions",
        "retry_agent_storm_radius",
    ] {
        assert!(used.contains(must), "the dashboard lacks {must}");
    }
}
