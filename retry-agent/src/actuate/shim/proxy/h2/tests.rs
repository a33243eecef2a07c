//! The relay between a real h2 client and a real h2 server (hyper's, over loopback sockets),
//! in both upstream modes: frames over a connection per client connection (`relay`), and
//! HTTP/2 terminated with streams on pooled connections (`pooled::relay`).
use std::{
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use hyper::{body::Incoming, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};

use super::super::{
    ConnInfo, Ctx, ProxyError,
    test_support::{conn_to, ctx, relay_to, suppress},
};

type RelayFuture = Pin<Box<dyn Future<Output = Result<(), ProxyError>> + Send>>;

/// The relay of one upstream mode: `shared` is `--shim-h2-upstream shared`.
fn relay_of(
    shared: bool,
) -> impl Fn(TcpStream, Bytes, TcpStream, ConnInfo, Arc<Ctx>) -> RelayFuture + Send + 'static {
    move |client, prefix, up, info, ctx| -> RelayFuture {
        if shared {
            Box::pin(super::pooled::relay(client, prefix, up, info, ctx))
        } else {
            Box::pin(super::relay(client, prefix, up, info, ctx))
        }
    }
}

/// The header the test callee adds to what it logs: which of its connections served a request.
const CONN_SEEN: &str = "x-test-callee-connection";

type Seen = Arc<Mutex<Vec<(String, HeaderMap)>>>;
type Resp = UnsyncBoxBody<Bytes, std::convert::Infallible>;

/// A body of one data frame (if any) and then trailers: how gRPC answers.
struct WithTrailers(Option<Bytes>, Option<HeaderMap>);

impl Body for WithTrailers {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(d) = self.0.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        Poll::Ready(self.1.take().map(|t| Ok(Frame::trailers(t))))
    }
}

/// The callee: `/echo` sends the request body back, `/fail` answers 503, `/grpc.Svc/Fail`
/// answers a message and then UNAVAILABLE in its trailers, anything else 200. Every request it
/// sees is logged with its headers and the connection it came on ([`CONN_SEEN`]).
async fn callee() -> (SocketAddr, Seen) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let seen: Seen = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        let mut n = 0u32;
        while let Ok((s, _)) = l.accept().await {
            let log = log.clone();
            n += 1;
            let conn = n;
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let log = log.clone();
                    async move {
                        let path = req.uri().path().to_string();
                        let mut logged = req.headers().clone();
                        logged.insert(CONN_SEEN, conn.into());
                        if let Ok(mut seen) = log.lock() {
                            seen.push((path.clone(), logged));
                        }
                        let body = req.into_body().collect().await.map(|b| b.to_bytes());
                        let body = body.unwrap_or_default();
                        let r: Response<Resp> = match path.as_str() {
                            "/echo" => Response::new(Full::new(body).boxed_unsync()),
                            "/fail" => Response::builder()
                                .status(503)
                                .body(Full::new(Bytes::from_static(b"no")).boxed_unsync())
                                .expect("response"),
                            "/grpc.Svc/Fail" => {
                                let mut t = HeaderMap::new();
                                t.insert("grpc-status", "14".parse().expect("value"));
                                Response::builder()
                                    .header("content-type", "application/grpc")
                                    .body(
                                        WithTrailers(
                                            Some(Bytes::from_static(b"\0\0\0\0\0")),
                                            Some(t),
                                        )
                                        .boxed_unsync(),
                                    )
                                    .expect("response")
                            }
                            _ => Response::new(Full::new(Bytes::from_static(b"ok")).boxed_unsync()),
                        };
                        Ok::<_, std::convert::Infallible>(r)
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

type Sender = hyper::client::conn::http2::SendRequest<Full<Bytes>>;

async fn client(addr: SocketAddr) -> Sender {
    let s = TcpStream::connect(addr).await.expect("relay");
    let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(s))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    send
}

/// Status, headers and body (trailers merged into the headers).
async fn call(
    send: &mut Sender,
    path: &str,
    headers: &[(&str, &str)],
    body: &'static [u8],
) -> (StatusCode, HeaderMap, Bytes) {
    let mut b = Request::builder()
        .method("POST")
        .uri(format!("http://callee{path}"));
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    let req = b
        .body(Full::new(Bytes::from_static(body)))
        .expect("request");
    send.ready().await.expect("ready");
    let resp = send.send_request(req).await.expect("response");
    let (parts, body) = resp.into_parts();
    let collected = body.collect().await.expect("body");
    let mut headers = parts.headers;
    if let Some(t) = collected.trailers() {
        headers.extend(t.clone());
    }
    (parts.status, headers, collected.to_bytes())
}

fn paths(seen: &Seen) -> Vec<String> {
    seen.lock()
        .map(|s| s.iter().map(|(p, _)| p.clone()).collect())
        .unwrap_or_default()
}

fn header(h: &HeaderMap, n: &str) -> Option<String> {
    h.get(n).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// Requests and answers cross unchanged: several at once on one connection, and bodies
/// larger than the default flow-control windows both ways.
#[tokio::test]
async fn streams_and_windows_pass_through() {
    streams_and_windows_pass_through_in(false).await;
}

#[tokio::test]
async fn streams_and_windows_pass_through_pooled_upstream() {
    streams_and_windows_pass_through_in(true).await;
}

async fn streams_and_windows_pass_through_in(shared: bool) {
    let (orig, seen) = callee().await;
    let ctx = ctx();
    let mut send = client(relay_to(orig, ctx.clone(), relay_of(shared)).await).await;
    let (status, _, body) = call(&mut send, "/ok", &[], b"").await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]));
    let big: &'static [u8] = Box::leak(vec![7u8; 300_000].into_boxed_slice());
    let mut calls = Vec::new();
    for i in 0..8 {
        let mut s = send.clone();
        calls.push(tokio::spawn(async move {
            let n = i.to_string();
            call(&mut s, "/echo", &[("x-n", &n)], big).await
        }));
    }
    for c in calls {
        let (status, _, body) = c.await.expect("call");
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body.len(), big.len());
    }
    assert_eq!(paths(&seen).len(), 9);
    assert_eq!(
        ctx.stats
            .requests
            .load(std::sync::atomic::Ordering::Relaxed),
        9
    );
}

