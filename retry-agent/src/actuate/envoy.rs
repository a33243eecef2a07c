//! Envoy actuator: stops a route's retries into an upstream cluster at runtime, through the admin
//! API. Verified against Envoy 1.40 by tests/tests/envoy.rs.
//!
//! Which cluster: operators name clusters (`backend_orders`, `outbound|8080||orders.shop.svc…`),
//! not after our service ids, so the actuator asks `GET /clusters?format=json` which clusters have
//! an endpoint at one of the decision's callee addresses.
//!
//! The control: Envoy's retry circuit breaker, overridden per cluster in the admin runtime layer
//! (`POST /runtime_modify`, keys in a form body). For each priority (`default`, `high`):
//!   `circuit_breakers.<cluster>.<priority>.max_retries = 0`
//!   `circuit_breakers.<cluster>.<priority>.retry_budget.budget_percent = 0`
//!   `circuit_breakers.<cluster>.<priority>.retry_budget.min_retry_concurrency = 0`
//! (a cluster with a retry budget ignores `max_retries`; the budget keys cover it), plus the marker
//! `retry_agent.suppressed_until.<cluster> = <unix s>`. A refused retry is counted by Envoy in
//! `cluster.<name>.upstream_rq_retry_overflow`; first attempts are untouched. The wildcard callee
//! `*` sets `upstream.use_retry = 0` (every route of that Envoy). Lifting sets each key to the
//! empty value, which removes it from the admin layer.
//!
//! Needs an admin runtime layer in the bootstrap (`layered_runtime.layers[].admin_layer: {}`, see
//! deploy/envoy/); without one Envoy answers 503 "No admin layer specified".
//!
//! Lapse: Envoy's runtime has no TTL. The actuator removes its keys when a decision is lifted or
//! expires and when the agent shuts down, and every [`SWEEP_EVERY`] (and first thing) it removes
//! the keys of any marker whose time has passed — so a killed agent's overrides end when the next
//! agent with this actuator starts, or when Envoy restarts, not before.
use std::{
    fmt,
    net::SocketAddr,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::Deserialize;
use tokio::net::TcpStream;

use super::{
    ActuateError, ActuateFuture, Actuator, addr_list,
    control::unix_ms,
    targets::{FirstError, Held, TargetProxy},
};
use crate::decide::Decision;

pub const DEFAULT_ADMIN: &str = "127.0.0.1:9901";
/// `/clusters` of a large mesh is megabytes; it is read whole, but within this.
const TIMEOUT: Duration = Duration::from_secs(5);
const MAX_BODY: usize = 64 << 20;
/// How often lapsed markers (a dead agent's, or a lost lift) are looked for.
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);
pub const MARKER_PREFIX: &str = "retry_agent.suppressed_until.";
const PRIORITIES: [&str; 2] = ["default", "high"];
const RETRY_KEYS: [&str; 3] = [
    "max_retries",
    "retry_budget.budget_percent",
    "retry_budget.min_retry_concurrency",
];
/// Form encoding: everything but unreserved characters (cluster names carry `|`, `:`, …).
const FORM: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'.')
    .remove(b'-')
    .remove(b'_')
    .remove(b'~');

pub fn default_admin() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9901))
}

/// What one override covers.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    /// Every route of this Envoy (`upstream.use_retry`): the wildcard callee.
    AllRoutes,
    /// Retries into one cluster.
    Cluster(String),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::AllRoutes => f.write_str("every route"),
            Target::Cluster(c) => write!(f, "cluster {c}"),
        }
    }
}

impl Target {
    fn marker(&self) -> String {
        match self {
            Target::AllRoutes => format!("{MARKER_PREFIX}*"),
            Target::Cluster(c) => format!("{MARKER_PREFIX}{c}"),
        }
    }

    fn from_marker(key: &str) -> Option<Target> {
        match key.strip_prefix(MARKER_PREFIX)? {
            "" => None,
            "*" => Some(Target::AllRoutes),
            c => Some(Target::Cluster(c.to_string())),
        }
    }
}

/// The runtime key/value pairs that enforce (`until_s = Some(unix s)`) or lift (`None`) an
/// override on `target`.
pub fn runtime_keys(target: &Target, until_s: Option<u64>) -> Vec<(String, String)> {
    let v = |on: &str| {
        if until_s.is_some() {
            on.to_string()
        } else {
            String::new()
        }
    };
    let mut kv = match target {
        Target::AllRoutes => vec![("upstream.use_retry".to_string(), v("0"))],
        Target::Cluster(c) => PRIORITIES
            .iter()
            .flat_map(|p| {
                RETRY_KEYS
                    .iter()
                    .map(move |k| (format!("circuit_breakers.{c}.{p}.{k}"), v("0")))
            })
            .collect(),
    };
    kv.push((
        target.marker(),
        until_s.map(|s| s.to_string()).unwrap_or_default(),
    ));
    kv
}

