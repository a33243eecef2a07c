//! The exchange: one request and its response (or the failure that replaced it).
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::capture::{ConnId, Role};

/// A short string of an exchange (authority, path, route, an unusual method): inline up to 24
/// bytes, so most exchanges allocate nothing for them and the recorder frees nothing when it
/// lets an old one go (those frees of cold memory were ~15% of the agent's CPU under load).
pub type Text = compact_str::CompactString;

/// Name of the error-claim header the shim adds and the parsers read. One name, one place.
pub const ERROR_CLAIM_HEADER: &str = "x-error-claim";
/// Header the shim adds to a locally answered (suppressed) retry.
pub const RETRY_SUPPRESSED_HEADER: &str = "x-retry-suppressed";

/// Unique within one agent run (and within one dump): assigned by l7 in emission order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ExchangeId(pub u64);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    Http1,
    Http2,
    /// Not HTTP: bytes are counted, nothing is parsed.
    Opaque,
}

/// HTTP method, closed set plus the rare other (kept short and bounded).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Patch,
    Options,
    Connect,
    Trace,
    #[serde(untagged)]
    Other(Text),
}

impl Method {
    /// RFC 9110 §9.2.2: GET, HEAD, PUT, DELETE, OPTIONS, TRACE are idempotent.
    pub fn is_idempotent(&self) -> bool {
        matches!(
            self,
            Method::Get
                | Method::Head
                | Method::Put
                | Method::Delete
                | Method::Options
                | Method::Trace
        )
    }
}

/// The four error classes of the design (plus success).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeClass {
    Success,
    /// Connect refused/reset, 502/503/504, gRPC UNAVAILABLE, timeout without response,
    /// reset mid-response: retry with few attempts and jitter.
    Transient,
    /// 400/401/403/404/409/422, gRPC INVALID_ARGUMENT...: never retry.
    Semantic,
    /// 429, 503 + Retry-After, gRPC RESOURCE_EXHAUSTED, pushback: respect it.
    Overload,
    /// No response / cut off mid-way: retry only if idempotent.
    Unknown,
}

impl OutcomeClass {
    pub fn is_failure(self) -> bool {
        self != OutcomeClass::Success
    }
    pub const ALL: [OutcomeClass; 5] = [
        Self::Success,
        Self::Transient,
        Self::Semantic,
        Self::Overload,
        Self::Unknown,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Transient => "transient",
            Self::Semantic => "semantic",
            Self::Overload => "overload",
            Self::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for OutcomeClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an exchange has no (complete) response.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    ConnectRefused,
    ConnectTimeout,
    /// Reset before any response byte.
    Reset,
    /// Reset or closed after part of the response.
    ResetMidResponse,
    /// Closed by either side with the request unanswered.
    ClosedNoResponse,
    /// HTTP/2 RST_STREAM on this stream (error code kept).
    RstStream(u32),
    /// HTTP/2 GOAWAY covering this stream.
    GoAway(u32),
    /// The caller gave up (closed) while waiting.
    Abandoned,
}

impl Failure {
    /// The caller gave the request up: closed while waiting, or reset the stream with CANCEL.
    /// What a hedging client does to the attempt that lost.
    pub fn given_up(self) -> bool {
        matches!(
            self,
            Failure::Abandoned | Failure::RstStream(super::classify::h2_error::CANCEL)
        )
    }
}

/// Error-claim a response carried (from the shim's header), or that our verdict gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Claim {
    Claimed,
    Unclaimed,
    Missing,
}

impl Claim {
    pub fn as_str(self) -> &'static str {
        match self {
            Claim::Claimed => "claimed",
            Claim::Unclaimed => "unclaimed",
            Claim::Missing => "missing",
        }
    }
    pub fn parse(v: &[u8]) -> Option<Claim> {
        match v.trim_ascii() {
            b"claimed" => Some(Claim::Claimed),
            b"unclaimed" => Some(Claim::Unclaimed),
            _ => None,
        }
    }
}

/// Retry markers clients put on the wire.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryMarkers {
    /// x-envoy-attempt-count (1 = first attempt).
    pub envoy_attempt_count: Option<u32>,
    /// x-retry-attempt / x-retry-count and similar (as sent).
    pub retry_attempt: Option<u32>,
    /// grpc-previous-rpc-attempts (0 = first attempt).
    pub grpc_previous_attempts: Option<u32>,
}

impl RetryMarkers {
    /// Whether any marker says this is not the first attempt.
    pub fn says_retry(&self) -> bool {
        self.envoy_attempt_count.is_some_and(|n| n > 1)
            || self.retry_attempt.is_some_and(|n| n > 0)
            || self.grpc_previous_attempts.is_some_and(|n| n > 0)
    }
}

