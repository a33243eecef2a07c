//! Hand-made decisions: one place that knows every field, so tests set only what they test.
use crate::{
    correlate::{Edge, ServiceId},
    decide::{Action, Decision, Reason},
};

/// A decision on `caller → callee`: id 1, issued at 0, no callee address.
pub fn decision(
    caller: &str,
    callee: &str,
    action: Action,
    reason: Reason,
    ttl_ms: u64,
) -> Decision {
    Decision {
        id: 1,
        edge: Edge {
            caller: ServiceId::new(caller),
            callee: ServiceId::new(callee),
        },
        callee_addrs: Vec::new(),
        action,
        reason,
        issued_at_ns: 0,
        ttl_ms,
        evidence: None,
    }
}