/// On a suppressed edge: the failure carries the callee's claim; the same request again is
/// answered by the relay and never reaches the callee; later requests on the connection still
/// reach it with their headers intact, though the left-out block added to the client's HPACK
/// table (its `x-note: 2`) what the callee's never got.
#[tokio::test]
async fn a_suppressed_retry_stays_here_and_the_connection_goes_on() {
    a_suppressed_retry_stays_here_in(false).await;
}

#[tokio::test]
async fn a_suppressed_retry_stays_here_pooled_upstream() {
    a_suppressed_retry_stays_here_in(true).await;
}

async fn a_suppressed_retry_stays_here_in(shared: bool) {
    let (orig, seen) = callee().await;
    let ctx = ctx();
    suppress(&ctx, orig, "claimed");
    let mut send = client(relay_to(orig, ctx.clone(), relay_of(shared)).await).await;

    let (status, h, _) = call(&mut send, "/fail", &[("x-note", "1")], b"order 1").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&h, "x-error-claim").as_deref(), Some("claimed"));

    let (status, h, body) = call(&mut send, "/fail", &[("x-note", "2")], b"order 1").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        header(&h, crate::l7::RETRY_SUPPRESSED_HEADER).as_deref(),
        Some("callee_unclaimed")
    );
    assert!(body.is_empty());
    assert_eq!(paths(&seen), vec!["/fail"], "the retry stayed here");

    // Another order is another request; `x-note: 2` is now an index into the client's table.
    let (status, _, _) = call(&mut send, "/fail", &[("x-note", "2")], b"order 2").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (status, _, body) = call(&mut send, "/echo", &[("x-note", "2")], b"hello").await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"hello"[..]));
    let seen = seen.lock().expect("log").clone();
    let got: Vec<_> = seen
        .iter()
        .map(|(p, h)| (p.as_str(), header(h, "x-note")))
        .collect();
    assert_eq!(
        got,
        vec![
            ("/fail", Some("1".into())),
            ("/fail", Some("2".into())),
            ("/echo", Some("2".into()))
        ]
    );
    let n = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!((n(&ctx.stats.requests), n(&ctx.stats.suppressed)), (4, 1));
}

