//! How long the shim waits for a request's body before deciding, and how it answers a
//! suppressed retry: a synthetic response, never another attempt's headers or body.
use std::time::Duration;

use http::StatusCode;

use super::policy::FailureReply;

/// How long the relay waits for a request body's first bytes to digest them, when the request
/// may be a retry it answers. Unary calls and bodies with a length arrive with the head; a
/// stream whose client waits for the server before sending is only delayed this long, once.
pub const BODY_WAIT: Duration = Duration::from_millis(50);

/// What a suppressed retry is answered with, whatever carries it (the HTTP/1 or the h2c relay).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalAnswer {
    /// The last attempt was reset (HTTP): so is this one.
    Reset,
    Http(StatusCode),
    /// A gRPC status (never OK), in a trailers-only response.
    Grpc(u32),
}

/// The body of a local HTTP answer.
pub const HTTP_SUPPRESSED_BODY: &str = "retry suppressed by retry-agent\n";

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_answers_repeat_the_status_never_ok() {
        let reply = |status: u16, grpc_status| {
            Some(FailureReply::Response {
                status: StatusCode::from_u16(status).expect("status"),
                grpc_status,
            })
        };
        assert_eq!(
            local_answer(reply(502, None), false),
            LocalAnswer::Http(StatusCode::BAD_GATEWAY)
        );
        assert_eq!(
            local_answer(None, false),
            LocalAnswer::Http(StatusCode::SERVICE_UNAVAILABLE)
        );
        assert_eq!(
            local_answer(Some(FailureReply::Reset), false),
            LocalAnswer::Reset
        );
        assert_eq!(
            local_answer(reply(200, Some(13)), true),
            LocalAnswer::Grpc(13)
        );
        // A gRPC failure seen only as HTTP (no grpc-status), or a reset: UNAVAILABLE.
        assert_eq!(local_answer(reply(503, None), true), LocalAnswer::Grpc(14));
        assert_eq!(
            local_answer(reply(200, Some(0)), true),
            LocalAnswer::Grpc(14)
        );
        assert_eq!(
            local_answer(Some(FailureReply::Reset), true),
            LocalAnswer::Grpc(14)
        );
    }
}
