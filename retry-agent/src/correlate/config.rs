//! Correlation settings (`--correlate-*`): every one a flag with an env var and a default.
use std::{fmt, str::FromStr};

use clap::Args;

use crate::settings::{InvalidConfig, Settings};

/// How a process is matched to a configured service name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceMatch {
    /// Every process with this comm.
    Comm(String),
    /// Processes with this comm serving on this local port.
    CommPort(String, u16),
    /// One process.
    Pid(u32),
}

/// `comm=name`, `comm:port=name` or `pid:N=name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceOverride {
    pub matcher: ServiceMatch,
    pub name: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("service override {0:?}: expected comm=name, comm:port=name or pid:N=name")]
    BadOverride(String),
}

impl FromStr for ServiceOverride {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ConfigError::BadOverride(s.to_string());
        let (key, name) = s.split_once('=').ok_or_else(bad)?;
        let (key, name) = (key.trim(), name.trim());
        if key.is_empty() || name.is_empty() {
            return Err(bad());
        }
        let matcher = match key.split_once(':') {
            Some(("pid", n)) => ServiceMatch::Pid(n.parse().map_err(|_| bad())?),
            Some((comm, port)) if !comm.is_empty() => {
                ServiceMatch::CommPort(comm.to_string(), port.parse().map_err(|_| bad())?)
            }
            Some(_) => return Err(bad()),
            None => ServiceMatch::Comm(key.to_string()),
        };
        Ok(ServiceOverride {
            matcher,
            name: name.to_string(),
        })
    }
}

/// As its flag form (`comm=name`), so a dump header reads like the command line.
impl serde::Serialize for ServiceOverride {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ServiceOverride {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for ServiceOverride {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.matcher {
            ServiceMatch::Comm(c) => write!(f, "{c}={}", self.name),
            ServiceMatch::CommPort(c, p) => write!(f, "{c}:{p}={}", self.name),
            ServiceMatch::Pid(p) => write!(f, "pid:{p}={}", self.name),
        }
    }
}

/// Correlation: thread context, verdicts, retry detection, edge figures (`--correlate-*`).
#[derive(Args, Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct CorrelateConfig {
    /// How long after an inbound exchange ends its verdict waits for late child exchanges and
    /// overlapping requests on the same thread (milliseconds of capture time).
    #[arg(
        long = "correlate-context-grace-ms",
        alias = "context-grace-ms",
        env = "RETRY_AGENT_CORRELATE_CONTEXT_GRACE_MS",
        default_value_t = 200
    )]
    pub context_grace_ms: u64,
    /// A repeat of a failed or abandoned request within this window is a retry (milliseconds).
    #[arg(
        long = "correlate-retry-window-ms",
        alias = "retry-window-ms",
        env = "RETRY_AGENT_CORRELATE_RETRY_WINDOW_MS",
        default_value_t = 10_000
    )]
    pub retry_window_ms: u64,
    /// Width of one statistics bucket (milliseconds).
    #[arg(
        long = "correlate-stats-bucket-ms",
        alias = "stats-bucket-ms",
        env = "RETRY_AGENT_CORRELATE_STATS_BUCKET_MS",
        default_value_t = 1_000
    )]
    pub stats_bucket_ms: u64,
    /// Buckets in the sliding window edge figures are computed over.
    #[arg(
        long = "correlate-stats-window-buckets",
        alias = "stats-window-buckets",
        env = "RETRY_AGENT_CORRELATE_STATS_WINDOW_BUCKETS",
        default_value_t = 10
    )]
    pub stats_window_buckets: u32,
    /// Failure ratio on any edge or service that marks a fault active (baselines freeze).
    #[arg(
        long = "correlate-fault-failure-ratio",
        alias = "fault-failure-ratio",
        env = "RETRY_AGENT_CORRELATE_FAULT_FAILURE_RATIO",
        default_value_t = 0.05
    )]
    pub fault_failure_ratio: f64,
    /// Own errors of fail-close dependencies that met the retry criteria but were never retried on
    /// an edge that never retries, so the chain keeps at least one retry (at-least-once). It
    /// trusts retry detection: turn it off where a client retries in ways the wire does not show
    /// (to another node's replica through a tunnel, say), or its symptoms would be claimed.
    #[arg(long = "correlate-at-least-once", alias = "at-least-once", env = "RETRY_AGENT_CORRELATE_AT_LEAST_ONCE", default_value_t = true, action = clap::ArgAction::Set)]
    pub at_least_once: bool,
    /// Where thread context cannot link (event loops, goroutines without ids, work handed to
    /// another thread), link a failed inbound request to the one failed outbound call of its
    /// process that completed at most this long before the response was written, if no other
    /// response of the process followed that call as closely (milliseconds; 0 = never link).
    #[arg(
        long = "correlate-timing-link-ms",
        alias = "timing-link-ms",
        env = "RETRY_AGENT_CORRELATE_TIMING_LINK_MS",
        default_value_t = 5
    )]
    pub timing_link_ms: u64,
    /// Learn fail-close vs fail-open per dependency; unclaim only on fail-close failures.
    #[arg(long = "correlate-failure-memory", alias = "failure-memory", env = "RETRY_AGENT_CORRELATE_FAILURE_MEMORY", default_value_t = true, action = clap::ArgAction::Set)]
    pub failure_memory: bool,
    /// Service name overrides: comm=name, comm:port=name or pid:N=name (repeatable, or
    /// comma-separated in the env var).
    #[arg(
        long = "correlate-service-name",
        alias = "service-name",
        env = "RETRY_AGENT_CORRELATE_SERVICE_NAME",
        value_delimiter = ','
    )]
    pub service_names: Vec<ServiceOverride>,
    /// Services named beyond this are folded into "other".
    #[arg(
        long = "correlate-max-services",
        alias = "max-services",
        env = "RETRY_AGENT_CORRELATE_MAX_SERVICES",
        default_value_t = 256
    )]
    pub max_services: usize,
    /// Edges beyond this are folded into one overflow edge.
    #[arg(
        long = "correlate-max-edges",
        alias = "max-edges",
        env = "RETRY_AGENT_CORRELATE_MAX_EDGES",
        default_value_t = 1024
    )]
    pub max_edges: usize,
    /// Threads (or goroutines) with context kept; the least recently seen are evicted (default:
    /// derived from --memory-budget-mib).
    #[arg(
        long = "correlate-max-threads",
        alias = "max-threads",
        env = "RETRY_AGENT_CORRELATE_MAX_THREADS",
        default_value_t = 3456
    )]
    pub max_threads: usize,
    /// Inbound exchanges waiting for their verdict; beyond this they are judged at once (default:
    /// derived from --memory-budget-mib).
    #[arg(
        long = "correlate-max-pending",
        alias = "max-pending",
        env = "RETRY_AGENT_CORRELATE_MAX_PENDING",
        default_value_t = 2304
    )]
    pub max_pending: usize,
    /// Distinct requests remembered for retry matching (default: derived from
    /// --memory-budget-mib).
    #[arg(
        long = "correlate-max-retry-keys",
        alias = "max-retry-keys",
        env = "RETRY_AGENT_CORRELATE_MAX_RETRY_KEYS",
        default_value_t = 12288
    )]
    pub max_retry_keys: usize,
    /// Inbound requests remembered in the processes' histories, all processes together (a busy
    /// process may hold most of them; failed calls and responses are capped at a quarter as
    /// many).
    /// Verdicts that needed what was let go are `missing` (default: derived from
    /// --memory-budget-mib).
    #[arg(
        long = "correlate-max-history",
        alias = "max-history",
        env = "RETRY_AGENT_CORRELATE_MAX_HISTORY",
        default_value_t = 7372
    )]
    pub max_history: usize,
}