/// `k=v&k=v`, form-encoded.
pub fn form_body(kv: &[(String, String)]) -> String {
    let enc = |s: &str| utf8_percent_encode(s, FORM).to_string();
    kv.iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// The part of `/clusters?format=json` the actuator reads.
#[derive(Debug, Default, Deserialize)]
pub struct Clusters {
    #[serde(default)]
    cluster_statuses: Vec<ClusterStatus>,
}

#[derive(Debug, Deserialize)]
struct ClusterStatus {
    name: String,
    #[serde(default)]
    host_statuses: Vec<HostStatus>,
}

#[derive(Debug, Deserialize)]
struct HostStatus {
    #[serde(default)]
    address: Option<HostAddress>,
}

#[derive(Debug, Deserialize)]
struct HostAddress {
    #[serde(default)]
    socket_address: Option<SocketAddress>,
}

#[derive(Debug, Deserialize)]
struct SocketAddress {
    address: String,
    #[serde(default)]
    port_value: u16,
}

impl Clusters {
    /// Names of the clusters with an endpoint at one of `addrs` (an unspecified IP in `addrs`
    /// matches any endpoint on that port), in Envoy's order.
    pub fn holding(&self, addrs: &[SocketAddr]) -> Vec<String> {
        self.cluster_statuses
            .iter()
            .filter(|c| {
                c.host_statuses
                    .iter()
                    .filter_map(|h| h.address.as_ref()?.socket_address.as_ref())
                    .any(|sa| {
                        let Ok(ip) = sa.address.parse::<std::net::IpAddr>() else {
                            return false;
                        };
                        let ep = SocketAddr::new(ip, sa.port_value);
                        addrs.iter().any(|a| super::control::addr_matches(a, &ep))
                    })
            })
            .map(|c| c.name.clone())
            .collect()
    }
}

/// Targets named by lapsed markers in `GET /runtime` (admin-layer entries `MARKER_PREFIX…` whose
/// unix second is at or before `now_s`; an unreadable value counts as lapsed).
pub fn lapsed_markers(runtime: &serde_json::Value, now_s: u64) -> Vec<Target> {
    let Some(entries) = runtime.get("entries").and_then(|e| e.as_object()) else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|(k, e)| {
            let target = Target::from_marker(k)?;
            let v = e
                .get("final_value")
                .and_then(|v| v.as_str())
                .unwrap_or_default();
            v.parse::<u64>()
                .map_or(true, |until| until <= now_s)
                .then_some(target)
        })
        .collect()
}

/// Envoy's admin API: the calls the actuator makes.
pub struct EnvoyAdmin {
    addr: SocketAddr,
}

/// The Envoy actuator: per-cluster overrides held per edge, plus the sweep of lapsed markers.
pub struct EnvoyActuator {
    held: Held<EnvoyAdmin>,
    last_sweep: Option<Instant>,
}

impl EnvoyAdmin {
    /// One admin request on its own connection; returns the status and (bounded) body.
    pub async fn admin(
        &self,
        method: Method,
        path: &str,
        form: Option<String>,
    ) -> Result<(StatusCode, Bytes), ActuateError> {
        let addr = self.addr;
        let http = |e: Box<dyn std::error::Error + Send + Sync>| ActuateError::EnvoyHttp {
            addr,
            source: e,
        };
        let fut = async {
            let stream = TcpStream::connect(addr)
                .await
                .map_err(|source| ActuateError::EnvoyIo { addr, source })?;
            let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| http(e.into()))?;
            // The connection task ends with the response (or the timeout drops it with this future).
            tokio::spawn(conn);
            let mut req = Request::builder()
                .method(method)
                .uri(path)
                .header(header::HOST, addr.to_string());
            if form.is_some() {
                req = req.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
            }
            let req = req
                .body(Full::new(Bytes::from(form.unwrap_or_default())))
                .map_err(|e| http(e.into()))?;
            let resp = tx.send_request(req).await.map_err(|e| http(e.into()))?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(http)?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(TIMEOUT, fut)
            .await
            .map_err(|_| ActuateError::Timeout {
                what: "envoy admin",
            })?
    }

