//! Protocol detection on first bytes.
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
