#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::{path::Path, sync::Arc, time::Duration};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::{
    correlate::ServiceId,
    l7::{Claim, ExchangeId, OutcomeClass},
};

async fn get(addr: SocketAddr, path: &str) -> String {
    ask(
        tokio::net::TcpStream::connect(addr).await.expect("connect"),
        path,
    )
    .await
}

async fn get_unix(sock: &Path, path: &str) -> String {
    ask(
        tokio::net::UnixStream::connect(sock)
            .await
            .expect("connect"),
        path,
    )
    .await
}

async fn ask<S: AsyncReadExt + AsyncWriteExt + Unpin>(mut s: S, path: &str) -> String {
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out))
        .await
        .expect("timeout")
        .expect("read");
    out
}

fn verdict(id: u64) -> Verdict {
    Verdict {
        exchange: ExchangeId(id),
        service: ServiceId::new("b"),
        caller: Some(ServiceId::new("a")),
        claim: Claim::Claimed,
        outcome: OutcomeClass::Transient,
        status: Some(503),
        caused_by: vec![],
        ts_ns: id,
        link: Default::default(),
    }
}

#[tokio::test]
async fn serves_metrics_and_bounded_verdicts() {
    let state = SharedState::new(Arc::new(Metrics::new()), 2);
    state.metrics().observe_capture(5, 1);
    state.record_verdicts(&[verdict(1), verdict(2), verdict(3)]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let dir = std::env::temp_dir().join(format!("ra-api-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sock = dir.join("api.sock");
    let unix = bind_socket(&sock).expect("socket");
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&sock)
                .expect("socket file")
                .permissions()
                .mode()
                & 0o777,
            0o600
        );
    }
    assert!(
        matches!(bind_socket(&sock), Err(ApiError::SocketInUse(_))),
        "a live socket is not taken over"
    );
    let public = tokio::spawn(serve_public(listener, state.clone()));
    let private = tokio::spawn(serve_private(unix, state.clone(), None));

    let m = get(addr, "/metrics").await;
    assert!(m.starts_with("HTTP/1.1 200"), "{m}");
    assert!(m.contains("retry_agent_capture_drops_total 1"), "{m}");
    let v = get_unix(&sock, "/v1/verdicts").await;
    let body = v.split("\r\n\r\n").nth(1).expect("body");
    let parsed: serde_json::Value = serde_json::from_str(body).expect("json");
    let ids: Vec<u64> = parsed
        .as_array()
        .expect("array")
        .iter()
        .map(|v| v["exchange"].as_u64().expect("id"))
        .collect();
    assert_eq!(ids, vec![2, 3], "only the newest verdicts are kept");
    // Before capture reports, /healthz says so.
    let h = get(addr, "/healthz").await;
    assert!(
        h.starts_with("HTTP/1.1 503") && h.contains("capture has not reported yet"),
        "{h}"
    );
    state.health().observe(1, 3);
    assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
    assert!(
        get_unix(&sock, "/healthz")
            .await
            .starts_with("HTTP/1.1 200")
    );
    assert!(get_unix(&sock, "/v1/edges").await.ends_with("[]"));
    assert!(get_unix(&sock, "/nope").await.starts_with("HTTP/1.1 404"));
    // Over TCP, nothing but metrics and health.
    for path in ["/v1/edges", "/v1/verdicts", "/v1/decisions", "/v1/dump"] {
        assert!(
            get(addr, path).await.starts_with("HTTP/1.1 404"),
            "{path} over TCP"
        );
    }
    public.abort();
    private.abort();
    let _ = std::fs::remove_dir_all(&dir);
}
