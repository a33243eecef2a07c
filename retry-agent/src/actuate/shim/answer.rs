//! What the shim needs from a request before deciding (its body digest), and how it answers a
//! suppressed retry: a synthetic response, never another attempt's headers or body.
use std::{
    collections::VecDeque,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use hyper::body::Incoming;

use super::policy::{BodyDigest, FailureReply, SuppressReason};
use crate::l7::RETRY_SUPPRESSED_HEADER;

pub type ReqBody = UnsyncBoxBody<Bytes, hyper::Error>;
pub type RespBody = UnsyncBoxBody<Bytes, hyper::Error>;

/// How long the shim waits for a request body's first bytes to digest them. Unary calls and
/// bodies with a length arrive with the head; a stream whose client waits for the server
/// before sending is only delayed this long, once.
pub const BODY_WAIT: Duration = Duration::from_millis(50);

/// Read up to the body-digest limit of `body` (or to its end, or until `wait` passes) and
/// return its digest with a body that replays what was read, then the rest.
pub async fn digest_body(body: Incoming, wait: Duration) -> (Option<u64>, ReqBody) {
    if body.is_end_stream() {
        return (None, body.boxed_unsync());
    }
    let mut frames = VecDeque::new();
    let mut digest = BodyDigest::default();
    let mut body = body;
    let mut ended = false;
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let next = tokio::time::timeout_at(deadline, body.frame()).await;
        match next {
            Ok(Some(Ok(f))) => {
                let more = f.data_ref().is_none_or(|d| digest.feed(d));
                frames.push_back(Ok(f));
                if !more {
                    break;
                }
            }
            Ok(Some(Err(e))) => {
                frames.push_back(Err(e));
                ended = true;
                break;
            }
            Ok(None) => {
                ended = true;
                break;
            }
            Err(_) => break,
        }
    }
    let rest = if ended { None } else { Some(body) };
    (digest.finish(), Replayed { frames, rest }.boxed_unsync())
}

/// A request body whose first frames were read already.
struct Replayed {
    frames: VecDeque<Result<Frame<Bytes>, hyper::Error>>,
    rest: Option<Incoming>,
}

impl Body for Replayed {
    type Data = Bytes;
    type Error = hyper::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(f) = self.frames.pop_front() {
            return Poll::Ready(Some(f));
        }
        match self.rest.as_mut() {
            Some(r) => Pin::new(r).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }
    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }
    fn size_hint(&self) -> SizeHint {
        let buffered: u64 = self
            .frames
            .iter()
            .filter_map(|f| f.as_ref().ok()?.data_ref().map(|d| d.len() as u64))
            .sum();
        let rest = self
            .rest
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint);
        // Upper first: SizeHint asserts lower <= upper at every step.
        let mut h = SizeHint::new();
        if let Some(u) = rest.upper() {
            h.set_upper(u.saturating_add(buffered));
        }
        h.set_lower(rest.lower().saturating_add(buffered));
        h
    }
}

/// Whether a suppressed HTTP/1 retry whose last attempt was reset is answered by a reset.
pub enum Local {
    Reply(Response<RespBody>),
    Reset,
}

/// What a suppressed retry is answered with, whatever carries it (hyper, the h2c relay).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalAnswer {
    /// The last attempt was reset (HTTP): so is this one.
    Reset,
    Http(StatusCode),
    /// A gRPC status (never OK), in a trailers-only response.
    Grpc(u32),
}

/// The grpc-message of a local gRPC answer.
pub const GRPC_SUPPRESSED_MESSAGE: &str = "retry suppressed by retry-agent";

/// The status (or grpc-status) the last attempt got, or 503 / UNAVAILABLE when only a marker
/// made it a retry.
pub fn local_answer(reply: Option<FailureReply>, grpc: bool) -> LocalAnswer {
    let (status, gstatus) = match reply {
        Some(FailureReply::Reset) if !grpc => return LocalAnswer::Reset,
        Some(FailureReply::Reset) | None => (StatusCode::SERVICE_UNAVAILABLE, None),
        Some(FailureReply::Response {
            status,
            grpc_status,
        }) => (status, grpc_status),
    };
    if grpc {
        LocalAnswer::Grpc(gstatus.filter(|s| *s != 0).unwrap_or(14))
    } else {
        LocalAnswer::Http(status)
    }
}

