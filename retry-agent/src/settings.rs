//! How every stage's settings are written, named and checked. Depends on nothing else in the
//! crate, so every stage can use it.
//!
//! - **Written once.** A setting is one field of its stage's config struct: a clap flag with its
//!   env var, default and help. The struct's `Default` is [`defaults`], clap parsing an empty
//!   command line (env vars ignored), so the flag attribute is the only place a default is
//!   written.
//! - **One prefix per stage:** `--capture-*`, `--l7-*`, `--correlate-*`, `--decide-*`,
//!   `--actuate-*`, `--shim-*`, `--recorder-*`, `--api-*`; the env var is `RETRY_AGENT_` and the
//!   flag in upper snake case (`--capture-ring-bytes`: `RETRY_AGENT_CAPTURE_RING_BYTES`). Names
//!   from before the prefixes still work: flags as hidden clap aliases, env vars through
//!   [`LEGACY_ENV`].
//! - **Checked before anything is loaded or bound.** Each config implements [`Settings::check`],
//!   which adds every problem to one [`InvalidConfig`]; commands report them all at once and
//!   `main` exits 64 (EX_USAGE) on it.
use std::{ffi::OsString, fmt};

/// The defaults of a config struct, as its flag attributes state them: clap parses an empty
/// command line with env vars ignored, so `Default` never depends on the environment.
pub fn defaults<T: clap::Args + clap::FromArgMatches>() -> T {
    let cmd = T::augment_args(clap::Command::new("defaults").no_binary_name(true))
        .mut_args(|a| a.env(None));
    cmd.try_get_matches_from(std::iter::empty::<OsString>())
        .and_then(|m| T::from_arg_matches(&m))
        // Every config struct is parsed this way by the settings test: a default that does not
        // parse is a programming error caught there, not something observed at run time.
        .unwrap_or_else(|e| {
            panic!(
                "the flag defaults of {} do not parse: {e}",
                std::any::type_name::<T>()
            )
        })
}

/// A stage's settings: clap flags with defaults, and a check of their values.
pub trait Settings: clap::Args + clap::FromArgMatches + Sized {
    /// Adds every problem with these settings to `problems`.
    fn check(&self, problems: &mut InvalidConfig);

    /// Every problem at once, or `Ok`.
    fn validate(&self) -> Result<(), InvalidConfig> {
        let mut p = InvalidConfig::default();
        self.check(&mut p);
        p.into_result()
    }
}

/// One setting whose value cannot work.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("--{flag} {value}: must be {expected}")]
pub struct Invalid {
    /// The flag, without its dashes.
    pub flag: &'static str,
    pub value: String,
    pub expected: &'static str,
}

/// Every configuration problem found, reported at once; `main` exits 64 (EX_USAGE) on it.
#[derive(Clone, Debug, Default, PartialEq, Eq, thiserror::Error)]
pub struct InvalidConfig(pub Vec<Invalid>);

impl fmt::Display for InvalidConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid configuration:")?;
        for p in &self.0 {
            write!(f, "\n  {p}")?;
        }
        Ok(())
    }
}

impl InvalidConfig {
    /// Records a problem with `--flag value` unless `ok`.
    pub fn check(
        &mut self,
        ok: bool,
        flag: &'static str,
        value: impl fmt::Display,
        expected: &'static str,
    ) {
        if !ok {
            self.0.push(Invalid {
                flag,
                value: value.to_string(),
                expected,
            });
        }
    }

    /// Adds the problems of one stage's settings.
    pub fn add(&mut self, settings: &impl Settings) -> &mut Self {
        settings.check(self);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn into_result(self) -> Result<(), InvalidConfig> {
        if self.0.is_empty() { Ok(()) } else { Err(self) }
    }
}

/// The one memory setting every bound derives from (`--memory-budget-mib`): the kernel ring, the
/// reader's channel, the recorder's ring, the l7 and correlate tables, the shim's caches. A bound
/// given on its own flag wins over its derived value (`cmd::budget` does the arithmetic).
#[derive(clap::Args, Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBudget {
    /// Memory the process may use, in MiB: every bound not given on its own flag is derived from
    /// it, and the resulting ceiling is logged at start. The default keeps the agent's RSS under
    /// 64 MiB with the recorder on.
    #[arg(
        long = "memory-budget-mib",
        env = "RETRY_AGENT_MEMORY_BUDGET_MIB",
        default_value_t = MemoryBudget::DEFAULT_MIB
    )]
    pub mib: u64,
}

