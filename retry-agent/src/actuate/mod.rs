//! Stage 5: the only side effects on the network. Decisions go to any set of actuators
//! through one trait; failures are counted and logged, never fatal.
//!
//! Semantics every actuator follows:
//! - `apply` receives *new* decisions (incremental). `SuppressRetries` starts or refreshes a
//!   suppression on the edge for `ttl_ms`; `Allow` lifts it. An actuator that hears nothing more
//!   lets the suppression lapse after its TTL (fail open: a dead agent suppresses nothing for long).
//! - `apply(&[])` is a tick: actuators drop what expired. [`Dispatcher::tick`] does this; call it
//!   about once a second.
//! - `shutdown` (the agent is stopping): remove whatever the actuator set that would not lapse by
//!   itself. [`Dispatcher::shutdown`] calls it once.
//! - `publish_claims` carries the per-service error claim the shim stamps on inbound error
//!   responses (`x-error-claim`): the engine's [`ServiceClaim`]s, the full set each time (about
//!   once a second). How long a claim outlives its last publication is the actuator's business
//!   (the control socket's [`control::CLAIM_TTL`]). Actuators that have no use for claims ignore
//!   them.
//! - What crosses to the shims is [`wire`]'s: versioned wire types, not these.
//! - Each actuator runs on its own task behind a coalescing mailbox ([`Dispatcher`]): an
//!   actuator may be handed only the latest decision per edge (stale ones dropped, counted) and
//!   ticks may merge, so `apply` must not rely on seeing every intermediate decision.
use std::{fmt, future::Future, net::SocketAddr, path::PathBuf, pin::Pin};

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use crate::{
    correlate::ServiceClaim,
    decide::Decision,
    settings::{InvalidConfig, Settings},
};

pub mod control;
pub mod decision_log;
mod dispatch;
pub mod envoy;
pub mod haproxy;
pub mod shim;
pub mod targets;
pub mod wire;

/// Default path of the agent ↔ shim control socket.
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/retry-agent/control.sock";

pub use dispatch::{ActuatorStats, Dispatcher, SHUTDOWN_TIMEOUT};

/// Future returned by [`Actuator`] methods (boxed so the trait stays object safe).
pub type ActuateFuture<'a> = Pin<Box<dyn Future<Output = Result<(), ActuateError>> + Send + 'a>>;

#[derive(Debug, thiserror::Error)]
pub enum ActuateError {
    #[error("control socket {path}: {source}")]
    ControlSocket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("decision log {path}: {source}")]
    DecisionLog {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("haproxy runtime API at {path}: {source}")]
    HaproxyIo {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("haproxy refused `{command}`: {reply}")]
    HaproxyCommand { command: String, reply: String },
    #[error("envoy admin at {addr}: {source}")]
    EnvoyIo {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("envoy admin at {addr}: {source}")]
    EnvoyHttp {
        addr: SocketAddr,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("envoy admin at {addr} answered {status}: {body}")]
    EnvoyStatus {
        addr: SocketAddr,
        status: String,
        body: String,
    },
    #[error("timed out talking to {what}")]
    Timeout { what: &'static str },
    #[error("serializing {what}: {source}")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("actuators need a tokio runtime (call from_config inside one)")]
    NoRuntime,
    #[error("{0}")]
    Invalid(String),
}

/// One side-effecting consumer of decisions.
pub trait Actuator: Send {
    /// Short stable name, used as a metric label and in logs.
    fn name(&self) -> &'static str;
    /// Enforce new decisions (incremental; `&[]` = tick, expire what lapsed).
    fn apply<'a>(&'a mut self, decisions: &'a [Decision]) -> ActuateFuture<'a>;
    /// Replace the per-service claims (full set). Default: not interested.
    fn publish_claims<'a>(&'a mut self, _claims: &'a [ServiceClaim]) -> ActuateFuture<'a> {
        Box::pin(async { Ok(()) })
    }
    /// The agent is stopping: remove what would not lapse by itself. Default: nothing to do.
    fn shutdown(&mut self) -> ActuateFuture<'_> {
        Box::pin(async { Ok(()) })
    }
}

/// Which actuators `retry-agent run` drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActuatorKind {
    /// Serve decisions and claims to shims over the control socket.
    Control,
    /// Drive HAProxy's suppression map through its runtime API (stats socket).
    Haproxy,
    /// Override Envoy's retry circuit breaker per cluster through its admin runtime layer.
    Envoy,
    /// Append every decision as a JSON line to a file.
    DecisionLog,
}

impl fmt::Display for ActuatorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Self::Control => "control",
            Self::Haproxy => "haproxy",
            Self::Envoy => "envoy",
            Self::DecisionLog => "decision-log",
        };
        f.write_str(s)
    }
}

