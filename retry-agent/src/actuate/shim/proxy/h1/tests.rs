//! The HTTP/1 relay between real clients and a real server over loopback sockets: hyper's, and
//! raw bytes where the test needs exact control (pipelining, chunks, case, upgrades).
use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

use super::super::test_support::{conn_to, ctx, relay_to, suppress};
use crate::actuate::shim::policy;

type Seen = Arc<Mutex<Vec<(String, HeaderMap, Bytes)>>>;

/// The callee (hyper, keep-alive): `/fail` answers 503, `/slow-fail` 502 after 300 ms, `/echo`
/// sends the body back, anything else 200 "ok". Logs every request it sees with its headers
/// and body.
async fn callee() -> (SocketAddr, Seen) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let seen: Seen = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let log = log.clone();
                    async move {
                        let path = req.uri().path().to_string();
                        let headers = req.headers().clone();
                        let body = req.into_body().collect().await.map(|b| b.to_bytes());
                        let body = body.unwrap_or_default();
                        if let Ok(mut seen) = log.lock() {
                            seen.push((path.clone(), headers, body.clone()));
                        }
                        let r = match path.as_str() {
                            "/fail" => Response::builder()
                                .status(503)
                                .body(Full::new(Bytes::from_static(b"no")))
                                .expect("response"),
                            "/echo" => Response::new(Full::new(body)),
                            "/slow-fail" => {
                                tokio::time::sleep(Duration::from_millis(300)).await;
                                Response::builder()
                                    .status(502)
                                    .body(Full::new(Bytes::from_static(b"no")))
                                    .expect("response")
                            }
                            _ => Response::new(Full::new(Bytes::from_static(b"ok"))),
                        };
                        Ok::<_, std::convert::Infallible>(r)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    // Answers a client that half-closed after its request.
                    .half_close(true)
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// Sends `req` and reads until `n` status lines have come and the connection is quiet (or
/// closes).
async fn exchange(s: &mut TcpStream, req: &[u8], responses: usize) -> String {
    s.write_all(req).await.expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let lines = String::from_utf8_lossy(&got).matches("HTTP/1.1 ").count();
        let wait = if lines < responses { 5_000 } else { 200 };
        match tokio::time::timeout(Duration::from_millis(wait), s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// Keep-alive requests with bodies of every framing, pipelined, and a HEAD: every response
/// in order, every request at the callee with its body, header names as the client spelled
/// them.
#[tokio::test]
async fn messages_of_every_framing_pass_in_order() {
    let (orig, seen) = callee().await;
    let ctx = ctx();
    let mut s = TcpStream::connect(relay_to(orig, ctx.clone(), super::relay).await)
        .await
        .expect("relay");
    let reqs = concat!(
        "POST /echo HTTP/1.1\r\nHost: b\r\nX-Mixed-Case: Kept\r\nContent-Length: 5\r\n\r\nhello",
        "POST /echo HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4;x=y\r\ndefg\r\n0\r\nx-t: 1\r\n\r\n",
        "HEAD /ok HTTP/1.1\r\nHost: b\r\n\r\n",
        "GET /ok HTTP/1.1\r\nHost: b\r\n\r\n",
    );
    let text = exchange(&mut s, reqs.as_bytes(), 4).await;
    assert_eq!(text.matches("HTTP/1.1 200").count(), 4, "{text}");
    let bodies: Vec<_> = text.split("\r\n\r\n").collect();
    assert!(bodies[1].starts_with("hello"), "{text}");
    assert!(bodies[2].starts_with("abcdefg"), "{text}");
    let seen = seen.lock().expect("log").clone();
    let got: Vec<_> = seen
        .iter()
        .map(|(p, _, b)| (p.as_str(), b.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("/echo", Bytes::from_static(b"hello")),
            ("/echo", Bytes::from_static(b"abcdefg")),
            ("/ok", Bytes::new()),
            ("/ok", Bytes::new())
        ]
    );
    assert_eq!(
        ctx.stats
            .requests
            .load(std::sync::atomic::Ordering::Relaxed),
        4
    );
}

/// On a suppressed edge: a failure's head gets the callee's claim; the same request again
/// is answered here, in its place among pipelined requests, and never reaches the callee; a
/// different body is a different request.
#[tokio::test]
async fn a_suppressed_retry_is_answered_here_in_order() {
    let (orig, seen) = callee().await;
    let ctx = ctx();
    suppress(&ctx, orig, "claimed");
    let mut s = TcpStream::connect(relay_to(orig, ctx.clone(), super::relay).await)
        .await
        .expect("relay");
    let fail = |body: &str| {
        format!(
            "POST /fail HTTP/1.1\r\nHost: b\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let text = exchange(&mut s, fail("order 1").as_bytes(), 1).await;
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("x-error-claim: claimed\r\n"), "{text}");
    // Pipelined: a first request, the retry, another order.
    let reqs = format!(
        "GET /ok HTTP/1.1\r\nHost: b\r\n\r\n{}{}",
        fail("order 1"),
        fail("order 2")
    );
    let text = exchange(&mut s, reqs.as_bytes(), 3).await;
    let statuses: Vec<_> = text
        .match_indices("HTTP/1.1 ")
        .map(|(i, _)| &text[i + 9..i + 12])
        .collect();
    assert_eq!(statuses, vec!["200", "503", "503"], "{text}");
    assert_eq!(
        text.matches("x-retry-suppressed: callee_unclaimed").count(),
        1,
        "{text}"
    );
    assert!(text.contains("retry suppressed by retry-agent\n"), "{text}");
    let paths: Vec<_> = seen
        .lock()
        .expect("log")
        .iter()
        .map(|(p, _, b)| format!("{p} {}", String::from_utf8_lossy(b)))
        .collect();
    assert_eq!(paths, vec!["/fail order 1", "/ok ", "/fail order 2"]);
    // The connection goes on.
    let text = exchange(&mut s, b"GET /ok HTTP/1.1\r\nHost: b\r\n\r\n", 1).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
}

/// A marked retry that asks to close (or comes as HTTP/1.0) gets its answer and the close;
/// one whose last attempt was reset gets a reset.
#[tokio::test]
async fn a_local_answer_closes_when_asked_to() {
    let (orig, seen) = callee().await;
    let ctx = ctx();
    suppress(&ctx, orig, "claimed");
    let addr = relay_to(orig, ctx.clone(), super::relay).await;
    for req in [
        "GET /m HTTP/1.1\r\nHost: b\r\nx-retry-attempt: 1\r\nConnection: close\r\n\r\n",
        "GET /m HTTP/1.0\r\nHost: b\r\nx-retry-attempt: 1\r\n\r\n",
    ] {
        let mut s = TcpStream::connect(addr).await.expect("relay");
        s.write_all(req.as_bytes()).await.expect("write");
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got))
            .await
            .expect("closed in time")
            .expect("read");
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 503"), "{text}");
        assert!(text.contains("connection: close\r\n"), "{text}");
        assert!(
            text.ends_with("retry suppressed by retry-agent\n"),
            "{text}"
        );
    }
    assert!(
        seen.lock().expect("log").is_empty(),
        "no retry reached the callee"
    );
    // The last attempt of /r was reset (its connection cut): its retry is reset too.
    ctx.tracker.on_outcome(
        &super::super::key_of_fields(
            &conn_to(orig),
            http::Method::GET,
            "b".into(),
            "/r".into(),
            &HeaderMap::new(),
        ),
        Some((policy::FailureReply::Reset, crate::l7::Claim::Unclaimed)),
        std::time::Instant::now(),
    );
    let mut s = TcpStream::connect(addr).await.expect("relay");
    s.write_all(b"GET /r HTTP/1.1\r\nHost: b\r\n\r\n")
        .await
        .expect("write");
    let mut got = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got))
        .await
        .expect("ended in time");
    assert!(
        r.is_err() || got.is_empty(),
        "a reset, not an answer: {:?}",
        String::from_utf8_lossy(&got)
    );
}