/// The local answer to a suppressed retry ([`local_answer`]), always with `x-retry-suppressed`,
/// and nothing else from the failure (its headers and body were another caller's).
pub fn local_reply(
    reason: SuppressReason,
    reply: Option<FailureReply>,
    grpc: bool,
) -> Result<Local, http::Error> {
    let why = HeaderValue::from_static(reason.as_str());
    let status = match local_answer(reply, grpc) {
        LocalAnswer::Reset => return Ok(Local::Reset),
        LocalAnswer::Http(status) => status,
        LocalAnswer::Grpc(code) => {
            let b = Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "application/grpc")
                .header(RETRY_SUPPRESSED_HEADER, why.clone());
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from(code));
            trailers.insert(
                "grpc-message",
                HeaderValue::from_static(GRPC_SUPPRESSED_MESSAGE),
            );
            trailers.insert("grpc-retry-pushback-ms", HeaderValue::from_static("-1"));
            trailers.insert(RETRY_SUPPRESSED_HEADER, why);
            return Ok(Local::Reply(
                b.body(TrailersOnly(Some(trailers)).boxed_unsync())?,
            ));
        }
    };
    let resp = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain")
        .header(RETRY_SUPPRESSED_HEADER, why)
        .body(
            Full::new(Bytes::from_static(b"retry suppressed by retry-agent\n"))
                .map_err(|never| match never {})
                .boxed_unsync(),
        )?;
    Ok(Local::Reply(resp))
}

/// A body of trailers only (local gRPC answers).
struct TrailersOnly(Option<HeaderMap>);

impl Body for TrailersOnly {
    type Data = Bytes;
    type Error = hyper::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Poll::Ready(self.0.take().map(|t| Ok(Frame::trailers(t))))
    }
    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replayed_size_hint_adds_the_buffered_bytes() {
        let hint = |frames: Vec<&'static [u8]>| {
            let b = Replayed {
                frames: frames
                    .into_iter()
                    .map(|d| Ok(Frame::data(Bytes::from_static(d))))
                    .collect(),
                rest: None,
            };
            (b.size_hint().lower(), b.size_hint().upper())
        };
        assert_eq!(hint(vec![b"abc", b"de"]), (5, Some(5)));
        assert_eq!(hint(vec![]), (0, Some(0)));
    }

    #[test]
    fn local_http_reply_is_synthetic() {
        let reply = FailureReply::Response {
            status: StatusCode::BAD_GATEWAY,
            grpc_status: None,
        };
        let Ok(Local::Reply(r)) = local_reply(SuppressReason::CalleeUnclaimed, Some(reply), false)
        else {
            panic!("a reply")
        };
        assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(
            r.headers()
                .get(RETRY_SUPPRESSED_HEADER)
                .map(|v| v.as_bytes()),
            Some(&b"callee_unclaimed"[..])
        );
        assert!(r.headers().get("set-cookie").is_none());
        assert_eq!(r.headers().len(), 2, "{:?}", r.headers());
        assert!(matches!(
            local_reply(
                SuppressReason::RetryBudget,
                Some(FailureReply::Reset),
                false
            ),
            Ok(Local::Reset)
        ));
    }

    #[tokio::test]
    async fn local_grpc_reply_has_pushback_trailers() {
        let reply = FailureReply::Response {
            status: StatusCode::OK,
            grpc_status: Some(13),
        };
        let Ok(Local::Reply(r)) = local_reply(
            SuppressReason::Decision(crate::decide::Reason::OverBudget),
            Some(reply),
            true,
        ) else {
            panic!("a reply")
        };
        assert_eq!(r.status(), StatusCode::OK);
        let body = r.into_body().collect().await.expect("body");
        let t = body.trailers().cloned().expect("trailers");
        assert_eq!(t.get("grpc-status").map(|v| v.as_bytes()), Some(&b"13"[..]));
        assert_eq!(
            t.get("grpc-message").map(|v| v.as_bytes()),
            Some(&b"retry suppressed by retry-agent"[..])
        );
        assert_eq!(
            t.get("grpc-retry-pushback-ms").map(|v| v.as_bytes()),
            Some(&b"-1"[..])
        );
    }
}
