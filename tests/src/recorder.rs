//! Helpers for the flight-recorder tests (tests/tests/recorder.rs): the agent's own API servers
//! (public TCP, private Unix socket with the guarded dump route) around a recorder, and a temp dir.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use retry_agent::{
    api::{self, DumpGate, DumpService, Retention, SharedState},
    metrics::Metrics,
    recorder::SharedRecorder,
};
use tokio::task::JoinHandle;

/// The agent's API around one recorder, as `retry-agent run` serves it; aborted when dropped.
pub struct DumpApi {
    /// The private socket (dumps).
    pub socket: PathBuf,
    /// The public TCP address (metrics and health only).
    pub public: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

impl DumpApi {
    /// `unix:` URL of the private socket, for `request_dump`.
    pub fn url(&self) -> String {
        format!("unix:{}", self.socket.display())
    }
}

impl Drop for DumpApi {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Serves the API with `POST /v1/dump` on a socket in `dir` (dumps go to `dump_dir`), at most
/// one dump started per `min_interval`, `keep` dumps kept.
pub async fn serve_dump_api(
    rec: SharedRecorder,
    dir: &std::path::Path,
    dump_dir: PathBuf,
    min_interval: Duration,
    keep: usize,
) -> anyhow::Result<DumpApi> {
    let state = SharedState::new(Arc::new(Metrics::new()), 16);
    let socket = dir.join("api.sock");
    let unix = api::bind_socket(&socket)?;
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let public = tcp.local_addr()?;
    let dumps = DumpService {
        recorder: rec,
        gate: Arc::new(DumpGate::new(min_interval)),
        retention: Retention {
            dir: dump_dir,
            keep,
            max_bytes: u64::MAX,
        },
    };
    let tasks = vec![
        tokio::spawn(async move {
            let _ = api::serve_public(tcp, state.clone()).await;
        }),
        tokio::spawn({
            let state = SharedState::new(Arc::new(Metrics::new()), 16);
            async move {
                let _ = api::serve_private(unix, state, Some(dumps)).await;
            }
        }),
    ];
    Ok(DumpApi {
        socket,
        public,
        tasks,
    })
}

/// A fresh directory under the temp dir, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("rarecorder-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
