//! Protocol detection on first bytes, and the request key.
use super::*;

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
        let mut h = HeaderMap::new();
        for (n, v) in headers {
            h.insert(
                http::HeaderName::from_bytes(n.as_bytes()).expect("name"),
                http::HeaderValue::from_str(v).expect("value"),
            );
        }
        key_of_fields(&info, http::Method::GET, "b".into(), "/".into(), &h)
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
