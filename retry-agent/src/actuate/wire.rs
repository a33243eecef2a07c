//! The wire protocols between the agent and its shims: the control socket's lines, and the
//! headers the shim adds to the traffic it carries. Wire types live here, apart from the internal
//! types they are made from, so the engine's types can change without changing what a shim
//! already deployed reads.
//!
//! # Control protocol, version 2
//!
//! One Unix stream socket (default `/run/retry-agent/control.sock`). The agent listens; each shim
//! connects and reads newline-terminated JSON objects, one [`Snapshot`] per line; nothing flows
//! from the shim to the agent.
//!
//! ```json
//! {"v":2,"seq":7,"sent_unix_ms":1764430000000,
//!  "suppress":[{"decision_id":3,"caller":"frontend","callee":"orders",
//!               "callee_addrs":["10.0.0.7:8080"],"reason":"callee_unclaimed","basis":"verdicts",
//!               "remaining_ms":29875}],
//!  "claims":[{"service":"orders","addrs":["0.0.0.0:8080"],"claim":"unclaimed","remaining_ms":9990}]}
//! ```
//!
//! - Every line is the *full* state (active suppressions and per-service error claims), sent on
//!   every change and at least once a second. The shim replaces its view with each line and
//!   expires entries locally after `remaining_ms`: remaining times, not timestamps, so the two
//!   processes share no clock, and a dead or silent agent means plain forwarding once they lapse
//!   (fail open).
//! - `v` is the protocol's major version, on every line so a reader needs no connection state. A
//!   reader refuses a line of another major version ([`WireError::UnsupportedVersion`]) and, as
//!   with any line it cannot read, keeps forwarding as if told nothing.
//! - Minor revisions only add: new fields (ignored by older readers), new `reason` values (an
//!   older reader skips that suppression rather than guess). Anything else bumps `v`.
//! - A line is at most [`MAX_LINE`] bytes (bounds the shim's memory).
//! - `remaining_ms` is at most [`MAX_REMAINING_MS`] (one hour, the decision TTL cap): the agent
//!   never sends more, and a shim reads a larger value as that cap, so no value on the socket can
//!   overflow its clock arithmetic.
//!
//! Revision 2.1 added `basis` to a suppression (what the decision rests on: `verdicts`,
//! `claim_header`, `owner_budget`, `budget`, `amplification`), for the shim's logs; a 2.0 line
//! has none, and a value from a newer revision reads as `unknown`. The shim acts on `reason`
//! alone. Revision 2.2 added the basis `dependency_symptoms` (a 2.1 shim reads it as `unknown`).
//!
//! Version 1 sent the agent's internal `Decision` and a claim with its TTL next to the time it
//! had left; version 2 sends only what the shim acts on.
//!
//! # Headers
//!
//! On an error response of a service the agent holds a claim for, the shim adds
//! [`ERROR_CLAIM_HEADER`]`: claimed|unclaimed` (an existing one is kept); on a retry it answers
//! locally, [`RETRY_SUPPRESSED_HEADER`]`: <reason>` with the `reason` values below. The names and
//! the claim values ([`Claim::as_str`], [`Claim::parse`]) are defined once in `l7`, whose parsers
//! read them off observed traffic, and re-exported here.
use std::{net::SocketAddr, time::Duration};

use serde::{Deserialize, Serialize};

pub use crate::l7::{ERROR_CLAIM_HEADER, RETRY_SUPPRESSED_HEADER};
use crate::{correlate::ServiceClaim, decide, decide::Decision, l7::Claim};

/// Major version of the control protocol this build speaks.
pub const VERSION: u32 = 2;
/// A control line longer than this is refused.
pub const MAX_LINE: u64 = 4 << 20;
/// Longest `remaining_ms` either side acts on; larger values are read as this.
pub const MAX_REMAINING_MS: u64 = decide::MAX_TTL_MS;

/// One line on the control socket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub v: u32,
    /// Bumped on every change (not on heartbeats).
    pub seq: u64,
    /// Wall clock at send, for latency diagnostics only.
    pub sent_unix_ms: u64,
    #[serde(default)]
    pub suppress: Vec<Suppression>,
    #[serde(default)]
    pub claims: Vec<ClaimEntry>,
}

/// Retries to these addresses are to be answered locally for `remaining_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suppression {
    /// The agent's decision, for logs.
    pub decision_id: u64,
    /// The edge's services, for logs: the shim matches on `callee_addrs`.
    pub caller: String,
    pub callee: String,
    /// An unspecified IP matches any IP on that port.
    pub callee_addrs: Vec<SocketAddr>,
    pub reason: Reason,
    /// What the decision rests on (revision 2.1; none from a 2.0 agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basis: Option<WireBasis>,
    pub remaining_ms: u64,
}

/// [`decide::Basis`] on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireBasis {
    Verdicts,
    ClaimHeader,
    OwnerBudget,
    Budget,
    Amplification,
    DependencySymptoms,
    /// A value from a newer minor revision.
    #[serde(other)]
    Unknown,
}

impl From<decide::Basis> for WireBasis {
    fn from(b: decide::Basis) -> Self {
        match b {
            decide::Basis::Verdicts => WireBasis::Verdicts,
            decide::Basis::ClaimHeader => WireBasis::ClaimHeader,
            decide::Basis::OwnerBudget => WireBasis::OwnerBudget,
            decide::Basis::Budget => WireBasis::Budget,
            decide::Basis::Amplification => WireBasis::Amplification,
            decide::Basis::DependencySymptoms => WireBasis::DependencySymptoms,
        }
    }
}