/// Actuation settings (`--actuate-*`; flattened into the `run` arguments).
#[derive(clap::Args, Debug, Clone)]
pub struct ActuateConfig {
    /// Actuators to drive, comma-separated (control, haproxy, envoy, decision-log).
    #[arg(
        long = "actuate",
        alias = "actuators",
        env = "RETRY_AGENT_ACTUATE",
        value_enum,
        value_delimiter = ',',
        default_value = "control,decision-log"
    )]
    pub actuators: Vec<ActuatorKind>,
    /// Unix socket on which shims receive decisions and claims (JSON lines).
    #[arg(long = "actuate-control-socket", alias = "control-socket", env = "RETRY_AGENT_ACTUATE_CONTROL_SOCKET", default_value = DEFAULT_CONTROL_SOCKET)]
    pub control_socket: PathBuf,
    /// HAProxy runtime API socket (`stats socket ... level admin`).
    #[arg(long = "actuate-haproxy-socket", alias = "haproxy-socket", env = "RETRY_AGENT_ACTUATE_HAPROXY_SOCKET", default_value = haproxy::DEFAULT_SOCKET)]
    pub haproxy_socket: PathBuf,
    /// HAProxy suppression map, as named in haproxy.cfg (callee service → suppressed-until unix s).
    #[arg(long = "actuate-haproxy-map", alias = "haproxy-map", env = "RETRY_AGENT_ACTUATE_HAPROXY_MAP", default_value = haproxy::DEFAULT_MAP)]
    pub haproxy_map: String,
    /// Envoy admin address.
    #[arg(long = "actuate-envoy-admin", alias = "envoy-admin", env = "RETRY_AGENT_ACTUATE_ENVOY_ADMIN", default_value = envoy::DEFAULT_ADMIN)]
    pub envoy_admin: SocketAddr,
    /// JSON-lines decision log.
    #[arg(long = "actuate-decision-log", alias = "decision-log", env = "RETRY_AGENT_ACTUATE_DECISION_LOG", default_value = decision_log::DEFAULT_PATH)]
    pub decision_log: PathBuf,
}

impl Default for ActuateConfig {
    fn default() -> Self {
        crate::settings::defaults()
    }
}

impl Settings for ActuateConfig {
    fn check(&self, p: &mut InvalidConfig) {
        let uses = |k| self.actuators.contains(&k);
        if uses(ActuatorKind::Control) {
            check_socket_path(p, "actuate-control-socket", &self.control_socket);
        }
        if uses(ActuatorKind::Haproxy) {
            check_socket_path(p, "actuate-haproxy-socket", &self.haproxy_socket);
            // The name goes into runtime API command lines: whitespace would split the command.
            let map = &self.haproxy_map;
            let ok = !map.is_empty() && !map.chars().any(|c| c.is_whitespace() || c.is_control());
            p.check(
                ok,
                "actuate-haproxy-map",
                format!("{map:?}"),
                "a map name without spaces",
            );
        }
        if uses(ActuatorKind::DecisionLog) {
            let log = &self.decision_log;
            p.check(
                log.file_name().is_some(),
                "actuate-decision-log",
                log.display(),
                "a file path",
            );
        }
    }
}

/// Longest Unix socket path the kernel takes (`sun_path` is 108 bytes with its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// A Unix socket path the kernel will accept (checked up front: bind would only say "invalid").
pub(crate) fn check_socket_path(p: &mut InvalidConfig, flag: &'static str, path: &std::path::Path) {
    let len = path.as_os_str().len();
    let ok = len > 0 && len <= MAX_SOCKET_PATH;
    p.check(ok, flag, path.display(), "a socket path of 1 to 107 bytes");
}

/// `a, b, c`: addresses as users read them (not `[a, b]` Debug output).
pub(crate) fn addr_list(addrs: &[SocketAddr]) -> String {
    if addrs.is_empty() {
        return "no address".into();
    }
    addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Suppressions an actuator holds, keyed by edge, with local expiry. Shared by actuators that
/// must re-send or expire state themselves.
#[derive(Debug, Default)]
pub struct ActiveSet {
    entries: std::collections::BTreeMap<crate::correlate::Edge, (Decision, std::time::Instant)>,
}

/// What changed in an [`ActiveSet`] after an update.
#[derive(Debug, Default, PartialEq)]
pub struct Changes {
    pub upserted: Vec<Decision>,
    pub removed: Vec<Decision>,
}

impl ActiveSet {
    /// Applies new decisions at `now` and expires lapsed ones.
    pub fn update(&mut self, decisions: &[Decision], now: std::time::Instant) -> Changes {
        let mut ch = Changes::default();
        for d in decisions {
            match d.action {
                crate::decide::Action::SuppressRetries => {
                    // Capped TTL, checked addition: a deadline the clock cannot represent is
                    // not enforced (fail open) rather than a panic.
                    let Some(until) = now.checked_add(d.ttl()) else {
                        continue;
                    };
                    self.entries.insert(d.edge.clone(), (d.clone(), until));
                    ch.upserted.push(d.clone());
                }
                crate::decide::Action::Allow => {
                    if let Some((old, _)) = self.entries.remove(&d.edge) {
                        ch.removed.push(old);
                    }
                }
            }
        }
        let expired: Vec<_> = self
            .entries
            .iter()
            .filter(|(_, (_, until))| *until <= now)
            .map(|(e, _)| e.clone())
            .collect();
        for e in expired {
            if let Some((old, _)) = self.entries.remove(&e) {
                ch.removed.push(old);
            }
        }
        ch
    }

    /// Active decisions with their remaining time at `now`.
    pub fn remaining(
        &self,
        now: std::time::Instant,
    ) -> impl Iterator<Item = (&Decision, std::time::Duration)> {
        self.entries.values().filter_map(move |(d, until)| {
            let left = until.saturating_duration_since(now);
            (!left.is_zero()).then_some((d, left))
        })
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests;