/// gRPC: a failure's trailers get the claim and the pushback; its retry is answered with a
/// trailers-only UNAVAILABLE carrying the pushback.
#[tokio::test]
async fn grpc_failures_get_pushback_and_their_retries_a_local_status() {
    grpc_failures_get_pushback_in(false).await;
}

#[tokio::test]
async fn grpc_failures_get_pushback_pooled_upstream() {
    grpc_failures_get_pushback_in(true).await;
}

async fn grpc_failures_get_pushback_in(shared: bool) {
    let (orig, seen) = callee().await;
    let ctx = ctx();
    suppress(&ctx, orig, "claimed");
    let mut send = client(relay_to(orig, ctx.clone(), relay_of(shared)).await).await;
    let grpc = [("content-type", "application/grpc"), ("te", "trailers")];
    let (status, h, _) = call(&mut send, "/grpc.Svc/Fail", &grpc, b"\0\0\0\0\x01a").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&h, "grpc-status").as_deref(), Some("14"));
    assert_eq!(header(&h, "grpc-retry-pushback-ms").as_deref(), Some("-1"));
    assert_eq!(header(&h, "x-error-claim").as_deref(), Some("claimed"));

    let (status, h, body) = call(&mut send, "/grpc.Svc/Fail", &grpc, b"\0\0\0\0\x01a").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.is_empty());
    assert_eq!(header(&h, "grpc-status").as_deref(), Some("14"));
    assert_eq!(header(&h, "grpc-retry-pushback-ms").as_deref(), Some("-1"));
    assert_eq!(
        header(&h, crate::l7::RETRY_SUPPRESSED_HEADER).as_deref(),
        Some("callee_unclaimed")
    );
    assert_eq!(paths(&seen), vec!["/grpc.Svc/Fail"]);
    // A different message to the same method is a different request.
    let (_, h, _) = call(&mut send, "/grpc.Svc/Fail", &grpc, b"\0\0\0\0\x01b").await;
    assert!(header(&h, crate::l7::RETRY_SUPPRESSED_HEADER).is_none());
    assert_eq!(paths(&seen).len(), 2);
}

/// Ten caller connections open at once, two requests each: relayed frame by frame, the callee
/// serves them on ten connections of the shim's; pooled, on two (eight callers per pooled
/// connection), the other dialled connections closed unused.
#[tokio::test]
async fn pooled_upstream_serves_many_callers_on_few_connections() {
    for (shared, want) in [(false, 10), (true, 2)] {
        let (orig, seen) = callee().await;
        let addr = relay_to(orig, ctx(), relay_of(shared)).await;
        let mut callers = Vec::new();
        for _ in 0..10 {
            let mut send = client(addr).await;
            for _ in 0..2 {
                let (status, _, _) = call(&mut send, "/ok", &[], b"").await;
                assert_eq!(status, StatusCode::OK);
            }
            // Kept open: a pooled connection counts the callers it carries.
            callers.push(send);
        }
        let seen = seen.lock().expect("log").clone();
        assert_eq!(seen.len(), 20);
        let mut conns: Vec<_> = seen
            .iter()
            .filter_map(|(_, h)| header(h, CONN_SEEN))
            .collect();
        conns.sort();
        conns.dedup();
        assert_eq!(
            conns.len(),
            want,
            "shared upstream: {shared}, served on {conns:?}"
        );
    }
}