impl Default for CorrelateConfig {
    fn default() -> Self {
        crate::settings::defaults()
    }
}

impl Settings for CorrelateConfig {
    fn check(&self, p: &mut InvalidConfig) {
        let mut positive = |flag: &'static str, v: u64| p.check(v > 0, flag, v, "at least 1");
        positive("correlate-stats-bucket-ms", self.stats_bucket_ms);
        positive(
            "correlate-stats-window-buckets",
            u64::from(self.stats_window_buckets),
        );
        positive("correlate-max-services", self.max_services as u64);
        positive("correlate-max-edges", self.max_edges as u64);
        positive("correlate-max-threads", self.max_threads as u64);
        positive("correlate-max-pending", self.max_pending as u64);
        positive("correlate-max-retry-keys", self.max_retry_keys as u64);
        positive("correlate-max-history", self.max_history as u64);
        let buckets = self.stats_window_buckets;
        p.check(
            buckets <= MAX_WINDOW_BUCKETS,
            "correlate-stats-window-buckets",
            buckets,
            "at most 60",
        );
        let ratio = self.fault_failure_ratio;
        p.check(
            ratio > 0.0 && ratio <= 1.0,
            "correlate-fault-failure-ratio",
            ratio,
            "in (0, 1]",
        );
    }
}

/// Buckets are kept in a fixed ring: one more than the longest window.
pub const MAX_WINDOW_BUCKETS: u32 = 60;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn overrides_parse_and_print() {
        for (s, m) in [
            ("python3=orders", ServiceMatch::Comm("python3".into())),
            (
                "python3:8080=orders",
                ServiceMatch::CommPort("python3".into(), 8080),
            ),
            ("pid:42=orders", ServiceMatch::Pid(42)),
        ] {
            let o: ServiceOverride = s.parse().unwrap();
            assert_eq!(o.matcher, m);
            assert_eq!(o.name, "orders");
            assert_eq!(o.to_string(), s);
        }
        for bad in ["orders", "=x", "a=", "pid:x=y", "a:b=c", ":80=x"] {
            assert!(bad.parse::<ServiceOverride>().is_err(), "{bad}");
        }
    }

    #[test]
    fn validation_reports_every_error() {
        let c = CorrelateConfig {
            stats_bucket_ms: 0,
            stats_window_buckets: 99,
            fault_failure_ratio: 0.0,
            ..Default::default()
        };
        assert_eq!(c.validate().unwrap_err().0.len(), 3);
        assert!(CorrelateConfig::default().validate().is_ok());
    }

    // That the defaults are the flag defaults is checked for every config in `settings::tests`.
    #[test]
    fn service_names_repeat() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            c: CorrelateConfig,
        }
        let parsed = T::try_parse_from([
            "t",
            "--correlate-service-name",
            "a=b",
            "--service-name",
            "pid:1=c",
        ])
        .unwrap()
        .c;
        assert_eq!(parsed.service_names.len(), 2);
    }
}
