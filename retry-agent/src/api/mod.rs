//! HTTP API, on two listeners:
//!
//! - **public** (TCP, `--api-addr`, where Prometheus and the kubelet reach it): `/metrics`
//!   (OpenMetrics) and `/healthz` (503 with a reason unless capture is alive, see [`health`]);
//! - **private** (a Unix socket, `--api-socket`, mode 0600, so only root on the node): the same
//!   two plus `/v1/edges`, `/v1/verdicts` (recent, bounded), `/v1/decisions`, `/v1/paths`,
//!   `/v1/claims` and `POST /v1/dump` (single flight, rate limited, retention-capped, see
//!   [`dumps`]). Nothing that shows traffic or writes to the host is reachable over the network,
//!   so no token has to be provisioned or rotated.
//!
//! Read-only: the pipeline publishes snapshots into [`SharedState`]; handlers never touch the
//! engine, which one task owns.
use std::{
    collections::VecDeque,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard},
    time::Duration,
};

use axum::{
    Json, Router,
    body::Bytes,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::{get, post},
};
use clap::Args;
use serde::Serialize;

use crate::{
    correlate::{EdgeStats, Engine, PathStats, ServiceClaim, Verdict},
    decide::{Decider, Decision},
    metrics::Metrics,
    settings::{InvalidConfig, Settings},
};

pub mod dumps;
pub mod health;
#[cfg(test)]
mod tests;

pub use dumps::{DumpGate, DumpService, Retention};
pub use health::{Health, Unhealthy};

/// API settings (`--api-*`).
#[derive(Args, Debug, Clone)]
pub struct ApiConfig {
    /// TCP address of the public server: /metrics and /healthz only.
    #[arg(
        long = "api-addr",
        env = "RETRY_AGENT_API_ADDR",
        default_value = "127.0.0.1:9464"
    )]
    pub addr: SocketAddr,
    /// Unix socket of the private API (/v1/*, dumps), created mode 0600.
    #[arg(
        long = "api-socket",
        env = "RETRY_AGENT_API_SOCKET",
        default_value = "/run/retry-agent/api.sock"
    )]
    pub socket: PathBuf,
    /// Recent verdicts kept for /v1/verdicts.
    #[arg(
        long = "api-max-verdicts",
        env = "RETRY_AGENT_API_MAX_VERDICTS",
        default_value_t = 1024
    )]
    pub max_verdicts: usize,
    /// Minimum seconds between the starts of two API dumps (0: only one at a time).
    #[arg(
        long = "api-dump-min-interval-secs",
        env = "RETRY_AGENT_API_DUMP_MIN_INTERVAL_SECS",
        default_value_t = 10
    )]
    pub dump_min_interval_secs: u64,
    /// Dumps kept in the dump directory after an API dump (the oldest are removed).
    #[arg(
        long = "api-dump-keep",
        env = "RETRY_AGENT_API_DUMP_KEEP",
        default_value_t = 20
    )]
    pub dump_keep: usize,
    /// Total bytes of dumps kept in the dump directory (the newest is always kept).
    #[arg(long = "api-dump-max-bytes", env = "RETRY_AGENT_API_DUMP_MAX_BYTES", default_value_t = 1 << 30)]
    pub dump_max_bytes: u64,
    /// /healthz fails once the ring reader has not progressed for this many seconds.
    #[arg(
        long = "api-healthz-stall-secs",
        env = "RETRY_AGENT_API_HEALTHZ_STALL_SECS",
        default_value_t = 30
    )]
    pub healthz_stall_secs: u64,
}

impl Default for ApiConfig {
    fn default() -> Self {
        crate::settings::defaults()
    }
}

impl Settings for ApiConfig {
    fn check(&self, p: &mut InvalidConfig) {
        p.check(
            self.max_verdicts > 0,
            "api-max-verdicts",
            self.max_verdicts,
            "at least 1",
        );
        p.check(
            self.socket.is_absolute(),
            "api-socket",
            self.socket.display(),
            "an absolute path",
        );
        p.check(
            self.dump_min_interval_secs <= 86_400,
            "api-dump-min-interval-secs",
            self.dump_min_interval_secs,
            "at most 86400",
        );
        p.check(
            self.dump_keep > 0,
            "api-dump-keep",
            self.dump_keep,
            "at least 1",
        );
        p.check(
            self.dump_max_bytes > 0,
            "api-dump-max-bytes",
            self.dump_max_bytes,
            "at least 1",
        );
        p.check(
            (1..=3600).contains(&self.healthz_stall_secs),
            "api-healthz-stall-secs",
            self.healthz_stall_secs,
            "in 1..=3600",
        );
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("API server failed")]
    Serve(#[source] std::io::Error),
    #[error("cannot create the API socket {}", .path.display())]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("another process already serves the API socket {}", .0.display())]
    SocketInUse(PathBuf),
}

/// What the API serves: the latest published figures.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Snapshot {
    pub edges: Vec<EdgeStats>,
    pub paths: PathStats,
    pub decisions: Vec<Decision>,
    pub claims: Vec<ServiceClaim>,
    /// Newest last.
    pub verdicts: VecDeque<Verdict>,
}

/// Cheap to clone: the metrics registry and the latest snapshot, shared with the pipeline.
#[derive(Clone)]
pub struct SharedState {
    metrics: Arc<Metrics>,
    snapshot: Arc<RwLock<Snapshot>>,
    max_verdicts: usize,
    health: Health,
}

