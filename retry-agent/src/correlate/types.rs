//! What correlation produces: services, edges, verdicts.
use std::{fmt, sync::Arc};

use serde::{Deserialize, Serialize};

use crate::l7::{Claim, ExchangeId, OutcomeClass};

/// A service identity: process identity by default (comm), overridable by config
/// (e.g. `python3:8080=orders`). Cheap to clone; bounded in number by the engine.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ServiceId(pub Arc<str>);

impl ServiceId {
    pub fn new(s: &str) -> Self {
        ServiceId(Arc::from(s))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ServiceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A directed caller → callee edge.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Edge {
    pub caller: ServiceId,
    pub callee: ServiceId,
}

impl fmt::Display for Edge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}->{}", self.caller, self.callee)
    }
}

/// A failed child call that explains an unclaimed verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildFailure {
    pub exchange: ExchangeId,
    pub callee: ServiceId,
    pub outcome: OutcomeClass,
    pub status: Option<u16>,
}

/// Ownership verdict for one failed inbound exchange.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// The failed inbound (server-role) exchange.
    pub exchange: ExchangeId,
    pub service: ServiceId,
    /// Who called it, if known.
    pub caller: Option<ServiceId>,
    pub claim: Claim,
    pub outcome: OutcomeClass,
    pub status: Option<u16>,
    /// The child failures behind an unclaimed verdict.
    pub caused_by: Vec<ChildFailure>,
    pub ts_ns: u64,
}