impl MemoryBudget {
    pub const DEFAULT_MIB: u64 = 64;
    /// Below this the fixed costs (binary, runtime, BTF) leave nothing for the bounds.
    pub const MIN_MIB: u64 = 32;

    pub fn bytes(&self) -> u64 {
        self.mib.saturating_mul(1 << 20)
    }
}

impl Default for MemoryBudget {
    fn default() -> Self {
        defaults()
    }
}

impl Settings for MemoryBudget {
    fn check(&self, p: &mut InvalidConfig) {
        p.check(
            (Self::MIN_MIB..=1 << 20).contains(&self.mib),
            "memory-budget-mib",
            self.mib,
            "in 32..=1048576",
        );
    }
}

/// Env vars from before the stage prefixes, and the ones that replaced them. Read only when the
/// new one is not set, so a deployment can move over one variable at a time.
pub const LEGACY_ENV: &[(&str, &[&str])] = &[
    (
        "RETRY_AGENT_RING_BYTES",
        &["RETRY_AGENT_CAPTURE_RING_BYTES"],
    ),
    (
        "RETRY_AGENT_PAYLOAD_BYTES",
        &["RETRY_AGENT_CAPTURE_PAYLOAD_BYTES"],
    ),
    (
        "RETRY_AGENT_CHANNEL_CAPACITY",
        &["RETRY_AGENT_CAPTURE_CHANNEL_CAPACITY"],
    ),
    ("RETRY_AGENT_PROC_ROOT", &["RETRY_AGENT_CAPTURE_PROC_ROOT"]),
    (
        "RETRY_AGENT_RING_WAKEUP_BYTES",
        &["RETRY_AGENT_CAPTURE_RING_WAKEUP_BYTES"],
    ),
    (
        "RETRY_AGENT_RING_POLL_MS",
        &["RETRY_AGENT_CAPTURE_RING_POLL_MS"],
    ),
    ("RETRY_AGENT_TLS", &["RETRY_AGENT_CAPTURE_TLS"]),
    ("RETRY_AGENT_TLS_LIBS", &["RETRY_AGENT_CAPTURE_TLS_LIB"]),
    (
        "RETRY_AGENT_TLS_RESCAN_SECS",
        &["RETRY_AGENT_CAPTURE_TLS_RESCAN_SECS"],
    ),
    (
        "RETRY_AGENT_CONTEXT_GRACE_MS",
        &["RETRY_AGENT_CORRELATE_CONTEXT_GRACE_MS"],
    ),
    (
        "RETRY_AGENT_RETRY_WINDOW_MS",
        &["RETRY_AGENT_CORRELATE_RETRY_WINDOW_MS"],
    ),
    (
        "RETRY_AGENT_STATS_BUCKET_MS",
        &["RETRY_AGENT_CORRELATE_STATS_BUCKET_MS"],
    ),
    (
        "RETRY_AGENT_STATS_WINDOW_BUCKETS",
        &["RETRY_AGENT_CORRELATE_STATS_WINDOW_BUCKETS"],
    ),
    (
        "RETRY_AGENT_FAULT_FAILURE_RATIO",
        &["RETRY_AGENT_CORRELATE_FAULT_FAILURE_RATIO"],
    ),
    (
        "RETRY_AGENT_AT_LEAST_ONCE",
        &["RETRY_AGENT_CORRELATE_AT_LEAST_ONCE"],
    ),
    (
        "RETRY_AGENT_TIMING_LINK_MS",
        &["RETRY_AGENT_CORRELATE_TIMING_LINK_MS"],
    ),
    (
        "RETRY_AGENT_FAILURE_MEMORY",
        &["RETRY_AGENT_CORRELATE_FAILURE_MEMORY"],
    ),
    (
        "RETRY_AGENT_SERVICE_NAMES",
        &["RETRY_AGENT_CORRELATE_SERVICE_NAME"],
    ),
    (
        "RETRY_AGENT_MAX_SERVICES",
        &["RETRY_AGENT_CORRELATE_MAX_SERVICES"],
    ),
    (
        "RETRY_AGENT_MAX_EDGES",
        &["RETRY_AGENT_CORRELATE_MAX_EDGES"],
    ),
    (
        "RETRY_AGENT_MAX_THREADS",
        &["RETRY_AGENT_CORRELATE_MAX_THREADS"],
    ),
    (
        "RETRY_AGENT_MAX_PENDING",
        &["RETRY_AGENT_CORRELATE_MAX_PENDING"],
    ),
    (
        "RETRY_AGENT_MAX_RETRY_KEYS",
        &["RETRY_AGENT_CORRELATE_MAX_RETRY_KEYS"],
    ),
    (
        "RETRY_AGENT_RETRY_BUDGET",
        &["RETRY_AGENT_DECIDE_RETRY_BUDGET"],
    ),
    (
        "RETRY_AGENT_AMPLIFICATION_THRESHOLD",
        &["RETRY_AGENT_DECIDE_AMPLIFICATION_THRESHOLD"],
    ),
    (
        "RETRY_AGENT_DECISION_TTL_MS",
        &["RETRY_AGENT_DECIDE_TTL_MS"],
    ),
    (
        "RETRY_AGENT_DECISION_HYSTERESIS_MS",
        &["RETRY_AGENT_DECIDE_HYSTERESIS_MS"],
    ),
    (
        "RETRY_AGENT_DECISION_EXIT_FRACTION",
        &["RETRY_AGENT_DECIDE_EXIT_FRACTION"],
    ),
    (
        "RETRY_AGENT_DECISION_MIN_REQUESTS",
        &["RETRY_AGENT_DECIDE_MIN_REQUESTS"],
    ),
    (
        "RETRY_AGENT_DECISION_MIN_FAILURES",
        &["RETRY_AGENT_DECIDE_MIN_FAILURES"],
    ),
    ("RETRY_AGENT_ACTUATORS", &["RETRY_AGENT_ACTUATE"]),
    // The agent and the shim read the same variable before; both still do.
    (
        "RETRY_AGENT_CONTROL_SOCKET",
        &[
            "RETRY_AGENT_ACTUATE_CONTROL_SOCKET",
            "RETRY_AGENT_SHIM_CONTROL_SOCKET",
        ],
    ),
    (
        "RETRY_AGENT_HAPROXY_SOCKET",
        &["RETRY_AGENT_ACTUATE_HAPROXY_SOCKET"],
    ),
    (
        "RETRY_AGENT_HAPROXY_MAP",
        &["RETRY_AGENT_ACTUATE_HAPROXY_MAP"],
    ),
    (
        "RETRY_AGENT_ENVOY_ADMIN",
        &["RETRY_AGENT_ACTUATE_ENVOY_ADMIN"],
    ),
    (
        "RETRY_AGENT_DECISION_LOG",
        &["RETRY_AGENT_ACTUATE_DECISION_LOG"],
    ),
    ("RETRY_AGENT_SHIM_UIDS", &["RETRY_AGENT_SHIM_UID"]),
    ("RETRY_AGENT_SHIM_CGROUPS", &["RETRY_AGENT_SHIM_CGROUP"]),
    ("RETRY_AGENT_SHIM_DPORTS", &["RETRY_AGENT_SHIM_DPORT"]),
    (
        "RETRY_AGENT_SHIM_INBOUND_PORTS",
        &["RETRY_AGENT_SHIM_INBOUND_PORT"],
    ),
];

/// The new env vars to set from legacy ones: `(old, new, value)` for each legacy variable that is
/// set whose replacement is not. `env` looks a variable up (the process environment in `main`,
/// a map in tests).
pub fn legacy_env(
    env: impl Fn(&str) -> Option<OsString>,
) -> Vec<(&'static str, &'static str, OsString)> {
    let mut out = Vec::new();
    for (old, news) in LEGACY_ENV {
        let Some(value) = env(old) else { continue };
        for new in *news {
            if env(new).is_none() {
                out.push((*old, *new, value.clone()));
            }
        }
    }
    out
}

/// An error and its sources on one line (`outer: cause: root cause`), for messages that leave
/// the process whole: logs, API answers, what a stage keeps of an error it went on after.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
