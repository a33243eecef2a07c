#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::{collections::HashMap, ffi::OsString, fmt::Debug};

use clap::{CommandFactory, Parser};

use crate::settings::*;
use crate::{
    actuate::ActuateConfig,
    api::ApiConfig,
    capture::CaptureConfig,
    cmd::shim::ShimArgs,
    cmd::{Cli, Command},
    correlate::CorrelateConfig,
    decide::DecideConfig,
    identity::IdentityConfig,
    l7::L7Config,
    recorder::RecorderConfig,
};

fn command_of<T: clap::Args>() -> clap::Command {
    T::augment_args(clap::Command::new("t"))
}

fn env_of(flag: &str) -> String {
    format!("RETRY_AGENT_{}", flag.to_uppercase().replace('-', "_"))
}

/// `--flag` names that are modes of a command rather than settings of a stage.
const NOT_SETTINGS: &[&str] = &["cleanup", "watch-pid"];

/// One config struct: its default is its flags' default, it is valid (`valid`: the defaults plus
/// what has no default), and every flag carries the stage's prefix, the matching env var and help.
fn written_once<T: Settings + Default + Debug>(prefix: &str, valid: T, invalid: T) {
    let name = std::any::type_name::<T>();
    assert_eq!(
        format!("{:?}", T::default()),
        format!("{:?}", defaults::<T>()),
        "{name}: Default is not the flag defaults"
    );
    assert!(
        valid.validate().is_ok(),
        "{name}: {valid:?} does not validate: {:?}",
        valid.validate()
    );
    let cmd = command_of::<T>();
    let longs: Vec<&str> = cmd.get_arguments().filter_map(|a| a.get_long()).collect();
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        assert!(
            arg.get_visible_aliases().is_none_or(|v| v.is_empty()),
            "{name}: --{long} has a visible alias (old names are hidden)"
        );
        if NOT_SETTINGS.contains(&long) {
            continue;
        }
        // The memory budget is every stage's: each command that has bounds takes it.
        assert!(
            long == prefix
                || long.starts_with(&format!("{prefix}-"))
                || long == "memory-budget-mib",
            "{name}: --{long} lacks the --{prefix}- prefix"
        );
        let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
        assert_eq!(
            env,
            Some(env_of(long)),
            "{name}: --{long} has the wrong env var"
        );
        assert!(arg.get_help().is_some(), "{name}: --{long} has no help");
    }
    // Every problem a check reports names a real flag of this struct.
    let Err(e) = invalid.validate() else {
        panic!("{name}: accepted {invalid:?}")
    };
    for p in &e.0 {
        assert!(
            longs.contains(&p.flag),
            "{name}: the problem {p} names no flag of it"
        );
    }
}

#[test]
fn every_config_is_written_once_with_one_prefix() {
    written_once("memory", MemoryBudget::default(), MemoryBudget { mib: 1 });
    written_once(
        "capture",
        CaptureConfig::default(),
        CaptureConfig {
            ring_bytes: 3,
            ..Default::default()
        },
    );
    written_once(
        "identity",
        IdentityConfig::default(),
        IdentityConfig {
            max_containers: 0,
            ..Default::default()
        },
    );
    written_once(
        "l7",
        L7Config::default(),
        L7Config {
            max_connections: 0,
            max_inflight: 0,
            ..Default::default()
        },
    );
    written_once(
        "correlate",
        CorrelateConfig::default(),
        CorrelateConfig {
            max_edges: 0,
            fault_failure_ratio: 2.0,
            ..Default::default()
        },
    );
    written_once(
        "decide",
        DecideConfig::default(),
        DecideConfig {
            retry_budget: -1.0,
            decision_ttl_ms: 0,
            ..Default::default()
        },
    );
    let actuate = ActuateConfig {
        haproxy_map: "a b".into(),
        ..Default::default()
    };
    written_once(
        "actuate",
        ActuateConfig::default(),
        ActuateConfig {
            actuators: vec![crate::actuate::ActuatorKind::Haproxy],
            ..actuate
        },
    );
    written_once(
        "recorder",
        RecorderConfig::default(),
        RecorderConfig {
            window_secs: 0,
            auto_before_secs: 10,
            ..Default::default()
        },
    );
    written_once(
        "api",
        ApiConfig::default(),
        ApiConfig {
            max_verdicts: 0,
            ..Default::default()
        },
    );
    // The shim has to be told what to steer: no default can say.
    let shim = ShimArgs {
        dports: vec![8080],
        ..Default::default()
    };
    assert!(
        ShimArgs::default()
            .validate()
            .is_err_and(|e| e.0.iter().all(|p| p.flag == "shim-dport"))
    );
    written_once(
        "shim",
        shim.clone(),
        ShimArgs {
            chain: "bad chain".into(),
            threads: Some(0),
            ..Default::default()
        },
    );
}

