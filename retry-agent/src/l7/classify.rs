//! Outcome classes, exactly as [`OutcomeClass`] documents them.
use super::exchange::{Failure, OutcomeClass};

/// gRPC status codes that matter for classification.
pub mod grpc {
    pub const OK: u32 = 0;
    pub const CANCELLED: u32 = 1;
    pub const UNKNOWN: u32 = 2;
    pub const INVALID_ARGUMENT: u32 = 3;
    pub const DEADLINE_EXCEEDED: u32 = 4;
    pub const NOT_FOUND: u32 = 5;
    pub const ALREADY_EXISTS: u32 = 6;
    pub const PERMISSION_DENIED: u32 = 7;
    pub const RESOURCE_EXHAUSTED: u32 = 8;
    pub const FAILED_PRECONDITION: u32 = 9;
    pub const ABORTED: u32 = 10;
    pub const OUT_OF_RANGE: u32 = 11;
    pub const UNIMPLEMENTED: u32 = 12;
    pub const INTERNAL: u32 = 13;
    pub const UNAVAILABLE: u32 = 14;
    pub const DATA_LOSS: u32 = 15;
    pub const UNAUTHENTICATED: u32 = 16;
}

/// HTTP/2 error codes that change the class of a reset stream.
pub mod h2_error {
    pub const REFUSED_STREAM: u32 = 0x7;
    pub const CANCEL: u32 = 0x8;
    pub const ENHANCE_YOUR_CALM: u32 = 0xb;
}

/// What a response said, as far as classification cares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Signals {
    pub status: Option<u16>,
    pub grpc_status: Option<u32>,
    /// Retry-After on the response.
    pub retry_after: bool,
    /// grpc-retry-pushback-ms on the response.
    pub pushback: bool,
    /// x-envoy-ratelimited on the response.
    pub ratelimited: bool,
}

/// The class of an exchange: a failure (no complete response) decides first, then gRPC status
/// (it rides on a 200), then the HTTP status. No status at all is an unknown result.
pub(crate) fn classify(failure: Option<Failure>, s: &Signals) -> OutcomeClass {
    if let Some(f) = failure {
        return classify_failure(f);
    }
    if s.ratelimited {
        return OutcomeClass::Overload;
    }
    if let Some(g) = s.grpc_status {
        let c = classify_grpc(g);
        // Pushback is the server saying "overloaded, back off" on a failed call.
        if c != OutcomeClass::Success && s.pushback {
            return OutcomeClass::Overload;
        }
        return c;
    }
    match s.status {
        Some(st) => {
            let c = classify_http(st, s.retry_after);
            if c != OutcomeClass::Success && s.pushback {
                OutcomeClass::Overload
            } else {
                c
            }
        }
        None => OutcomeClass::Unknown,
    }
}

pub(crate) fn classify_failure(f: Failure) -> OutcomeClass {
    match f {
        Failure::ConnectRefused
        | Failure::ConnectTimeout
        | Failure::Reset
        | Failure::ResetMidResponse => OutcomeClass::Transient,
        Failure::ClosedNoResponse | Failure::Abandoned => OutcomeClass::Unknown,
        // REFUSED_STREAM guarantees the request was not processed: retryable.
        Failure::RstStream(h2_error::REFUSED_STREAM) => OutcomeClass::Transient,
        Failure::RstStream(h2_error::ENHANCE_YOUR_CALM)
        | Failure::GoAway(h2_error::ENHANCE_YOUR_CALM) => OutcomeClass::Overload,
        // A cancelled stream was given up by the caller: the result is unknown.
        Failure::RstStream(h2_error::CANCEL) => OutcomeClass::Unknown,
        Failure::RstStream(_) => OutcomeClass::Transient,
        // Streams above GOAWAY's last-stream-id were not processed: safe to retry.
        Failure::GoAway(_) => OutcomeClass::Transient,
    }
}

pub(crate) fn classify_http(status: u16, retry_after: bool) -> OutcomeClass {
    match status {
        100..=399 => OutcomeClass::Success,
        429 => OutcomeClass::Overload,
        503 if retry_after => OutcomeClass::Overload,
        // Request Timeout and Too Early: the server asks for a repeat.
        408 | 425 => OutcomeClass::Transient,
        400..=499 => OutcomeClass::Semantic,
        // Not Implemented, HTTP Version Not Supported: retrying cannot help.
        501 | 505 => OutcomeClass::Semantic,
        500..=599 => OutcomeClass::Transient,
        _ => OutcomeClass::Unknown,
    }
}

