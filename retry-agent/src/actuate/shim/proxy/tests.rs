//! Protocol detection on first bytes.
use super::*;
use http::StatusCode;

#[test]
fn classify_first_bytes() {
    assert_eq!(classify(b""), None);
    assert_eq!(classify(b"GE"), None);
    assert_eq!(classify(b"GET / HTTP/1.1\r\n"), Some(Detected::Http1));
    assert_eq!(classify(b"DELETE /x HTTP/1.1\r\n"), Some(Detected::Http1));
    assert_eq!(classify(b"PRI * HTTP/2.0\r\n"), None);
    assert_eq!(classify(H2_PREFACE), Some(Detected::H2));
    assert_eq!(classify(b"\x16\x03\x01\x02\x00"), Some(Detected::Opaque));
    assert_eq!(classify(b"hello"), Some(Detected::Opaque));
    assert_eq!(
        classify(b"CONNECT host:443 HTTP/1.1\r\n"),
        Some(Detected::Opaque)
    );
    assert_eq!(
        classify(b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n"),
        Some(Detected::Opaque)
    );
}

#[test]
fn annotate_keeps_an_existing_claim() {
    let mut h = HeaderMap::new();
    annotate_failure(&mut h, Some(Claim::Unclaimed), false);
    assert_eq!(
        h.get(ERROR_CLAIM_HEADER).map(|v| v.as_bytes()),
        Some(&b"unclaimed"[..])
    );
    annotate_failure(&mut h, Some(Claim::Claimed), true);
    assert_eq!(
        h.get(ERROR_CLAIM_HEADER).map(|v| v.as_bytes()),
        Some(&b"unclaimed"[..])
    );
    assert_eq!(
        h.get("grpc-retry-pushback-ms").map(|v| v.as_bytes()),
        Some(&b"-1"[..])
    );
}

/// A local h2c server answering 200 to everything; counts the connections it accepted.
async fn h2_server() -> (SocketAddr, Arc<AtomicU64>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    let accepted = Arc::new(AtomicU64::new(0));
    let n = accepted.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            n.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let svc = service_fn(|_req: Request<Incoming>| async {
                    Ok::<_, std::convert::Infallible>(Response::new(
                        http_body_util::Empty::<Bytes>::new(),
                    ))
                });
                let _ = sconn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    (addr, accepted)
}

fn ctx() -> Ctx {
    Ctx {
        view: crate::actuate::control::ControlView::new(),
        tracker: policy::SharedTracker::new(policy::PolicyConfig::default()),
        mark: 0,
        listen_port: 0,
        kernel_steering: None,
        connect_timeout: Duration::from_secs(5),
        detect_timeout: Duration::from_millis(100),
        preserve_header_case: false,
        stats: Stats::default(),
    }
}

fn get(orig: SocketAddr) -> Request<ReqBody> {
    Request::builder()
        .uri(format!("http://{orig}/"))
        .body(
            http_body_util::Empty::<Bytes>::new()
                .map_err(|never| match never {})
                .boxed_unsync(),
        )
        .expect("request")
}

/// Streams of two downstream connections to one destination share one upstream connection;
/// it lives while a downstream connection does, and the next one dials afresh.
#[tokio::test]
async fn h2_upstream_is_shared_while_a_downstream_connection_lives() {
    let (orig, accepted) = h2_server().await;
    let ctx = ctx();
    let p = Arc::new(pool::H2Pool::default());
    let a = p.lease(orig);
    let b = p.lease(orig);
    for lease in [&a, &b, &a, &b] {
        let (resp, _inflight) = lease.send(get(orig), &ctx).await.expect("response");
        assert_eq!(resp.status(), StatusCode::OK);
    }
    assert_eq!(accepted.load(Ordering::Relaxed), 1);
    assert!(p.has_open(orig));
    drop((a, b));
    assert!(!p.has_open(orig), "no downstream connection: none kept");
    let c = p.lease(orig);
    let (resp, _inflight) = c.send(get(orig), &ctx).await.expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(accepted.load(Ordering::Relaxed), 2);
}

/// A connection full of our streams gets a second one beside it rather than queueing.
#[tokio::test]
async fn h2_upstream_full_of_streams_opens_another() {
    let (orig, accepted) = h2_server().await;
    let ctx = ctx();
    let p = Arc::new(pool::H2Pool::default());
    let a = p.lease(orig);
    let mut held = Vec::new();
    for _ in 0..pool::STREAMS_PER_CONN {
        held.push(a.send(get(orig), &ctx).await.expect("response").1);
    }
    assert_eq!(accepted.load(Ordering::Relaxed), 1);
    let extra = a.send(get(orig), &ctx).await.expect("response");
    assert_eq!(accepted.load(Ordering::Relaxed), 2);
    // Streams that ended make room again on the first.
    drop(held);
    drop(extra);
    let _ = a.send(get(orig), &ctx).await.expect("response");
    assert_eq!(accepted.load(Ordering::Relaxed), 2);
}

/// The same call under two traces is two requests (one's failure makes no retry of the
/// other); the trace id is read as the engine reads it (`traceparent` over `x-request-id`).
#[test]
fn the_request_key_tells_traces_apart() {
    let orig: SocketAddr = "127.0.0.1:8080".parse().expect("addr");
    let info = ConnInfo {
        peer: "127.0.0.1:40000".parse().expect("addr"),
        orig,
        caller: CallerId::Addr("127.0.0.1".parse().expect("ip")),
    };
    let with = |headers: &[(&str, &str)]| {
        let mut r = get(orig);
        for (n, v) in headers {
            r.headers_mut().insert(
                http::HeaderName::from_bytes(n.as_bytes()).expect("name"),
                http::HeaderValue::from_str(v).expect("value"),
            );
        }
        key_of_parts(&r, &info, None)
    };
    let tp = |t: &str| format!("00-{t}-00f067aa0ba902b7-01");
    let (t1, t2) = (
        tp("4bf92f3577b34da6a3ce929d0e0e4736"),
        tp("0af7651916cd43dd8448eb211c80319c"),
    );
    assert_ne!(with(&[("traceparent", &t1)]), with(&[("traceparent", &t2)]));
    assert_eq!(
        with(&[("traceparent", &t1), ("x-request-id", "a")]),
        with(&[("traceparent", &t1), ("x-request-id", "b")]),
        "traceparent ranks over x-request-id"
    );
    assert_ne!(
        with(&[("x-request-id", "a")]),
        with(&[("x-request-id", "b")])
    );
    assert_eq!(with(&[]), with(&[]));
    assert!(with(&[]).trace.is_none());
}