    async fn admin_ok(
        &self,
        method: Method,
        path: &str,
        form: Option<String>,
    ) -> Result<Bytes, ActuateError> {
        let (status, body) = self.admin(method, path, form).await?;
        if status == StatusCode::OK {
            return Ok(body);
        }
        let body = String::from_utf8_lossy(&body).chars().take(200).collect();
        Err(ActuateError::EnvoyStatus {
            addr: self.addr,
            status: status.to_string(),
            body,
        })
    }

    /// `POST /runtime_modify` with the pairs in a form body.
    pub async fn runtime_modify(&self, kv: &[(String, String)]) -> Result<(), ActuateError> {
        self.admin_ok(Method::POST, "/runtime_modify", Some(form_body(kv)))
            .await
            .map(|_| ())
    }

    /// `GET /clusters?format=json`.
    pub async fn clusters(&self) -> Result<Clusters, ActuateError> {
        let body = self
            .admin_ok(Method::GET, "/clusters?format=json", None)
            .await?;
        serde_json::from_slice(&body).map_err(|source| ActuateError::Serialize {
            what: "envoy /clusters",
            source,
        })
    }
}

impl TargetProxy for EnvoyAdmin {
    type Target = Target;
    type Listing = Clusters;

    async fn resolve(
        &self,
        d: &Decision,
        clusters: &mut Option<Clusters>,
    ) -> Result<Vec<Target>, ActuateError> {
        if d.edge.callee.as_str() == "*" {
            return Ok(vec![Target::AllRoutes]);
        }
        if clusters.is_none() {
            *clusters = Some(self.clusters().await?);
        }
        let names = clusters
            .as_ref()
            .map(|c| c.holding(&d.callee_addrs))
            .unwrap_or_default();
        if names.is_empty() {
            return Err(ActuateError::Invalid(format!(
                "no Envoy cluster has an endpoint at {} (callee {})",
                addr_list(&d.callee_addrs),
                d.edge.callee
            )));
        }
        Ok(names.into_iter().map(Target::Cluster).collect())
    }

    async fn set(&self, t: &Target, until_s: u64) -> Result<(), ActuateError> {
        self.runtime_modify(&runtime_keys(t, Some(until_s))).await
    }

    async fn clear(&self, t: &Target) -> Result<(), ActuateError> {
        self.runtime_modify(&runtime_keys(t, None)).await
    }
}

impl EnvoyActuator {
    pub fn new(admin: SocketAddr) -> EnvoyActuator {
        EnvoyActuator {
            held: Held::new(EnvoyAdmin { addr: admin }),
            last_sweep: None,
        }
    }

    /// The admin API this actuator drives.
    pub fn admin(&self) -> &EnvoyAdmin {
        &self.held.proxy
    }

    /// Removes the overrides of lapsed markers, except targets this agent holds right now.
    pub async fn sweep(&mut self) -> Result<(), ActuateError> {
        let admin = &self.held.proxy;
        let body = admin.admin_ok(Method::GET, "/runtime", None).await?;
        let runtime: serde_json::Value =
            serde_json::from_slice(&body).map_err(|source| ActuateError::Serialize {
                what: "envoy /runtime",
                source,
            })?;
        let held = self.held.held();
        let lapsed: Vec<Target> = lapsed_markers(&runtime, unix_ms() / 1000)
            .into_iter()
            .filter(|t| !held.contains(t))
            .collect();
        for t in &lapsed {
            tracing::info!(target = %t, "envoy: removing a lapsed retry override");
            admin.clear(t).await?;
        }
        self.last_sweep = Some(Instant::now());
        Ok(())
    }
}

impl Actuator for EnvoyActuator {
    fn name(&self) -> &'static str {
        "envoy"
    }

    fn apply<'a>(&'a mut self, decisions: &'a [Decision]) -> ActuateFuture<'a> {
        Box::pin(async move {
            let now = Instant::now();
            let mut err = FirstError::default();
            err.note(self.held.apply(decisions, now).await);
            if self
                .last_sweep
                .is_none_or(|t| now.duration_since(t) >= SWEEP_EVERY)
            {
                // A failed sweep waits for the next period too: an unreachable Envoy is reported
                // every SWEEP_EVERY, not every tick.
                if let Err(e) = self.sweep().await {
                    self.last_sweep = Some(now);
                    err.note(Err(e));
                }
            }
            err.into_result()
        })
    }

    fn shutdown(&mut self) -> ActuateFuture<'_> {
        Box::pin(self.held.lift_all())
    }
}