/// The stall window of `/healthz` when none is configured.
const DEFAULT_STALL: Duration = Duration::from_secs(30);

impl SharedState {
    pub fn new(metrics: Arc<Metrics>, max_verdicts: usize) -> Self {
        SharedState {
            metrics,
            snapshot: Arc::default(),
            max_verdicts: max_verdicts.max(1),
            health: Health::new(DEFAULT_STALL),
        }
    }

    /// With `/healthz` failing after `stall` without reader progress.
    pub fn with_healthz_stall(mut self, stall: Duration) -> Self {
        self.health = Health::new(stall);
        self
    }

    /// Where the run loop reports capture progress.
    pub fn health(&self) -> &Health {
        &self.health
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Keep the newest verdicts (bounded) and count them in the metrics is the caller's choice:
    /// this only stores them for `/v1/verdicts`.
    pub fn record_verdicts(&self, verdicts: &[Verdict]) {
        if verdicts.is_empty() {
            return;
        }
        let mut s = self.write();
        let skip = verdicts.len().saturating_sub(self.max_verdicts);
        for v in verdicts.iter().skip(skip) {
            if s.verdicts.len() >= self.max_verdicts {
                s.verdicts.pop_front();
            }
            s.verdicts.push_back(v.clone());
        }
    }

    /// Publish the engine's and decider's current figures (and update the metrics from them).
    pub fn publish(&self, engine: &Engine, decider: &Decider) {
        let edges = engine.edges();
        let paths = engine.paths();
        let claims = engine.service_claims();
        let decisions = decider.active();
        self.metrics.observe_edges(&edges);
        self.metrics.observe_paths(&paths);
        self.metrics.observe_engine(&engine.stats());
        let mut s = self.write();
        s.edges = edges;
        s.paths = paths;
        s.claims = claims;
        s.decisions = decisions;
    }

    pub fn snapshot(&self) -> Snapshot {
        self.read().clone()
    }

    // A panic while holding the lock cannot leave the snapshot half-written in a way that
    // matters (each field is replaced whole), so a poisoned lock is still served.
    fn read(&self) -> RwLockReadGuard<'_, Snapshot> {
        self.snapshot.read().unwrap_or_else(|e| e.into_inner())
    }
    fn write(&self) -> RwLockWriteGuard<'_, Snapshot> {
        self.snapshot.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// The public routes: `/metrics` and `/healthz`.
pub fn public_router(state: SharedState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(state)
}

/// Every route but the dump: the public ones and the `/v1/*` views.
pub fn router(state: SharedState) -> Router {
    public_router(state.clone()).merge(
        Router::new()
            .route(
                "/v1/edges",
                get(|State(s): State<SharedState>| async move { Json(s.read().edges.clone()) }),
            )
            .route(
                "/v1/paths",
                get(|State(s): State<SharedState>| async move { Json(s.read().paths.clone()) }),
            )
            .route(
                "/v1/decisions",
                get(|State(s): State<SharedState>| async move { Json(s.read().decisions.clone()) }),
            )
            .route(
                "/v1/claims",
                get(|State(s): State<SharedState>| async move { Json(s.read().claims.clone()) }),
            )
            .route(
                "/v1/verdicts",
                get(|State(s): State<SharedState>| async move { Json(s.read().verdicts.clone()) }),
            )
            .with_state(state),
    )
}

async fn metrics(State(s): State<SharedState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

async fn healthz(State(s): State<SharedState>) -> impl IntoResponse {
    match s.health.check() {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

/// Serves `/metrics` and `/healthz` on an already bound TCP listener (bound by the caller, so a
/// bad address fails start-up and tests can bind port 0).
pub async fn serve_public(
    listener: tokio::net::TcpListener,
    state: SharedState,
) -> Result<(), ApiError> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "metrics and health listening");
    }
    axum::serve(listener, public_router(state))
        .await
        .map_err(ApiError::Serve)
}

/// Serves every route on the private Unix socket, with `POST /v1/dump` when a flight recorder
/// runs.
pub async fn serve_private(
    listener: tokio::net::UnixListener,
    state: SharedState,
    dumps: Option<DumpService>,
) -> Result<(), ApiError> {
    let mut app = router(state);
    if let Some(d) = dumps {
        app = app.merge(Router::new().route("/v1/dump", post(dump)).with_state(d));
    }
    if let Ok(addr) = listener.local_addr()
        && let Some(path) = addr.as_pathname()
    {
        tracing::info!(socket = %path.display(), "API listening");
    }
    axum::serve(listener, app).await.map_err(ApiError::Serve)
}

/// Binds the private socket, mode 0600 in a 0700 directory it creates if missing. A socket file
/// left by a dead agent is replaced; one a live process answers on is not.
pub fn bind_socket(path: &Path) -> Result<tokio::net::UnixListener, ApiError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let err = |source| ApiError::Socket {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
        && !dir.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(err)?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ApiError::SocketInUse(path.to_path_buf()));
        }
        std::fs::remove_file(path).map_err(err)?;
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    Ok(listener)
}

async fn dump(State(d): State<DumpService>, body: Bytes) -> impl IntoResponse {
    let (status, json) = d.handle(&body).await;
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        json,
    )
}
