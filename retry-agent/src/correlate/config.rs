//! Correlation settings: every one a flag with an env var and a default.
use std::{fmt, str::FromStr};

use clap::Args;

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
    #[error("{name} must be {what}, got {value}")]
    OutOfRange { name: &'static str, what: &'static str, value: String },
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
        Ok(ServiceOverride { matcher, name: name.to_string() })
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

pub const DEFAULT_CONTEXT_GRACE_MS: u64 = 200;
pub const DEFAULT_RETRY_WINDOW_MS: u64 = 10_000;
pub const DEFAULT_BUCKET_MS: u64 = 1_000;
pub const DEFAULT_WINDOW_BUCKETS: u32 = 10;
pub const DEFAULT_FAULT_FAILURE_RATIO: f64 = 0.05;
pub const DEFAULT_MAX_SERVICES: usize = 256;
pub const DEFAULT_MAX_EDGES: usize = 1024;
pub const DEFAULT_MAX_THREADS: usize = 32_768;
pub const DEFAULT_MAX_PENDING: usize = 65_536;
pub const DEFAULT_MAX_RETRY_KEYS: usize = 131_072;
pub const DEFAULT_TIMING_LINK_MS: u64 = 5;

/// Correlation: thread context, verdicts, retry detection, edge figures.
#[derive(Args, Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct CorrelateConfig {
    /// How long after an inbound exchange ends its verdict waits for late child exchanges and
    /// overlapping requests on the same thread (milliseconds of capture time).
    #[arg(long, env = "RETRY_AGENT_CONTEXT_GRACE_MS", default_value_t = DEFAULT_CONTEXT_GRACE_MS)]
    pub context_grace_ms: u64,
    /// A repeat of a failed or abandoned request within this window is a retry (milliseconds).
    #[arg(long, env = "RETRY_AGENT_RETRY_WINDOW_MS", default_value_t = DEFAULT_RETRY_WINDOW_MS)]
    pub retry_window_ms: u64,
    /// Width of one statistics bucket (milliseconds).
    #[arg(long, env = "RETRY_AGENT_STATS_BUCKET_MS", default_value_t = DEFAULT_BUCKET_MS)]
    pub stats_bucket_ms: u64,
    /// Buckets in the sliding window edge figures are computed over.
    #[arg(long, env = "RETRY_AGENT_STATS_WINDOW_BUCKETS", default_value_t = DEFAULT_WINDOW_BUCKETS)]
    pub stats_window_buckets: u32,
    /// Failure ratio on any edge or service that marks a fault active (baselines freeze).
    #[arg(long, env = "RETRY_AGENT_FAULT_FAILURE_RATIO", default_value_t = DEFAULT_FAULT_FAILURE_RATIO)]
    pub fault_failure_ratio: f64,
    /// Own errors of fail-close dependencies that met the retry criteria but were never retried on
    /// an edge that never retries, so the chain keeps at least one retry (at-least-once). It
    /// trusts retry detection: turn it off where a client retries in ways the wire does not show
    /// (to another node's replica through a tunnel, say), or its symptoms would be claimed.
    #[arg(long, env = "RETRY_AGENT_AT_LEAST_ONCE", default_value_t = true, action = clap::ArgAction::Set)]
    pub at_least_once: bool,
    /// Where thread context cannot link (event loops, goroutines without ids, work handed to
    /// another thread), link a failed inbound request to the one failed outbound call of its
    /// process that completed at most this long before the response was written, if no other
    /// response of the process followed that call as closely (milliseconds; 0 = never link).
    #[arg(long, env = "RETRY_AGENT_TIMING_LINK_MS", default_value_t = DEFAULT_TIMING_LINK_MS)]
    pub timing_link_ms: u64,
    /// Learn fail-close vs fail-open per dependency; unclaim only on fail-close failures.
    #[arg(long, env = "RETRY_AGENT_FAILURE_MEMORY", default_value_t = true, action = clap::ArgAction::Set)]
    pub failure_memory: bool,
    /// Service name overrides: comm=name, comm:port=name or pid:N=name (repeatable, or
    /// comma-separated in the env var).
    #[arg(long = "service-name", env = "RETRY_AGENT_SERVICE_NAMES", value_delimiter = ',')]
    pub service_names: Vec<ServiceOverride>,
    /// Services named beyond this are folded into "other".
    #[arg(long, env = "RETRY_AGENT_MAX_SERVICES", default_value_t = DEFAULT_MAX_SERVICES)]
    pub max_services: usize,
    /// Edges beyond this are folded into one overflow edge.
    #[arg(long, env = "RETRY_AGENT_MAX_EDGES", default_value_t = DEFAULT_MAX_EDGES)]
    pub max_edges: usize,
    /// Threads (or goroutines) with context kept; the least recently seen are evicted.
    #[arg(long, env = "RETRY_AGENT_MAX_THREADS", default_value_t = DEFAULT_MAX_THREADS)]
    pub max_threads: usize,
    /// Inbound exchanges waiting for their verdict; beyond this they are judged at once.
    #[arg(long, env = "RETRY_AGENT_MAX_PENDING", default_value_t = DEFAULT_MAX_PENDING)]
    pub max_pending: usize,
    /// Distinct requests remembered for retry matching.
    #[arg(long, env = "RETRY_AGENT_MAX_RETRY_KEYS", default_value_t = DEFAULT_MAX_RETRY_KEYS)]
    pub max_retry_keys: usize,
}