/// A left-out retry whose body stops framing: the callee must not read the rest of it as
/// requests (a body can hold anything), so the connection is reset instead of passed through.
#[tokio::test]
async fn a_left_out_body_that_breaks_is_never_passed_on() {
    let (orig, seen) = callee().await;
    let ctx = ctx();
    suppress(&ctx, orig, "claimed");
    let mut s = TcpStream::connect(relay_to(orig, ctx, super::relay).await)
        .await
        .expect("relay");
    let req = "POST /m HTTP/1.1\r\nHost: b\r\nx-retry-attempt: 1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n";
    s.write_all(req.as_bytes()).await.expect("write");
    // Decided (answered here) once its wait is over; then the chunks stop making sense.
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.write_all(b"GET /smuggled HTTP/1.1\r\nHost: b\r\n\r\n")
        .await
        .expect("write");
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        seen.lock().expect("log").is_empty(),
        "nothing reached the callee"
    );
}

/// A retry that waits for `100 Continue` before its body: the relay, which needs the body for
/// the key, says it, and the retry is recognised and answered here.
#[tokio::test]
async fn a_retry_waiting_to_continue_is_told_to_and_answered() {
    let (orig, seen) = callee().await;
    let ctx = ctx();
    suppress(&ctx, orig, "claimed");
    let mut s = TcpStream::connect(relay_to(orig, ctx, super::relay).await)
        .await
        .expect("relay");
    s.write_all(
        b"POST /m HTTP/1.1\r\nHost: b\r\nx-retry-attempt: 1\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n",
    )
    .await
    .expect("write");
    let mut buf = [0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf))
        .await
        .expect("told to continue in time")
        .expect("read");
    assert_eq!(&buf[..n], b"HTTP/1.1 100 Continue\r\n\r\n");
    let text = exchange(&mut s, b"hello", 1).await;
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(
        text.contains("x-retry-suppressed: callee_unclaimed"),
        "{text}"
    );
    assert!(seen.lock().expect("log").is_empty());
}

