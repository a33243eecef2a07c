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

/// The names of a pod's volumes.
fn volume_names(pod: &k8s_openapi::api::core::v1::PodSpec) -> BTreeSet<String> {
    pod.volumes
        .as_ref()
        .unwrap()
        .iter()
        .map(|v| v.name.clone())
        .collect()
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
    let volumes = volume_names(pod);
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
    // The chart's capture settings are the agent's defaults.
    let summarize = v["capture"]["summarize"].as_bool().unwrap();
    assert_eq!(
        summarize,
        retry_agent::capture::CaptureConfig::default().summarize
    );
    assert_eq!(
        env(&c, "RETRY_AGENT_CAPTURE_SUMMARIZE"),
        Some(summarize.to_string())
    );
    let every = int(&v["capture"]["summaryEvery"]);
    assert_eq!(
        every,
        u64::from(retry_agent::capture::CaptureConfig::default().summary_every)
    );
    assert_eq!(
        env(&c, "RETRY_AGENT_CAPTURE_SUMMARY_EVERY"),
        Some(every.to_string())
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
    // inside the blocks the defaults leave out (the shim, an empty nodeSelector), however deep
    // the blocks nested in them.
    let mut skipped_depth = 0usize;
    for line in tpl.lines() {
        let shim_only =
            line.trim_start().starts_with("{{- if") && line.contains(".Values.shim.enabled");
        if skipped_depth == 0 && (shim_only || line.contains("{{- with .Values.nodeSelector }}")) {
            skipped_depth = 1;
            continue;
        }
        if skipped_depth > 0 {
            skipped_depth = (skipped_depth + opened(line)).saturating_sub(closed(line));
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

/// Template blocks a line opens (`{{- if`, `{{- with`, `{{- range`), not counting one-line
/// `{{ if … }}…{{ end }}` guards, which `closed` counts as closing what they open.
fn opened(line: &str) -> usize {
    ["{{- if ", "{{ if ", "{{- with ", "{{- range "]
        .iter()
        .map(|o| line.matches(o).count())
        .sum()
}

fn closed(line: &str) -> usize {
    line.matches("{{- end }}").count() + line.matches("{{ end }}").count()
}

/// The lines of the shim's block in the DaemonSet template, and of its `if $cgroup` branch.
fn shim_block(tpl: &str) -> (Vec<&str>, Vec<&str>) {
    let mut block = Vec::new();
    let mut depth = 0usize;
    for line in tpl.lines() {
        if depth == 0 {
            if line.contains("{{- if .Values.shim.enabled }}") {
                depth = 1;
            }
            continue;
        }
        depth = (depth + opened(line)).saturating_sub(closed(line));
        if depth == 0 {
            break;
        }
        block.push(line);
    }
    let mut cgroup = Vec::new();
    let mut inside = false;
    for line in &block {
        let t = line.trim();
        if t == "{{- if $cgroup }}" {
            inside = true;
        } else if inside && (t == "{{- else }}" || t == "{{- end }}") {
            inside = false;
        } else if inside {
            cgroup.push(*line);
        }
    }
    (block, cgroup)
}

/// The shim's command line as its container gives it: its args, then each `RETRY_AGENT_*`
/// variable as the flag that reads it (clap's own table, so a misspelt variable fails here).
fn shim_command_line(c: &Container) -> Vec<String> {
    use clap::CommandFactory;
    let cli = retry_agent::cmd::Cli::command();
    let shim = cli.find_subcommand("shim").unwrap().clone();
    let mut argv = vec!["retry-agent".to_string()];
    argv.extend(c.args.clone().unwrap());
    for e in c.env.as_ref().unwrap() {
        let flag = cli
            .get_arguments()
            .chain(shim.get_arguments())
            .find(|a| a.get_env().is_some_and(|v| v == e.name.as_str()))
            .and_then(|a| a.get_long())
            .unwrap_or_else(|| panic!("the shim reads no variable {}", e.name));
        argv.push(format!("--{flag}"));
        argv.push(e.value.clone().unwrap());
    }
    argv
}

fn shim_args(argv: &[String]) -> retry_agent::cmd::shim::ShimArgs {
    match retry_agent::cmd::parse_from(argv).unwrap().command {
        Some(retry_agent::cmd::Command::Shim(a)) => a,
        other => panic!("not the shim: {other:?}"),
    }
}

/// The shim steered by cgroup programs, as the chart renders it (the hand-rendered example,
/// deploy/kubernetes/retry-agent-shim-cgroup.yaml): the shim accepts its settings, it has the
/// capabilities the programs need and no others, no iptables leftovers (preStop, xtables lock),
/// the cgroup tree it names directories in; and the chart's values and template agree with the
/// shim on what is required and what is refused.
#[test]
fn the_cgroup_shim_follows_the_chart_and_the_shims_settings() {
    use retry_agent::{cmd::shim::SteerMode, settings::Settings};
    let tpl = fs::read_to_string(root().join("deploy/helm/retry-agent/templates/daemonset.yaml"))
        .unwrap();
    let text =
        fs::read_to_string(root().join("deploy/kubernetes/retry-agent-shim-cgroup.yaml")).unwrap();
    let ds: DaemonSet = serde_yaml::from_str(&text).unwrap();
    let pod = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let shim = pod.containers.iter().find(|c| c.name == "shim").unwrap();
    assert_eq!(
        env(&agent(&ds), "RETRY_AGENT_ACTUATORS").as_deref(),
        Some("control,decision-log"),
        "the agent streams decisions to the shim"
    );

    // The shim takes what the container gives it.
    let args = shim_args(&shim_command_line(shim));
    args.validate().unwrap();
    assert_eq!(args.steer, SteerMode::Cgroup);
    assert_eq!(args.inbound_ports, vec![8080]);
    assert_eq!(
        args.steer_cgroups,
        vec![PathBuf::from("/sys/fs/cgroup/system.slice/billing.service")]
    );
    assert_eq!(args.port, int(&values()["shim"]["port"]) as u16);
    // h2c's callers share pooled upstream connections unless the values say otherwise, with
    // the chart's pool settings, which are the shim's own defaults.
    assert_eq!(
        args.h2_upstream,
        retry_agent::actuate::shim::proxy::H2Upstream::Shared
    );
    assert_eq!(values()["shim"]["h2Upstream"].as_str(), Some("shared"));
    let pool = retry_agent::actuate::shim::proxy::H2Pool::default();
    assert_eq!(
        (args.h2_pool_callers, args.h2_pool_idle_ms as u128),
        (pool.callers_per_conn, pool.idle.as_millis())
    );
    assert_eq!(
        (
            int(&values()["shim"]["h2PoolCallers"]) as usize,
            int(&values()["shim"]["h2PoolIdleMs"]) as u128
        ),
        (pool.callers_per_conn, pool.idle.as_millis())
    );

    let sc = shim.security_context.as_ref().unwrap();
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.clone().unwrap(), vec!["ALL".to_string()]);
    let added: BTreeSet<String> = caps.add.clone().unwrap().into_iter().collect();
    assert_eq!(
        added,
        ["BPF", "NET_ADMIN", "SYS_RESOURCE"]
            .map(String::from)
            .into(),
        "load and attach the programs; no NET_RAW, no iptables"
    );
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert!(
        shim.lifecycle.is_none(),
        "no preStop: nothing outlives the shim"
    );
    let volumes = volume_names(pod);
    let mounts = shim.volume_mounts.clone().unwrap();
    for m in &mounts {
        assert!(volumes.contains(&m.name), "mount {} has no volume", m.name);
    }
    let cg = mounts
        .iter()
        .find(|m| m.mount_path == "/sys/fs/cgroup")
        .expect("the cgroup tree the shim opens directories in");
    assert_eq!(cg.read_only, Some(true));
    assert!(!volumes.contains("xtables-lock"), "no iptables lock");

    // The example is the template's cgroup branch, line for line.
    let (block, cgroup_branch) = shim_block(&tpl);
    assert!(cgroup_branch.len() > 5);
    for line in cgroup_branch {
        if !line.contains("{{") && !line.trim().is_empty() {
            assert!(text.contains(line), "template line missing: {line:?}");
        }
    }
    // Every variable the template may set is one the shim reads (the iptables-only ones too).
    let names: Vec<&str> = block
        .iter()
        .filter_map(|l| l.trim().strip_prefix("- name: RETRY_AGENT_"))
        .collect();
    assert!(names.len() >= 7, "{names:?}");
    let with_env = |name: &str| {
        let c = Container {
            args: Some(vec!["shim".into()]),
            env: Some(vec![k8s_openapi::api::core::v1::EnvVar {
                name: format!("RETRY_AGENT_{name}"),
                value: Some("1".into()),
                ..Default::default()
            }]),
            ..Default::default()
        };
        shim_command_line(&c)
    };
    for n in &names {
        assert_eq!(with_env(n).len(), 4, "{n}");
    }
    // Every value under `shim` is used by the template, and every one it uses exists.
    let vals = values();
    let keys: BTreeSet<String> = vals["shim"]
        .as_mapping()
        .unwrap()
        .keys()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    let used: BTreeSet<String> = tpl
        .split("$shim.")
        .skip(1)
        .chain(tpl.split(".Values.shim.").skip(1))
        .map(|r| {
            r.chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect()
        })
        .collect();
    assert_eq!(keys, used, "values.yaml's shim keys vs the template's");
    assert_eq!(vals["shim"]["steer"].as_str(), Some("iptables"));
    for list in ["dports", "inboundPorts", "inboundDsts", "steerCgroups"] {
        assert!(vals["shim"][list].is_sequence(), "{list}");
    }

    // What the template refuses to render, the shim refuses to run, and the reverse.
    let refused = |flags: &[&str]| {
        let mut argv: Vec<String> = ["retry-agent", "shim"].map(String::from).to_vec();
        argv.extend(flags.iter().map(|f| f.to_string()));
        shim_args(&argv).validate().is_err()
    };
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "--shim-steer",
                "cgroup",
                "--shim-inbound-port",
                "8080",
                "--shim-inbound-dst",
                "10.0.0.0/24",
            ],
            r#"{{- if and $cgroup $shim.inboundDsts }}{{ fail"#,
        ),
        (
            &[
                "--shim-steer-cgroup",
                "/sys/fs/cgroup",
                "--shim-dport",
                "80",
            ],
            r#"{{- if and (not $cgroup) $shim.steerCgroups }}{{ fail"#,
        ),
        (
            &["--shim-steer", "cgroup"],
            r#"{{- if and $cgroup (not (or $shim.steerCgroups $shim.inboundPorts)) }}{{ fail"#,
        ),
        (
            &["--shim-steer", "iptables"],
            r#"{{- if and (not $cgroup) (not (or $shim.dports $shim.inboundPorts)) }}{{ fail"#,
        ),
    ];
    for (flags, guard) in cases {
        assert!(refused(flags), "the shim runs with {flags:?}");
        assert!(tpl.contains(guard), "the chart renders {flags:?}: {guard}");
    }
    for ok in [
        &["--shim-steer", "cgroup", "--shim-inbound-port", "8080"][..],
        &[
            "--shim-steer",
            "cgroup",
            "--shim-steer-cgroup",
            "/sys/fs/cgroup",
        ][..],
        &[
            "--shim-inbound-port",
            "8080",
            "--shim-inbound-dst",
            "10.0.0.0/24",
        ][..],
        &["--shim-dport", "80"][..],
    ] {
        assert!(
            !refused(ok),
            "the shim refuses {ok:?}, which the chart renders"
        );
    }
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
