//! What the protocol parsers hand to the connection: message heads and the event context.
use super::{
    classify::Signals,
    exchange::{Claim, ERROR_CLAIM_HEADER, Method, RetryMarkers, Text},
    trace::{TRACE_NAMES, TraceSource, trace_of_header},
    util::{MAX_AUTHORITY, MAX_PATH, bounded_string, parse_u32},
};

/// The syscall a byte arrived in: whose thread, and when.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ctx {
    /// When the message start is taken to be: syscall entry for writes (the process began
    /// sending), exit for reads (the bytes had arrived).
    pub ts_start: u64,
    /// Syscall exit: when these bytes were done.
    pub ts_end: u64,
    pub tid: u32,
    pub goid: Option<u64>,
    /// A request the kernel saw its thread read among others it had not answered
    /// (`DataEvent::interleaved`).
    pub interleaved: bool,
}

/// A request head, HTTP/1 or HTTP/2.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ReqInfo {
    pub method: Option<Method>,
    pub authority: Option<Text>,
    /// Path without query string.
    pub path: Option<Text>,
    /// Hash of the query string (retry matching without keeping the query).
    pub query_hash: Option<u64>,
    pub idempotency_key: bool,
    pub markers: RetryMarkers,
    /// The header the propagated trace id came from (the best source wins), and its hash:
    /// apart, not a tuple, so the flags below fill the source's padding and a `ReqInfo` (moved
    /// whole through the HTTP/2 path several times per request) stays within 128 bytes, moved
    /// inline rather than by a call to memcpy.
    pub trace_source: Option<TraceSource>,
    pub trace_hash: u64,
    /// Head cut short or decoder out of sync: fields may be missing.
    pub unknown: bool,
}

/// A final response head (or trailers), HTTP/1 or HTTP/2.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RespInfo {
    pub signals: Signals,
    pub claim: Option<Claim>,
    pub unknown: bool,
    /// `Upgrade: h2c` on a 101: the connection continues as HTTP/2, the request on stream 1.
    pub upgrade_h2c: bool,
}

pub(crate) fn parse_method(m: &[u8]) -> Method {
    match m {
        b"GET" => Method::Get,
        b"HEAD" => Method::Head,
        b"POST" => Method::Post,
        b"PUT" => Method::Put,
        b"DELETE" => Method::Delete,
        b"PATCH" => Method::Patch,
        b"OPTIONS" => Method::Options,
        b"CONNECT" => Method::Connect,
        b"TRACE" => Method::Trace,
        other => Method::Other(bounded_string(other, 24)),
    }
}

/// A set of header-name lengths, one bit per length (names are shorter than 64 bytes): a name
/// whose length is not in the set is none of the set's names, which rejects most headers a
/// message carries (User-Agent, Accept, Date...) without comparing them to each name in turn.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NameLengths(u64);

impl NameLengths {
    pub(crate) const fn of(names: &[&[u8]]) -> Self {
        let mut m = 0u64;
        let mut i = 0;
        while i < names.len() {
            assert!(
                names[i].len() < 64,
                "header names in a set are shorter than 64"
            );
            m |= 1 << names[i].len();
            i += 1;
        }
        NameLengths(m)
    }
    pub(crate) const fn with(self, other: NameLengths) -> Self {
        NameLengths(self.0 | other.0)
    }
    /// Whether `name` may be in the set (its length is one of the set's).
    pub(crate) fn may_hold(self, name: &[u8]) -> bool {
        name.len() < 64 && self.0 & (1 << name.len()) != 0
    }
}

/// Every request header name [`apply_request_header`] reads.
const REQUEST_NAMES: NameLengths = NameLengths::of(&[
    b"host",
    b":authority",
    b"idempotency-key",
    b"x-idempotency-key",
    b"x-envoy-attempt-count",
    b"grpc-previous-rpc-attempts",
])
.with(NameLengths::of(&RETRY_ATTEMPT_NAMES))
.with(TRACE_NAMES);

/// Every response header name [`apply_response_header`] reads.
const RESPONSE_NAMES: NameLengths = NameLengths::of(&[
    b":status",
    b"grpc-status",
    b"retry-after",
    b"grpc-retry-pushback-ms",
    b"x-envoy-ratelimited",
    b"upgrade",
    ERROR_CLAIM_HEADER.as_bytes(),
]);

/// Apply one request header (any case; HTTP/2 names are already lower case).
pub(crate) fn apply_request_header(req: &mut ReqInfo, name: &[u8], value: &[u8]) {
    if REQUEST_NAMES.may_hold(name) {
        apply_request_header_named(req, name, value);
    }
}

/// Whether [`apply_request_header`] might read this header's value: a reader that decodes
/// values on demand (HPACK's Huffman) skips the others.
pub(crate) fn request_header_read(name: &[u8]) -> bool {
    REQUEST_NAMES.may_hold(name)
}

/// Whether [`apply_response_header`] might read this header's value.
pub(crate) fn response_header_read(name: &[u8]) -> bool {
    RESPONSE_NAMES.may_hold(name)
}