/// A client that sends its request and then shuts its side (a half-close) still gets the
/// answer, and the connection ends when the callee's does.
#[tokio::test]
async fn a_half_closed_client_still_gets_its_answer() {
    let (orig, _) = callee().await;
    let mut s = TcpStream::connect(relay_to(orig, ctx(), super::relay).await)
        .await
        .expect("relay");
    s.write_all(b"GET /ok HTTP/1.1\r\nHost: b\r\n\r\n")
        .await
        .expect("write");
    s.shutdown().await.expect("half-close");
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got))
        .await
        .expect("ended in time")
        .expect("read");
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.starts_with("HTTP/1.1 200") && text.ends_with("ok"),
        "{text}"
    );
}

/// The agent's claim published while a request is in flight is the one its failure carries:
/// the caller's retry of it must see it (the lab's depth-4 stops its first retry on it).
#[tokio::test]
async fn a_claim_published_during_the_request_is_on_its_failure() {
    let (orig, _) = callee().await;
    let ctx = ctx();
    let mut s = TcpStream::connect(relay_to(orig, ctx.clone(), super::relay).await)
        .await
        .expect("relay");
    s.write_all(b"GET /slow-fail HTTP/1.1\r\nHost: b\r\n\r\n")
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_millis(100)).await;
    suppress(&ctx, orig, "unclaimed");
    let text = exchange(&mut s, b"", 1).await;
    assert!(text.starts_with("HTTP/1.1 502"), "{text}");
    assert!(text.contains("x-error-claim: unclaimed\r\n"), "{text}");
    // And its retry is judged by it: unclaimed, so answered here, even with no decision.
    ctx.view.replace(
        &serde_json::from_value(serde_json::json!({
            "v": crate::actuate::wire::VERSION, "seq": 2, "sent_unix_ms": 0,
            "claims": [{ "service": "b", "addrs": [orig], "claim": "unclaimed", "remaining_ms": 60_000 }]
        }))
        .expect("snapshot"),
        std::time::Instant::now(),
    );
    let text = exchange(&mut s, b"GET /slow-fail HTTP/1.1\r\nHost: b\r\n\r\n", 1).await;
    assert!(
        text.contains("x-retry-suppressed: callee_unclaimed"),
        "{text}"
    );
}

/// hyper's client through the relay: keep-alive requests on one connection, a large body
/// both ways.
#[tokio::test]
async fn a_real_client_keeps_its_connection() {
    let (orig, _) = callee().await;
    let s = TcpStream::connect(relay_to(orig, ctx(), super::relay).await)
        .await
        .expect("relay");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let big = Bytes::from(vec![7u8; 300_000]);
    for path in ["/ok", "/echo", "/fail", "/ok"] {
        let req = Request::builder()
            .method("POST")
            .uri(path)
            .header("host", "b")
            .body(Full::new(big.clone()))
            .expect("request");
        send.ready().await.expect("ready");
        let resp = send.send_request(req).await.expect("response");
        let status = resp.status();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        match path {
            "/echo" => assert_eq!(body.len(), big.len()),
            "/fail" => assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE),
            _ => assert_eq!(&body[..], b"ok"),
        }
    }
}

/// An upgrade, and bytes that are not HTTP after it: passed through untouched (a plain echo
/// callee sends every byte back).
#[tokio::test]
async fn upgrades_pass_through_untouched() {
    let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let orig = echo.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let mut s = TcpStream::connect(relay_to(orig, ctx(), super::relay).await)
        .await
        .expect("relay");
    let sent = b"GET /ws HTTP/1.1\r\nHost: b\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n\x81\x05hello\xff\x00";
    s.write_all(sent).await.expect("write");
    let mut got = vec![0u8; sent.len()];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got))
        .await
        .expect("in time")
        .expect("read");
    assert_eq!(&got[..], &sent[..]);
}