/// Pooled: a caller that resets its stream while the callee has not answered is not an
/// outcome of the callee's, and a callee that resets a stream is passed on as a reset.
#[tokio::test]
async fn pooled_upstream_passes_resets_on() {
    // A callee that resets every stream it is sent.
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let orig = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let Ok(mut conn) = ::h2::server::handshake(s).await else {
                    return;
                };
                while let Some(Ok((_, mut respond))) = conn.accept().await {
                    respond.send_reset(::h2::Reason::REFUSED_STREAM);
                }
            });
        }
    });
    let ctx = ctx();
    let mut send = client(relay_to(orig, ctx.clone(), relay_of(true)).await).await;
    let req = Request::post("http://callee/x")
        .body(Full::new(Bytes::from_static(b"a")))
        .expect("request");
    send.ready().await.expect("ready");
    let err = send.send_request(req).await.expect_err("reset");
    let reason = std::error::Error::source(&err)
        .and_then(|e| e.downcast_ref::<::h2::Error>())
        .and_then(::h2::Error::reason);
    assert_eq!(reason, Some(::h2::Reason::REFUSED_STREAM), "{err:?}");
    // The connection goes on.
    send.ready().await.expect("ready again");
}

type Count = Arc<std::sync::atomic::AtomicUsize>;

fn count(c: &Count) -> usize {
    c.load(std::sync::atomic::Ordering::Relaxed)
}

/// An h2 callee (the `h2` crate's server) whose connections each take `per_conn` requests and
/// then go away (GOAWAY, then close), allowing `max_streams` at once and answering each after
/// `delay`; returns its address, how many connections it accepted and how many ended.
async fn going_away_callee(
    per_conn: usize,
    max_streams: u32,
    delay: Duration,
) -> (SocketAddr, Count, Count) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let orig = l.local_addr().expect("addr");
    let conns = Count::default();
    let ended = Count::default();
    let (n, e) = (conns.clone(), ended.clone());
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let e = e.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = ::h2::server::Builder::new()
                    .max_concurrent_streams(max_streams)
                    .handshake::<_, Bytes>(s)
                    .await
                else {
                    return;
                };
                let mut served = 0;
                while let Some(Ok((_, mut respond))) = conn.accept().await {
                    served += 1;
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        let resp = Response::builder().status(200).body(()).expect("response");
                        let _ = respond.send_response(resp, true);
                    });
                    if served == per_conn {
                        conn.graceful_shutdown();
                    }
                }
                e.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            });
        }
    });
    (orig, conns, ended)
}

/// Pooled: a callee connection that goes away after each request is replaced, and the
/// caller's connection goes on with every request answered.
#[tokio::test]
async fn pooled_upstream_is_replaced_after_goaway() {
    let (orig, conns, _) = going_away_callee(1, 100, Duration::ZERO).await;
    let mut send = client(relay_to(orig, ctx(), relay_of(true)).await).await;
    for _ in 0..3 {
        let (status, _, _) = call(&mut send, "/ok", &[], b"").await;
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(count(&conns), 3);
}

/// Pooled: a connection no caller uses any more is closed once idle (300 ms under test), not
/// kept to every destination ever seen; one a caller still holds is kept.
#[tokio::test]
async fn pooled_upstream_closes_when_no_caller_uses_it() {
    let (orig, conns, ended) = going_away_callee(usize::MAX, 100, Duration::ZERO).await;
    let addr = relay_to(orig, ctx(), relay_of(true)).await;
    let mut send = client(addr).await;
    let (status, _, _) = call(&mut send, "/ok", &[], b"").await;
    assert_eq!(status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        (count(&conns), count(&ended)),
        (1, 0),
        "closed under a caller"
    );
    drop(send);
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(
        (count(&conns), count(&ended)),
        (1, 1),
        "kept with no caller"
    );
}

/// Pooled: streams past the callee's concurrent-stream limit wait in the shim and all are
/// answered, on one connection.
#[tokio::test]
async fn pooled_upstream_waits_for_the_callees_stream_limit() {
    let (orig, conns, _) = going_away_callee(usize::MAX, 1, Duration::from_millis(20)).await;
    let send = client(relay_to(orig, ctx(), relay_of(true)).await).await;
    let mut calls = Vec::new();
    for _ in 0..6 {
        let mut s = send.clone();
        calls.push(tokio::spawn(
            async move { call(&mut s, "/ok", &[], b"").await },
        ));
    }
    for c in calls {
        let (status, _, _) = c.await.expect("call");
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(count(&conns), 1);
}

/// Bytes that are not HTTP/2 after the preface: the relay stops reading and passes them on,
/// and the callee (a plain echo here) gets every byte in order, a request it held for its
/// body (a marked retry, and no body comes) included.
#[tokio::test]
async fn unreadable_frames_pass_through_untouched() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
    let addr = relay_to(orig, ctx(), super::relay).await;
    let mut s = TcpStream::connect(addr).await.expect("relay");
    let mut sent = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    let mut block = bytes::BytesMut::new();
    for (n, v) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "callee"),
        (":path", "/x"),
        ("x-retry-attempt", "1"),
    ] {
        super::frame::put_literal(&mut block, n.as_bytes(), v.as_bytes());
    }
    let mut f = bytes::BytesMut::new();
    super::frame::put_block(&mut f, 1, 0, &block);
    sent.extend_from_slice(&f);
    // A CONTINUATION with no block before it, then garbage.
    sent.extend_from_slice(&[0, 0, 1, 0x9, 0x4, 0, 0, 0, 1, 0xff]);
    sent.extend_from_slice(b"not a frame at all");
    s.write_all(&sent).await.expect("write");
    let mut got = vec![0u8; sent.len()];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got))
        .await
        .expect("in time")
        .expect("read");
    assert_eq!(got, sent);
}