pub(crate) fn classify_grpc(code: u32) -> OutcomeClass {
    use grpc::*;
    match code {
        OK => OutcomeClass::Success,
        UNAVAILABLE | ABORTED | INTERNAL | UNKNOWN | DATA_LOSS => OutcomeClass::Transient,
        RESOURCE_EXHAUSTED => OutcomeClass::Overload,
        INVALID_ARGUMENT | NOT_FOUND | ALREADY_EXISTS | PERMISSION_DENIED | FAILED_PRECONDITION
        | OUT_OF_RANGE | UNIMPLEMENTED | UNAUTHENTICATED => OutcomeClass::Semantic,
        // The call may or may not have run: an unknown result.
        CANCELLED | DEADLINE_EXCEEDED => OutcomeClass::Unknown,
        _ => OutcomeClass::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(status: u16) -> Signals {
        Signals {
            status: Some(status),
            ..Default::default()
        }
    }

    #[test]
    fn http_statuses_map_to_the_documented_classes() {
        use OutcomeClass::*;
        let cases: &[(Signals, OutcomeClass)] = &[
            (http(200), Success),
            (http(204), Success),
            (http(304), Success),
            (http(400), Semantic),
            (http(401), Semantic),
            (http(403), Semantic),
            (http(404), Semantic),
            (http(409), Semantic),
            (http(422), Semantic),
            (http(429), Overload),
            (http(500), Transient),
            (http(502), Transient),
            (http(503), Transient),
            (http(504), Transient),
            (
                Signals {
                    retry_after: true,
                    ..http(503)
                },
                Overload,
            ),
            (
                Signals {
                    ratelimited: true,
                    ..http(200)
                },
                Overload,
            ),
            (
                Signals {
                    pushback: true,
                    ..http(503)
                },
                Overload,
            ),
            (Signals::default(), Unknown),
        ];
        for (s, want) in cases {
            assert_eq!(classify(None, s), *want, "{s:?}");
        }
    }

    #[test]
    fn grpc_status_dominates_http_200() {
        use OutcomeClass::*;
        let g = |c| Signals {
            status: Some(200),
            grpc_status: Some(c),
            ..Default::default()
        };
        assert_eq!(classify(None, &g(grpc::OK)), Success);
        assert_eq!(classify(None, &g(grpc::UNAVAILABLE)), Transient);
        assert_eq!(classify(None, &g(grpc::RESOURCE_EXHAUSTED)), Overload);
        assert_eq!(classify(None, &g(grpc::INVALID_ARGUMENT)), Semantic);
        assert_eq!(classify(None, &g(grpc::NOT_FOUND)), Semantic);
        assert_eq!(classify(None, &g(grpc::DEADLINE_EXCEEDED)), Unknown);
        assert_eq!(
            classify(
                None,
                &Signals {
                    pushback: true,
                    ..g(grpc::UNAVAILABLE)
                }
            ),
            Overload
        );
    }

    #[test]
    fn failures_decide_before_status() {
        use OutcomeClass::*;
        assert_eq!(
            classify(Some(Failure::ConnectRefused), &http(200)),
            Transient
        );
        assert_eq!(
            classify(Some(Failure::ResetMidResponse), &http(200)),
            Transient
        );
        assert_eq!(
            classify(Some(Failure::Abandoned), &Signals::default()),
            Unknown
        );
        assert_eq!(
            classify(Some(Failure::ClosedNoResponse), &Signals::default()),
            Unknown
        );
        assert_eq!(
            classify(
                Some(Failure::RstStream(h2_error::REFUSED_STREAM)),
                &http(200)
            ),
            Transient
        );
        assert_eq!(
            classify(
                Some(Failure::RstStream(h2_error::CANCEL)),
                &Signals::default()
            ),
            Unknown
        );
        assert_eq!(
            classify(Some(Failure::GoAway(0)), &Signals::default()),
            Transient
        );
    }
}
