//! HTTP API: `/metrics` (OpenMetrics), `/v1/edges`, `/v1/verdicts` (recent, bounded),
//! `/v1/decisions`, `/v1/paths`, `/v1/claims`, `/healthz`. Read-only: the pipeline publishes
//! snapshots into [`SharedState`]; handlers never touch the engine, which one task owns.
use std::{
    collections::VecDeque,
    net::SocketAddr,
    sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard},
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
    recorder::{SharedRecorder, dump_api_response},
    settings::{InvalidConfig, Settings},
};

#[cfg(test)]
mod tests;

/// API settings (`--api-*`).
#[derive(Args, Debug, Clone)]
pub struct ApiConfig {
    /// Address of the metrics and JSON API server.
    #[arg(long = "api-addr", env = "RETRY_AGENT_API_ADDR", default_value = "127.0.0.1:9464")]
    pub addr: SocketAddr,
    /// Recent verdicts kept for /v1/verdicts.
    #[arg(long = "api-max-verdicts", env = "RETRY_AGENT_API_MAX_VERDICTS", default_value_t = 1024)]
    pub max_verdicts: usize,
}

impl Default for ApiConfig {
    fn default() -> Self {
        crate::settings::defaults()
    }
}

impl Settings for ApiConfig {
    fn check(&self, p: &mut InvalidConfig) {
        p.check(self.max_verdicts > 0, "api-max-verdicts", self.max_verdicts, "at least 1");
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("API server failed")]
    Serve(#[source] std::io::Error),
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
}

impl SharedState {
    pub fn new(metrics: Arc<Metrics>, max_verdicts: usize) -> Self {
        SharedState { metrics, snapshot: Arc::default(), max_verdicts: max_verdicts.max(1) }
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

pub fn router(state: SharedState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/v1/edges", get(|State(s): State<SharedState>| async move { Json(s.read().edges.clone()) }))
        .route("/v1/paths", get(|State(s): State<SharedState>| async move { Json(s.read().paths.clone()) }))
        .route("/v1/decisions", get(|State(s): State<SharedState>| async move { Json(s.read().decisions.clone()) }))
        .route("/v1/claims", get(|State(s): State<SharedState>| async move { Json(s.read().claims.clone()) }))
        .route("/v1/verdicts", get(|State(s): State<SharedState>| async move { Json(s.read().verdicts.clone()) }))
        .with_state(state)
}

async fn metrics(State(s): State<SharedState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.metrics.encode())
}

/// Serve on an already bound listener (bound by the caller, so a bad address fails start-up
/// and tests can bind port 0), with `POST /v1/dump` when a flight recorder runs.
pub async fn serve(listener: tokio::net::TcpListener, state: SharedState, recorder: Option<SharedRecorder>) -> Result<(), ApiError> {
    let mut app = router(state);
    if let Some(rec) = recorder {
        app = app.merge(Router::new().route("/v1/dump", post(dump)).with_state(rec));
    }
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "API and metrics listening");
    }
    axum::serve(listener, app).await.map_err(ApiError::Serve)
}

async fn dump(State(rec): State<SharedRecorder>, body: Bytes) -> impl IntoResponse {
    let (status, json) = dump_api_response(&rec, &body).await;
    (StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), json)
}