/// Conversations drawn at random (requests to a few keys, so retries and suppressed ones
/// come up; blocks split into CONTINUATIONs, padding, trailers, resets, odd frames) with a byte
/// flipped now and then, fed in arbitrary pieces, held requests forced at random: the relay
/// never panics, and writes no more than it read plus its own frames.
#[test]
fn arbitrary_conversations_never_panic_the_relay() {
    use super::{
        conversation::{Rng, request, response},
        frame,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _g = rt.enter();
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let mut next = move |n: u64| rng.below(n);
    let orig: SocketAddr = "127.0.0.1:9".parse().expect("addr");
    let mut seen = [0u64; 4];
    for round in 0..3_000 {
        let ctx = ctx();
        if round % 2 == 0 {
            suppress(&ctx, orig, "unclaimed");
        }
        let info = conn_to(orig);
        let mut r = super::Relay::new(ctx, info);
        let (mut c, mut s) = (bytes::BytesMut::new(), bytes::BytesMut::new());
        let mut read = 0;
        let mut feed = |r: &mut super::Relay,
                        mut w: bytes::BytesMut,
                        client: bool,
                        next: &mut dyn FnMut(u64) -> u64| {
            if next(8) == 0 && !w.is_empty() {
                let i = next(w.len() as u64) as usize;
                w[i] ^= 1 << next(8);
            }
            read += w.len();
            while !w.is_empty() {
                let n = (next(64) + 1) as usize;
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
        let mut w = bytes::BytesMut::from(&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..]);
        frame::put_head(&mut w, 0, 0x4, 0, 0);
        feed(&mut r, w, true, &mut next);
        let mut draw = Rng::new(next(u64::MAX));
        for k in 0..(next(8) + 1) as u32 {
            let stream = 2 * k + 1;
            let (w, grpc) = request(&mut draw, stream);
            feed(&mut r, w, true, &mut next);
            let mut w = response(&mut draw, stream, grpc);
            if next(12) == 0 {
                frame::put_rst(&mut w, stream, 2);
            }
            feed(&mut r, w, false, &mut next);
        }
        r.on_client(&mut c, true);
        r.upstream_ended();
        let n = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        seen[0] += u64::from(r.blind);
        seen[1] += n(&r.ctx.stats.requests);
        seen[2] += n(&r.ctx.stats.suppressed);
        seen[3] += u64::from(r.reencode && !r.blind);
        let written = r.to_server.len() + r.to_client.len();
        // Its own frames: local answers, credits, claims (a few hundred bytes per stream).
        assert!(
            written <= read + 4096,
            "round {round}: read {read}, wrote {written}"
        );
    }
    // The draw reaches every path: unreadable input, requests, answers, re-encoding.
    assert!(
        seen.iter().all(|&n| n > 20),
        "blind, requests, suppressed, re-encoded: {seen:?}"
    );
}