impl Default for CorrelateConfig {
    fn default() -> Self {
        CorrelateConfig {
            context_grace_ms: DEFAULT_CONTEXT_GRACE_MS,
            retry_window_ms: DEFAULT_RETRY_WINDOW_MS,
            stats_bucket_ms: DEFAULT_BUCKET_MS,
            stats_window_buckets: DEFAULT_WINDOW_BUCKETS,
            fault_failure_ratio: DEFAULT_FAULT_FAILURE_RATIO,
            at_least_once: true,
            timing_link_ms: DEFAULT_TIMING_LINK_MS,
            failure_memory: true,
            service_names: Vec::new(),
            max_services: DEFAULT_MAX_SERVICES,
            max_edges: DEFAULT_MAX_EDGES,
            max_threads: DEFAULT_MAX_THREADS,
            max_pending: DEFAULT_MAX_PENDING,
            max_retry_keys: DEFAULT_MAX_RETRY_KEYS,
        }
    }
}

impl CorrelateConfig {
    /// Check every setting; all errors at once.
    pub fn validate(&self) -> Result<(), Vec<ConfigError>> {
        let mut errs = Vec::new();
        let mut positive = |name: &'static str, v: u64| {
            if v == 0 {
                errs.push(ConfigError::OutOfRange { name, what: "positive", value: v.to_string() });
            }
        };
        positive("stats-bucket-ms", self.stats_bucket_ms);
        positive("stats-window-buckets", u64::from(self.stats_window_buckets));
        positive("max-services", self.max_services as u64);
        positive("max-edges", self.max_edges as u64);
        positive("max-threads", self.max_threads as u64);
        positive("max-retry-keys", self.max_retry_keys as u64);
        if self.stats_window_buckets > MAX_WINDOW_BUCKETS {
            errs.push(ConfigError::OutOfRange {
                name: "stats-window-buckets",
                what: "at most 60",
                value: self.stats_window_buckets.to_string(),
            });
        }
        if !(self.fault_failure_ratio > 0.0 && self.fault_failure_ratio <= 1.0) {
            errs.push(ConfigError::OutOfRange {
                name: "fault-failure-ratio",
                what: "in (0, 1]",
                value: self.fault_failure_ratio.to_string(),
            });
        }
        if errs.is_empty() { Ok(()) } else { Err(errs) }
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
            ("python3:8080=orders", ServiceMatch::CommPort("python3".into(), 8080)),
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
        let c = CorrelateConfig { stats_bucket_ms: 0, stats_window_buckets: 99, fault_failure_ratio: 0.0, ..Default::default() };
        assert_eq!(c.validate().unwrap_err().len(), 3);
        assert!(CorrelateConfig::default().validate().is_ok());
    }

    #[test]
    fn defaults_match_the_flags() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            c: CorrelateConfig,
        }
        let parsed = T::try_parse_from(["t"]).unwrap().c;
        let d = CorrelateConfig::default();
        assert_eq!(format!("{parsed:?}"), format!("{d:?}"));
        let parsed = T::try_parse_from(["t", "--service-name", "a=b", "--service-name", "pid:1=c"]).unwrap().c;
        assert_eq!(parsed.service_names.len(), 2);
    }
}
