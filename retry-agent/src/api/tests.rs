#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::{sync::Arc, time::Duration};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::{
    correlate::ServiceId,
    l7::{Claim, ExchangeId, OutcomeClass},
};

async fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.expect("write");
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out)).await.expect("timeout").expect("read");
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
    }
}

#[tokio::test]
async fn serves_metrics_and_bounded_verdicts() {
    let state = SharedState::new(Arc::new(Metrics::new()), 2);
    state.metrics().observe_capture(5, 1);
    state.record_verdicts(&[verdict(1), verdict(2), verdict(3)]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(serve(listener, state, None));

    let m = get(addr, "/metrics").await;
    assert!(m.starts_with("HTTP/1.1 200"), "{m}");
    assert!(m.contains("retry_agent_capture_drops_total 1"), "{m}");
    let v = get(addr, "/v1/verdicts").await;
    let body = v.split("\r\n\r\n").nth(1).expect("body");
    let parsed: serde_json::Value = serde_json::from_str(body).expect("json");
    let ids: Vec<u64> = parsed.as_array().expect("array").iter().map(|v| v["exchange"].as_u64().expect("id")).collect();
    assert_eq!(ids, vec![2, 3], "only the newest verdicts are kept");
    assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
    assert!(get(addr, "/v1/edges").await.ends_with("[]"));
    assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
    server.abort();
}