/// One request/response pair on one connection (one stream for HTTP/2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exchange {
    pub id: ExchangeId,
    pub conn: ConnId,
    pub role: Role,
    pub protocol: Protocol,
    /// HTTP/2 stream id.
    pub stream_id: Option<u32>,
    pub local: Option<SocketAddr>,
    pub remote: Option<SocketAddr>,
    pub pid: u32,
    /// Thread that read the request (server) or wrote it (client).
    pub tid: u32,
    /// Thread that wrote the response (server) or read it (client), if different.
    pub response_tid: Option<u32>,
    pub goid: Option<u64>,
    pub request_start_ns: u64,
    pub request_end_ns: u64,
    pub response_start_ns: Option<u64>,
    pub response_end_ns: Option<u64>,
    pub method: Option<Method>,
    pub authority: Option<Text>,
    /// Path without the query string.
    pub path: Option<Text>,
    /// Hash of the query string, if any: `/items?page=1` and `?page=2` are different requests.
    #[serde(default)]
    pub query_hash: Option<u64>,
    /// `path` with high-cardinality segments (numbers, UUIDs, hex ids) collapsed to `{id}`.
    pub route: Option<Text>,
    pub status: Option<u16>,
    pub grpc_status: Option<u32>,
    pub outcome: OutcomeClass,
    pub failure: Option<Failure>,
    /// Method is idempotent or an idempotency key was sent.
    pub idempotent: bool,
    pub idempotency_key: bool,
    pub retry_markers: RetryMarkers,
    /// Hash of the propagated trace id (`traceparent`, `b3`, `x-b3-traceid`, `uber-trace-id`,
    /// else `x-request-id`): ties an outbound call to the inbound request that forwarded it.
    #[serde(default)]
    pub trace_id: Option<u64>,
    /// Retry-After or grpc-retry-pushback-ms seen on the response.
    pub retry_after: bool,
    /// The error-claim header on the response, if any.
    pub claim_header: Option<Claim>,
    /// Hash of the captured request body prefix, for retry matching.
    pub body_hash: Option<u64>,
    /// The decoder lost sync (mid-connection start, truncated HPACK block): fields may be absent.
    pub unknown: bool,
    pub request_bytes: u64,
    pub response_bytes: u64,
    /// Server side: the thread that read this request had no other request read and unanswered
    /// when it answered this one (thread per request, not an event loop), so the calls it made
    /// meanwhile were this request's. False when unknown (and in dumps that predate it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sole_on_thread: bool,
    /// Server side, a stream a Go probe bound (gRPC-go): when its handler goroutine took it,
    /// and when that goroutine took its next request (the handler was over by then; None
    /// while unknown). The span of the request's calls, which its wire times overstate: the
    /// request was read in a batch before the handler ran, and the response is written by
    /// another goroutine after the handler returned and its goroutine was perhaps reused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler_start_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler_end_ns: Option<u64>,
    /// Client side, HTTP/2: the connection has carried streams of several threads at once,
    /// so the thread that wrote this stream's frames need not be the one that made the call
    /// (gRPC's C core runs queued writes of every caller on whichever caller's thread holds
    /// the transport). Its thread then says nothing about whose call it was.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub threads_multiplexed: bool,
    /// The connection was closed or reset with this exchange unanswered (or mid-response):
    /// when. Its request was in flight until then (the caller that gave up, the server that
    /// dropped it), which its last byte on the wire understates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ns: Option<u64>,
    /// How many exchanges of its connection it stands for (`--capture-summary-every`): itself
    /// and the quiet ones the kernel counted since the connection's last record, which only
    /// counts read (edge and service figures); 1 for all but summaries.
    #[serde(
        default = "crate::capture::event::one",
        skip_serializing_if = "crate::capture::event::is_one"
    )]
    pub weight: u32,
    /// A tally: `weight` quiet exchanges of its connection the kernel counted, none of which
    /// this is. Its request fields are the connection's last held request's and its times when
    /// the count was sent: only counts read it (`Engine::push` books it and nothing else).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tally: bool,
}

impl Exchange {
    pub fn failed(&self) -> bool {
        self.outcome.is_failure()
    }
    /// Its outcome went by unseen: the decoder lost sync (capture dropped the response's
    /// records, a gap) and saw no status, no gRPC status and no failure. `Unknown`, but not
    /// evidence that anything failed.
    pub fn outcome_unseen(&self) -> bool {
        self.unknown
            && self.status.is_none()
            && self.grpc_status.is_none()
            && self.failure.is_none()
    }
    /// Failed, as far as capture saw: an outcome that went by unseen is no failure (and no
    /// success either).
    pub fn failure_seen(&self) -> bool {
        self.failed() && !self.outcome_unseen()
    }
    /// When the exchange ended (last response byte, or the failure).
    pub fn end_ns(&self) -> u64 {
        self.response_end_ns.unwrap_or(self.request_end_ns)
    }
}
