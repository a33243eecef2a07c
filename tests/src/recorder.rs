//! Helpers for the flight-recorder tests (tests/tests/recorder.rs): a minimal HTTP front for the
//! dump route (the agent's API server mounts the same `dump_api_response`), and a temp dir.
use std::{net::SocketAddr, path::PathBuf};

use retry_agent::recorder::{SharedRecorder, dump_api_response};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
    task::JoinHandle,
};

/// Serves `POST /v1/dump` on a loopback port until dropped (abort the handle).
pub async fn serve_dump_api(rec: SharedRecorder) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    let h = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let rec = rec.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Read the head and a Content-Length body.
                let (head_end, len) = loop {
                    let Ok(n) = s.read(&mut chunk).await else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
                    if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(buf.get(..p).unwrap_or_default()).to_ascii_lowercase();
                        let len = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        break (p + 4, len);
                    }
                };
                while buf.len() < head_end + len {
                    let Ok(n) = s.read(&mut chunk).await else { return };
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
                }
                let ok_route = buf.starts_with(b"POST /v1/dump ");
                let (status, body) = if ok_route {
                    dump_api_response(&rec, buf.get(head_end..).unwrap_or_default()).await
                } else {
                    (404, "{}".to_string())
                };
                let resp = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    Ok((addr, h))
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
