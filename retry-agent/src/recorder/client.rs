//! The ways a dump is asked for: [`request_dump`] (the client `retry-agent dump` uses, over the
//! agent's private Unix socket), the API route body (`dump_api_response`, which the API's guarded
//! `POST /v1/dump` calls), and SIGUSR1.
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};

use super::{DumpReason, SharedRecorder};

/// Body of `POST /v1/dump` (optional; an empty body is fine).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct DumpRequest {
    #[serde(default)]
    pub reason: Option<String>,
}

/// Answer of `POST /v1/dump`.
#[derive(Debug, Serialize, Deserialize)]
pub struct DumpResponse {
    pub path: Option<String>,
    pub error: Option<String>,
}

/// The `POST /v1/dump` route: returns the HTTP status and a JSON body.
pub async fn dump_api_response(rec: &SharedRecorder, body: &[u8]) -> (u16, String) {
    let req: DumpRequest = if body.iter().all(u8::is_ascii_whitespace) {
        DumpRequest::default()
    } else {
        match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => return (400, json(None, Some(format!("bad request body: {e}")))),
        }
    };
    let reason = match req.reason {
        Some(r) => DumpReason::Other(r.chars().take(200).collect()),
        None => DumpReason::OnDemand,
    };
    match rec.dump(reason).await {
        Ok(path) => (200, json(Some(path.display().to_string()), None)),
        Err(super::RecorderError::Disabled) => (
            409,
            json(None, Some("the flight recorder is turned off".into())),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "recorder: on-demand dump failed");
            (500, json(None, Some(crate::settings::error_chain(&e))))
        }
    }
}

fn json(path: Option<String>, error: Option<String>) -> String {
    serde_json::to_string(&DumpResponse { path, error }).unwrap_or_else(|_| "{}".into())
}

/// Write a dump on every SIGUSR1 (for the live agent; spawn once).
pub fn spawn_sigusr1_dumps(rec: SharedRecorder) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let mut sig = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())?;
    Ok(tokio::spawn(async move {
        while sig.recv().await.is_some() {
            match rec.dump(DumpReason::Signal).await {
                Ok(path) => {
                    tracing::info!(path = %path.display(), "recorder: dump written on SIGUSR1")
                }
                Err(e) => tracing::warn!(error = %e, "recorder: SIGUSR1 dump failed"),
            }
        }
    }))
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the API must be unix:/path/to/api.sock or http://host:port, got {0:?}")]
    Url(String),
    #[error("cannot reach the agent at {addr}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the agent did not answer within {} s", .0.as_secs_f64())]
    Timeout(Duration),
    #[error("malformed answer from the agent")]
    Malformed,
    #[error("the agent could not write the dump (HTTP {status}): {message}")]
    Agent { status: u16, message: String },
}

/// Where the agent's API is: its private Unix socket (where it serves dumps), or a plain
/// `http://` base URL (the agent refuses dumps there; kept for other servers of the route).
enum Endpoint<'a> {
    Unix(&'a str),
    Tcp { hostport: &'a str, prefix: &'a str },
}

fn endpoint(api: &str) -> Result<Endpoint<'_>, ClientError> {
    if let Some(path) = api.strip_prefix("unix:") {
        return if path.is_empty() {
            Err(ClientError::Url(api.to_string()))
        } else {
            Ok(Endpoint::Unix(path))
        };
    }
    let rest = api
        .strip_prefix("http://")
        .ok_or_else(|| ClientError::Url(api.to_string()))?;
    let (hostport, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if hostport.is_empty() {
        return Err(ClientError::Url(api.to_string()));
    }
    Ok(Endpoint::Tcp { hostport, prefix })
}

/// One request over `io` (hyper's HTTP/1 client; the connection ends with the answer).
async fn send<I>(io: I, req: hyper::Request<Full<Bytes>>) -> Result<(u16, Bytes), ClientError>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|_| ClientError::Malformed)?;
    tokio::spawn(conn);
    let resp = tx
        .send_request(req)
        .await
        .map_err(|_| ClientError::Malformed)?;
    let status = resp.status().as_u16();
    let body = Limited::new(resp.into_body(), 1 << 20)
        .collect()
        .await
        .map_err(|_| ClientError::Malformed)?;
    Ok((status, body.to_bytes()))
}

/// `POST /v1/dump` to `api` (`unix:/path` or `http://host:port`); returns the dump path the
/// agent wrote.
pub async fn request_dump(
    api: &str,
    reason: Option<String>,
    timeout: Duration,
) -> Result<String, ClientError> {
    let ep = endpoint(api)?;
    let (host, prefix, addr) = match &ep {
        Endpoint::Unix(path) => ("localhost", "", *path),
        Endpoint::Tcp { hostport, prefix } => (*hostport, *prefix, *hostport),
    };
    let body =
        serde_json::to_string(&DumpRequest { reason }).map_err(|_| ClientError::Malformed)?;
    let req = hyper::Request::post(format!("{prefix}/v1/dump"))
        .header(hyper::header::HOST, host)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|_| ClientError::Url(api.to_string()))?;
    let io = |source| ClientError::Connect {
        addr: addr.to_string(),
        source,
    };
    let talk = async {
        match ep {
            Endpoint::Unix(path) => {
                send(
                    tokio::net::UnixStream::connect(path).await.map_err(io)?,
                    req,
                )
                .await
            }
            Endpoint::Tcp { hostport, .. } => {
                send(
                    tokio::net::TcpStream::connect(hostport).await.map_err(io)?,
                    req,
                )
                .await
            }
        }
    };
    let (status, body) = tokio::time::timeout(timeout, talk)
        .await
        .map_err(|_| ClientError::Timeout(timeout))??;
    let parsed: Option<DumpResponse> = serde_json::from_slice(&body).ok();
    match (status, parsed) {
        (200, Some(DumpResponse { path: Some(p), .. })) => Ok(p),
        (
            status,
            Some(DumpResponse {
                error: Some(message),
                ..
            }),
        ) => Err(ClientError::Agent { status, message }),
        (status, _) => {
            let message = String::from_utf8_lossy(&body)
                .trim()
                .chars()
                .take(500)
                .collect();
            Err(ClientError::Agent { status, message })
        }
    }
}
