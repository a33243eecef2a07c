//! Stage 2: per-connection reassembly of HTTP/1.x and HTTP/2/gRPC into [`Exchange`]s.
//! Pure logic: no IO, never panics on bytes.
pub mod exchange;

pub use exchange::{
    Claim, ERROR_CLAIM_HEADER, Exchange, ExchangeId, Failure, Method, OutcomeClass, Protocol,
    RETRY_SUPPRESSED_HEADER, RetryMarkers,
};