/// Conversations drawn at random (keys repeating so retries and suppressed ones come up,
/// lengths and chunks, HEAD, pipelining, 100-continue, responses of every framing), a byte
/// flipped now and then, fed in arbitrary pieces with held requests forced at random: the
/// relay never panics and writes no more than it read plus its own answers.
#[test]
fn arbitrary_conversations_never_panic_the_relay() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _g = rt.enter();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n.max(1)
    };
    let orig: SocketAddr = "127.0.0.1:9".parse().expect("addr");
    let mut seen = [0u64; 3];
    for round in 0..3_000 {
        let ctx = ctx();
        if round % 2 == 0 {
            suppress(&ctx, orig, "unclaimed");
        }
        let info = conn_to(orig);
        let mut r = super::Relay {
            ctx,
            info,
            req: super::ReqState::Head,
            resp: super::RespState::Head,
            queue: Default::default(),
            held: None,
            blind: false,
            end: None,
            to_server: Default::default(),
            to_client: Default::default(),
        };
        let (mut c, mut s) = (bytes::BytesMut::new(), bytes::BytesMut::new());
        let mut read = 0;
        let mut feed =
            |r: &mut super::Relay, w: String, client: bool, next: &mut dyn FnMut(u64) -> u64| {
                let mut w = bytes::BytesMut::from(w.as_bytes());
                if next(10) == 0 && !w.is_empty() {
                    let i = next(w.len() as u64) as usize;
                    w[i] ^= 1 << next(8);
                }
                read += w.len();
                while !w.is_empty() {
                    let n = (next(48) + 1) as usize;
                    let piece = w.split_to(n.min(w.len()));
                    if client {
                        c.extend_from_slice(&piece);
                        r.on_client(&mut c, next(4) == 0);
                    } else {
                        s.extend_from_slice(&piece);
                        r.on_server(&mut s);
                    }
                }
            };
        for _ in 0..(next(6) + 1) {
            let mut reqs = String::new();
            let mut heads = Vec::new();
            for _ in 0..(next(3) + 1) {
                let head = next(6) == 0;
                let method = if head { "HEAD" } else { "POST" };
                let marker = if next(6) == 0 {
                    "x-retry-attempt: 1\r\n"
                } else {
                    ""
                };
                let expect = if next(8) == 0 {
                    "Expect: 100-continue\r\n"
                } else {
                    ""
                };
                let body = format!("b{}", next(2));
                let framing = match next(3) {
                    0 => format!("Content-Length: {}\r\n\r\n{body}", body.len()),
                    1 => format!(
                        "Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
                        body.len()
                    ),
                    _ => "\r\n".to_string(),
                };
                reqs += &format!(
                    "{method} /p{} HTTP/1.1\r\nHost: b\r\n{marker}{expect}{framing}",
                    next(2)
                );
                heads.push(head);
            }
            feed(&mut r, reqs, true, &mut next);
            let mut resps = String::new();
            for head in heads {
                if next(10) == 0 {
                    resps += "HTTP/1.1 100 Continue\r\n\r\n";
                }
                let status = if next(2) == 0 {
                    "503 Service Unavailable"
                } else {
                    "200 OK"
                };
                let body = if head { "" } else { "xyz" };
                resps += &match next(3) {
                    0 => format!("HTTP/1.1 {status}\r\nContent-Length: 3\r\n\r\n{body}"),
                    1 if !head => format!(
                        "HTTP/1.1 {status}\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nxyz\r\n0\r\n\r\n"
                    ),
                    _ => format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n"),
                };
            }
            feed(&mut r, resps, false, &mut next);
        }
        r.on_client(&mut c, true);
        r.upstream_ended();
        let n = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        seen[0] += u64::from(r.blind);
        seen[1] += n(&r.ctx.stats.requests);
        seen[2] += n(&r.ctx.stats.suppressed);
        let written = r.to_server.len() + r.to_client.len();
        // Its own bytes: local answers and claim headers, ~150 bytes a request.
        assert!(
            written <= read + 8192,
            "round {round}: read {read}, wrote {written}"
        );
    }
    assert!(
        seen.iter().all(|&n| n > 20),
        "blind, requests, suppressed: {seen:?}"
    );
}