/// Why retries stop, as [`RETRY_SUPPRESSED_HEADER`] and the control protocol spell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    CalleeUnclaimed,
    OverBudget,
    Amplification,
    /// A reason from a newer minor revision: the suppression is skipped (fail open).
    #[serde(other)]
    Unknown,
}

/// The claim the shim stamps on a service's error responses for `remaining_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimEntry {
    pub service: String,
    /// The service's listening addresses (an unspecified IP matches any local IP on that port).
    pub addrs: Vec<SocketAddr>,
    pub claim: WireClaim,
    pub remaining_ms: u64,
}

/// [`Claim`] on the wire: only the two values a header can carry (no claim is no entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireClaim {
    Claimed,
    Unclaimed,
    /// A value from a newer minor revision: no header is stamped.
    #[serde(other)]
    Unknown,
}

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("control line is not JSON of the expected shape")]
    Malformed(#[source] serde_json::Error),
    #[error("control line has no protocol version (`v`)")]
    NoVersion,
    #[error(
        "the agent speaks control protocol v{got}; this shim speaks v{VERSION}: run the same release on both sides"
    )]
    UnsupportedVersion { got: u32 },
}

impl From<decide::Reason> for Reason {
    fn from(r: decide::Reason) -> Self {
        match r {
            decide::Reason::CalleeUnclaimed => Reason::CalleeUnclaimed,
            decide::Reason::OverBudget => Reason::OverBudget,
            decide::Reason::Amplification => Reason::Amplification,
        }
    }
}

impl Reason {
    /// The internal reason, or `None` for one this build does not know.
    pub fn known(self) -> Option<decide::Reason> {
        match self {
            Reason::CalleeUnclaimed => Some(decide::Reason::CalleeUnclaimed),
            Reason::OverBudget => Some(decide::Reason::OverBudget),
            Reason::Amplification => Some(decide::Reason::Amplification),
            Reason::Unknown => None,
        }
    }
}

impl WireClaim {
    /// `None` for `Missing`, which the wire does not carry.
    pub fn from_claim(c: Claim) -> Option<WireClaim> {
        match c {
            Claim::Claimed => Some(WireClaim::Claimed),
            Claim::Unclaimed => Some(WireClaim::Unclaimed),
            Claim::Missing => None,
        }
    }

    /// The claim to stamp, or `None` for a value this build does not know.
    pub fn known(self) -> Option<Claim> {
        match self {
            WireClaim::Claimed => Some(Claim::Claimed),
            WireClaim::Unclaimed => Some(Claim::Unclaimed),
            WireClaim::Unknown => None,
        }
    }
}

impl Suppression {
    pub fn new(d: &Decision, remaining: Duration) -> Self {
        Suppression {
            decision_id: d.id,
            caller: d.edge.caller.to_string(),
            callee: d.edge.callee.to_string(),
            callee_addrs: d.callee_addrs.clone(),
            reason: d.reason.into(),
            basis: d.evidence.as_ref().map(|e| e.basis.into()),
            remaining_ms: remaining_ms(remaining),
        }
    }

    /// How long the suppression holds from receipt, capped at [`MAX_REMAINING_MS`].
    pub fn remaining(&self) -> Duration {
        capped(self.remaining_ms)
    }
}

impl ClaimEntry {
    /// `None` for a service without a claim (`Missing`): it gets no header.
    pub fn new(c: &ServiceClaim, remaining: Duration) -> Option<Self> {
        let claim = WireClaim::from_claim(c.claim)?;
        Some(ClaimEntry {
            service: c.service.to_string(),
            addrs: c.addrs.clone(),
            claim,
            remaining_ms: remaining_ms(remaining),
        })
    }

    /// How long the claim holds from receipt, capped at [`MAX_REMAINING_MS`].
    pub fn remaining(&self) -> Duration {
        capped(self.remaining_ms)
    }
}

/// A remaining time as sent: whole milliseconds, from 1 to [`MAX_REMAINING_MS`].
pub fn remaining_ms(d: Duration) -> u64 {
    ms(d).min(MAX_REMAINING_MS)
}

fn capped(ms: u64) -> Duration {
    Duration::from_millis(ms.min(MAX_REMAINING_MS))
}

/// Whole milliseconds, at least 1 (a live entry never reads as already lapsed).
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// One line, newline included.
pub fn encode(snap: &Snapshot) -> Result<Vec<u8>, serde_json::Error> {
    let mut line = serde_json::to_vec(snap)?;
    line.push(b'\n');
    Ok(line)
}

/// Reads one line (with or without its newline). The version is checked before the shape, so a
/// line of another major version says so instead of failing on some field.
pub fn decode(line: &[u8]) -> Result<Snapshot, WireError> {
    #[derive(Deserialize)]
    struct Version {
        v: Option<u32>,
    }
    let probe: Version = serde_json::from_slice(line).map_err(WireError::Malformed)?;
    match probe.v {
        None => Err(WireError::NoVersion),
        Some(VERSION) => serde_json::from_slice(line).map_err(WireError::Malformed),
        Some(got) => Err(WireError::UnsupportedVersion { got }),
    }
}

#[cfg(test)]
mod tests;