/// What `retry-agent run --help` shows: one prefix per stage, nothing else.
#[test]
fn run_flags_carry_their_stage_prefix() {
    let cli = Cli::command();
    let run = cli.find_subcommand("run").expect("run");
    let prefixes = [
        "capture",
        "identity",
        "l7",
        "correlate",
        "decide",
        "actuate",
        "recorder",
        "api",
        "memory",
    ];
    for arg in run
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !a.is_global_set())
    {
        let Some(long) = arg.get_long() else { continue };
        assert!(
            prefixes
                .iter()
                .any(|p| long == *p || long.starts_with(&format!("{p}-"))),
            "run --{long}: not one of the stage prefixes"
        );
    }
}

fn parse(args: &[&str]) -> String {
    let cli = Cli::try_parse_from(std::iter::once("retry-agent").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    match cli.command.expect("a command") {
        Command::Run(a) => format!("{a:?}"),
        Command::Shim(a) => format!("{a:?}"),
        other => panic!("unexpected {other:?}"),
    }
}

/// Every flag renamed for the stage prefixes: (command, old, new, a value other than the default).
const RENAMED: &[(&str, &str, &str, &str)] = &[
    ("run", "ring-bytes", "capture-ring-bytes", "8192"),
    ("run", "payload-bytes", "capture-payload-bytes", "512"),
    ("run", "channel-capacity", "capture-channel-capacity", "7"),
    ("run", "proc-root", "capture-proc-root", "/host/proc"),
    ("run", "wakeup-bytes", "capture-ring-wakeup-bytes", "0"),
    ("run", "poll-ms", "capture-ring-poll-ms", "3"),
    ("run", "tls", "capture-tls", "true"),
    ("run", "tls-lib", "capture-tls-lib", "/lib/libssl.so.3"),
    ("run", "tls-rescan-secs", "capture-tls-rescan-secs", "0"),
    ("run", "context-grace-ms", "correlate-context-grace-ms", "7"),
    ("run", "retry-window-ms", "correlate-retry-window-ms", "7"),
    ("run", "stats-bucket-ms", "correlate-stats-bucket-ms", "7"),
    (
        "run",
        "stats-window-buckets",
        "correlate-stats-window-buckets",
        "7",
    ),
    (
        "run",
        "fault-failure-ratio",
        "correlate-fault-failure-ratio",
        "0.5",
    ),
    ("run", "at-least-once", "correlate-at-least-once", "false"),
    ("run", "timing-link-ms", "correlate-timing-link-ms", "7"),
    ("run", "failure-memory", "correlate-failure-memory", "false"),
    (
        "run",
        "service-name",
        "correlate-service-name",
        "python3=orders",
    ),
    ("run", "max-services", "correlate-max-services", "7"),
    ("run", "max-edges", "correlate-max-edges", "7"),
    ("run", "max-threads", "correlate-max-threads", "7"),
    ("run", "max-pending", "correlate-max-pending", "7"),
    ("run", "max-retry-keys", "correlate-max-retry-keys", "7"),
    ("run", "retry-budget", "decide-retry-budget", "0.2"),
    (
        "run",
        "amplification-threshold",
        "decide-amplification-threshold",
        "2",
    ),
    ("run", "decision-ttl-ms", "decide-ttl-ms", "7"),
    ("run", "hysteresis-ms", "decide-hysteresis-ms", "7"),
    ("run", "exit-fraction", "decide-exit-fraction", "0.7"),
    ("run", "min-requests", "decide-min-requests", "7"),
    ("run", "min-failures", "decide-min-failures", "7"),
    ("run", "actuators", "actuate", "haproxy"),
    (
        "run",
        "control-socket",
        "actuate-control-socket",
        "/tmp/c.sock",
    ),
    (
        "run",
        "haproxy-socket",
        "actuate-haproxy-socket",
        "/tmp/h.sock",
    ),
    ("run", "haproxy-map", "actuate-haproxy-map", "/m.map"),
    ("run", "envoy-admin", "actuate-envoy-admin", "127.0.0.1:1"),
    (
        "run",
        "decision-log",
        "actuate-decision-log",
        "/tmp/d.jsonl",
    ),
    ("shim", "port", "shim-port", "7"),
    ("shim", "listen", "shim-listen", "127.0.0.1"),
    ("shim", "ipv6", "shim-ipv6", "false"),
    (
        "shim",
        "control-socket",
        "shim-control-socket",
        "/tmp/c.sock",
    ),
    ("shim", "chain", "shim-chain", "X"),
    ("shim", "mark", "shim-mark", "0x1"),
    ("shim", "uid", "shim-uid", "7"),
    ("shim", "cgroup", "shim-cgroup", "/a"),
    ("shim", "dport", "shim-dport", "7"),
    ("shim", "inbound-port", "shim-inbound-port", "7"),
    ("shim", "watchdog", "shim-watchdog", "false"),
    ("shim", "retry-window-ms", "shim-retry-window-ms", "7"),
    ("shim", "retry-budget", "shim-retry-budget", "0.2"),
    ("shim", "throttle-k", "shim-throttle-k", "3"),
    ("shim", "detect-timeout-ms", "shim-detect-timeout-ms", "7"),
    ("shim", "connect-timeout-ms", "shim-connect-timeout-ms", "7"),
    ("shim", "threads", "shim-threads", "7"),
    ("shim", "run-dir", "shim-run-dir", "/tmp/r"),
];

#[test]
fn old_flag_names_still_parse() {
    for (cmd, old, new, value) in RENAMED {
        let (old, new) = (format!("--{old}"), format!("--{new}"));
        let default = parse(&[cmd]);
        let by_new = parse(&[cmd, &new, value]);
        assert_ne!(by_new, default, "{cmd} {new} {value} changed nothing");
        assert_eq!(parse(&[cmd, &old, value]), by_new, "{cmd} {old} {value}");
    }
    // Flags without a value.
    assert_eq!(
        parse(&["shim", "--no-iptables"]),
        parse(&["shim", "--shim-no-iptables"])
    );
    assert_ne!(parse(&["shim", "--no-iptables"]), parse(&["shim"]));
}

#[test]
fn old_env_names_map_to_new_ones() {
    let cli = Cli::command();
    let envs: Vec<String> = ["run", "shim"]
        .iter()
        .flat_map(|c| cli.find_subcommand(c).expect("command").get_arguments())
        .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
        .collect();
    for (old, news) in LEGACY_ENV {
        assert!(
            !envs.iter().any(|e| e == old),
            "{old} is still read directly"
        );
        for new in *news {
            assert!(
                envs.iter().any(|e| e == new),
                "{old} maps to {new}, which no flag reads"
            );
        }
    }
    let env: HashMap<&str, OsString> = [
        ("RETRY_AGENT_RING_BYTES", OsString::from("8192")),
        ("RETRY_AGENT_CONTROL_SOCKET", "/c.sock".into()),
        ("RETRY_AGENT_SHIM_CONTROL_SOCKET", "/s.sock".into()),
    ]
    .into();
    let mut got = legacy_env(|k| env.get(k).cloned());
    got.sort();
    assert_eq!(
        got,
        vec![
            (
                "RETRY_AGENT_CONTROL_SOCKET",
                "RETRY_AGENT_ACTUATE_CONTROL_SOCKET",
                OsString::from("/c.sock")
            ),
            (
                "RETRY_AGENT_RING_BYTES",
                "RETRY_AGENT_CAPTURE_RING_BYTES",
                OsString::from("8192")
            ),
        ],
        "a new name that is set wins over the old one"
    );
}

#[test]
fn every_problem_is_reported_on_its_own_line() {
    let mut p = InvalidConfig::default();
    p.add(&DecideConfig {
        retry_budget: 2.0,
        ..Default::default()
    });
    p.add(&ApiConfig {
        max_verdicts: 0,
        ..Default::default()
    });
    assert_eq!(
        p.to_string(),
        "invalid configuration:\n  --decide-retry-budget 2: must be in [0, 1]\n  --api-max-verdicts 0: must be at least 1"
    );
    assert!(p.into_result().is_err());
    assert!(InvalidConfig::default().into_result().is_ok());
}

/// `trace` and `forensics` check the stage settings they take before doing anything else.
#[tokio::test]
async fn trace_and_forensics_refuse_bad_settings_first() {
    let cli = Cli::try_parse_from([
        "retry-agent",
        "trace",
        "--capture-ring-bytes",
        "3",
        "--l7-max-inflight",
        "0",
    ])
    .unwrap();
    let Some(Command::Trace(args)) = cli.command else {
        panic!("not trace")
    };
    let e = crate::cmd::trace::run(args)
        .await
        .expect_err("bad settings");
    let e = e.downcast_ref::<InvalidConfig>().expect("an InvalidConfig");
    assert_eq!(
        e.0.iter().map(|p| p.flag).collect::<Vec<_>>(),
        ["capture-ring-bytes", "l7-max-inflight"]
    );

    // The dump does not exist: the settings are refused before it is opened.
    let argv = [
        "retry-agent",
        "forensics",
        "/nonexistent.dump",
        "--replay-flags",
        "--decide-retry-budget",
        "2",
    ];
    let Some(Command::Forensics(args)) = Cli::try_parse_from(argv).unwrap().command else {
        panic!("not forensics")
    };
    let e = crate::cmd::forensics::run(args).expect_err("bad settings");
    let e = e.downcast_ref::<InvalidConfig>().expect("an InvalidConfig");
    assert_eq!(
        e.0.iter().map(|p| p.flag).collect::<Vec<_>>(),
        ["decide-retry-budget"]
    );
}

/// A scope that names nothing real is refused before anything loads, naming the flag: a typo
/// must not silently widen (or empty) what the agent observes.
#[test]
fn a_scope_that_names_nothing_is_invalid() {
    let mut p = InvalidConfig::default();
    p.add(&CaptureConfig {
        cgroups: vec!["/nonexistent/cgroup".into()],
        netns: vec!["ralab-a".into()],
        ..Default::default()
    });
    let text = p.to_string();
    assert!(
        text.contains("--capture-cgroup cgroup /nonexistent/cgroup"),
        "{text}"
    );
    assert!(
        text.contains("--capture-netns network namespace \"ralab-a\""),
        "{text}"
    );
    let mut ok = InvalidConfig::default();
    ok.add(&CaptureConfig {
        netns: vec!["net:[4026531840]".into()],
        ..Default::default()
    });
    assert!(ok.into_result().is_ok());
}

/// The pooled h2c connections' settings reach the shim's context as typed values, their
/// defaults are the context's, and zero is refused for either.
#[test]
fn shim_h2_pool_settings() {
    use crate::actuate::shim::proxy::H2Pool;
    let d = ShimArgs::default();
    assert_eq!(
        (d.h2_pool_callers, d.h2_pool_idle_ms),
        (H2Pool::default().callers_per_conn, 10_000)
    );
    let flags = |a: ShimArgs| match a.validate() {
        Ok(()) => Vec::new(),
        Err(e) => e.0.iter().map(|p| p.flag.to_string()).collect::<Vec<_>>(),
    };
    let ok = ShimArgs {
        dports: vec![8080],
        ..Default::default()
    };
    assert_eq!(flags(ok.clone()), Vec::<String>::new());
    assert_eq!(
        flags(ShimArgs {
            h2_pool_callers: 0,
            h2_pool_idle_ms: 0,
            ..ok
        }),
        ["shim-h2-pool-callers", "shim-h2-pool-idle-ms"]
    );
}

/// `--shim-steer cgroup` selects by cgroup directory (and port) and inbound port; iptables
/// selectors and a non-loopback listener are refused with it, and its cgroups need it.
#[test]
fn shim_cgroup_steering_settings() {
    use super::shim::SteerMode;
    let flags = |a: ShimArgs| match a.validate() {
        Ok(()) => Vec::new(),
        Err(e) => e.0.iter().map(|p| p.flag.to_string()).collect::<Vec<_>>(),
    };
    let cg = ShimArgs {
        steer: SteerMode::Cgroup,
        steer_cgroups: vec!["/sys/fs/cgroup/app".into()],
        ..Default::default()
    };
    // No --shim-dport needed: every port of the cgroup is steered.
    assert_eq!(flags(cg.clone()), Vec::<String>::new());
    assert_eq!(
        flags(ShimArgs {
            steer_cgroups: vec![],
            ..cg.clone()
        }),
        ["shim-steer-cgroup"]
    );
    assert_eq!(
        flags(ShimArgs {
            uids: vec![1000],
            listen: "10.0.0.1".parse().expect("ip"),
            ..cg.clone()
        }),
        ["shim-uid", "shim-listen"]
    );
    // Inbound alone is enough.
    assert_eq!(
        flags(ShimArgs {
            steer_cgroups: vec![],
            inbound_ports: vec![80],
            ..cg.clone()
        }),
        Vec::<String>::new()
    );
    assert_eq!(
        flags(ShimArgs {
            steer: SteerMode::Iptables,
            dports: vec![80],
            ..cg
        }),
        ["shim-steer-cgroup"]
    );
}

/// `--shim-inbound-dst` limits iptables' inbound steering; alone, or with cgroup steering
/// (whose sk_lookup takes only local arrivals anyway), it is a mistake said at start.
#[test]
fn shim_inbound_dst_settings() {
    use super::shim::SteerMode;
    let flags = |a: ShimArgs| match a.validate() {
        Ok(()) => Vec::new(),
        Err(e) => e.0.iter().map(|p| p.flag.to_string()).collect::<Vec<_>>(),
    };
    let pods = vec!["10.244.3.0/24".parse().expect("cidr")];
    let ok = ShimArgs {
        inbound_ports: vec![8080],
        inbound_dsts: pods.clone(),
        ..Default::default()
    };
    assert_eq!(flags(ok.clone()), Vec::<String>::new());
    assert_eq!(
        flags(ShimArgs {
            inbound_ports: vec![],
            dports: vec![80],
            ..ok.clone()
        }),
        ["shim-inbound-dst"]
    );
    assert_eq!(
        flags(ShimArgs {
            steer: SteerMode::Cgroup,
            ..ok
        }),
        ["shim-inbound-dst"]
    );
    let cli = crate::cmd::Cli::try_parse_from([
        "retry-agent",
        "shim",
        "--shim-inbound-port",
        "8080",
        "--shim-inbound-dst",
        "10.244.3.0/24,fd00:10:244::/64",
    ]);
    assert!(cli.is_ok(), "{:?}", cli.err());
    assert!(
        crate::cmd::Cli::try_parse_from(["retry-agent", "shim", "--shim-inbound-dst", "pods"])
            .is_err()
    );
}