/// [`apply_request_header`] without the length filter.
fn apply_request_header_named(req: &mut ReqInfo, name: &[u8], value: &[u8]) {
    let n = name;
    if n.eq_ignore_ascii_case(b"host") || n == b":authority" {
        // HTTP/2 sends both on some clients; :authority wins as it comes first.
        if req.authority.is_none() {
            req.authority = Some(bounded_string(value.trim_ascii(), MAX_AUTHORITY));
        }
    } else if n.eq_ignore_ascii_case(b"idempotency-key")
        || n.eq_ignore_ascii_case(b"x-idempotency-key")
    {
        req.idempotency_key = !value.trim_ascii().is_empty();
    } else if n.eq_ignore_ascii_case(b"x-envoy-attempt-count") {
        req.markers.envoy_attempt_count = parse_u32(value);
    } else if n.eq_ignore_ascii_case(b"grpc-previous-rpc-attempts") {
        req.markers.grpc_previous_attempts = parse_u32(value);
    } else if is_retry_attempt_header(n)
        && let Some(v) = parse_u32(value)
    {
        req.markers.retry_attempt = Some(v);
    } else if let Some(t) = trace_of_header(n, value)
        && req.trace_source.is_none_or(|src| t.0 < src)
    {
        (req.trace_source, req.trace_hash) = (Some(t.0), t.1);
    }
}

/// The retry-attempt headers clients and libraries send ("as sent": the number is kept).
fn is_retry_attempt_header(n: &[u8]) -> bool {
    RETRY_ATTEMPT_NAMES
        .iter()
        .any(|h| n.eq_ignore_ascii_case(h))
}

const RETRY_ATTEMPT_NAMES: [&[u8]; 6] = [
    b"x-retry-attempt",
    b"x-retry-count",
    b"x-retry-attempts",
    b"retry-attempt",
    b"x-attempt",
    b"x-request-attempt",
];

/// Apply one response header or trailer.
pub(crate) fn apply_response_header(resp: &mut RespInfo, name: &[u8], value: &[u8]) {
    if RESPONSE_NAMES.may_hold(name) {
        apply_response_header_named(resp, name, value);
    }
}

/// [`apply_response_header`] without the length filter.
fn apply_response_header_named(resp: &mut RespInfo, name: &[u8], value: &[u8]) {
    let n = name;
    if n == b":status" {
        resp.signals.status = parse_u32(value).and_then(|s| u16::try_from(s).ok());
    } else if n.eq_ignore_ascii_case(b"grpc-status") {
        resp.signals.grpc_status = parse_u32(value);
    } else if n.eq_ignore_ascii_case(b"retry-after") {
        resp.signals.retry_after = true;
    } else if n.eq_ignore_ascii_case(b"grpc-retry-pushback-ms") {
        resp.signals.pushback = true;
    } else if n.eq_ignore_ascii_case(b"x-envoy-ratelimited") {
        resp.signals.ratelimited = true;
    } else if n.eq_ignore_ascii_case(b"upgrade") {
        resp.upgrade_h2c = value
            .split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"h2c"));
    } else if n.eq_ignore_ascii_case(ERROR_CLAIM_HEADER.as_bytes()) {
        resp.claim = Claim::parse(value);
    }
}

/// Path of a request target (query split off), bounded.
pub(crate) fn path_string(path: &[u8]) -> Text {
    bounded_string(path, MAX_PATH)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The length filter changes nothing: every name, filtered or not, has the same effect.
    #[test]
    fn name_length_filter_is_invisible() {
        let mut names: Vec<Vec<u8>> = [
            "host",
            "Host",
            ":authority",
            "idempotency-key",
            "X-Idempotency-Key",
            "x-envoy-attempt-count",
            "grpc-previous-rpc-attempts",
            "x-retry-attempt",
            "X-Retry-Count",
            "x-retry-attempts",
            "retry-attempt",
            "x-attempt",
            "x-request-attempt",
            "traceparent",
            "b3",
            "X-B3-TraceId",
            "uber-trace-id",
            "x-request-id",
            ":status",
            "grpc-status",
            "Retry-After",
            "grpc-retry-pushback-ms",
            "x-envoy-ratelimited",
            "Upgrade",
            "x-error-claim",
            "user-agent",
            "accept",
            "date",
            "content-type",
            "content-length",
            "",
            ":path",
            ":method",
        ]
        .iter()
        .map(|n| n.as_bytes().to_vec())
        .collect();
        names.push(vec![b'x'; 64]);
        names.push(vec![b'x'; 200]);
        let values: [&[u8]; 6] = [
            b"3",
            b" 0 ",
            b"claimed",
            b"h2c",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"4bf92f3577b34da6a3ce929d0e0e4736:00f067aa0ba902b7:0:1",
        ];
        for n in &names {
            for v in values {
                let (mut a, mut b) = (ReqInfo::default(), ReqInfo::default());
                apply_request_header(&mut a, n, v);
                apply_request_header_named(&mut b, n, v);
                assert_eq!(a, b, "{:?}", String::from_utf8_lossy(n));
                let (mut a, mut b) = (RespInfo::default(), RespInfo::default());
                apply_response_header(&mut a, n, v);
                apply_response_header_named(&mut b, n, v);
                assert_eq!(a, b, "{:?}", String::from_utf8_lossy(n));
            }
        }
    }
}
