//! The ownership decision for one failed inbound request, as a pure function of what judging it
//! found: how its outbound calls were tied to it, which of them failed (and what their callees
//! claimed), what failed elsewhere in the process meanwhile, and the at-least-once setting.
//!
//! The design's matrix (`retry-storms.md`), for the claim a caller passes upward:
//!
//! | callee erred | caller erred | callee's claim | claim passed upward |
//! |---|---|---|---|
//! | no  | yes | n/a       | claimed   |
//! | yes | yes | missing   | unclaimed |
//! | yes | yes | claimed   | unclaimed |
//! | yes | yes | unclaimed | unclaimed |
//!
//! refined by failure-pattern memory (a fail-open dependency's error is a coincidence, not the
//! cause), at-least-once (keep one retry in the chain) and lost context (said, never guessed).
//! Whether the caller may retry (the matrix's fourth column) is the decider's, from the claims
//! the edge collects.
use crate::l7::Claim;

/// How the request's outbound calls were tied to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Context {
    /// Thread (or goroutine) context followed the request: its calls are known.
    Followed,
    /// Thread context could not tell; a timing or sole-request link found its calls.
    Linked,
    /// Neither: which calls were made for the request is unknown.
    Lost,
}

/// A failed outbound call made for the request (finished before the request was answered).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct FailedCall {
    /// Failure-pattern memory does not know the dependency to be fail-open (with memory off,
    /// every dependency counts as fail-close).
    pub fail_close: bool,
    /// The callee's claim: its verdict on this node, else the claim header, else missing.
    pub callee_claim: Claim,
    /// The error met the retry criteria (transient, or an unknown result of an idempotent call).
    pub retryable: bool,
    /// The edge has retried: ever, or this very call within the request.
    pub retried: bool,
}

impl FailedCall {
    /// A failure that can have caused the request's: one of a dependency it cannot do without.
    pub(super) fn is_cause(&self) -> bool {
        self.fail_close
    }

    /// At-least-once: nobody retried this retryable error the callee did not disown, so the
    /// retry the chain keeps is our caller's.
    fn owes_retry(&self) -> bool {
        self.retryable && self.callee_claim != Claim::Unclaimed && !self.retried
    }
}

/// Everything the decision reads.
#[derive(Clone, Copy, Debug)]
pub(super) struct Evidence<'a> {
    pub context: Context,
    /// The request's failed calls (empty when the context is lost: they are not known).
    pub failed: &'a [FailedCall],
    /// A call of the process to a fail-close dependency failed during the request, on any
    /// thread (or the failure history does not reach back far enough to say none did).
    pub process_failed: bool,
    /// One failed on a thread that was serving no request then: work handed off to a context
    /// that could not be followed, possibly for this request.
    pub orphan_failed: bool,
    /// `--at-least-once`: own retryable errors no one below retried.
    pub at_least_once: bool,
    /// A call made for it to a fail-close dependency ended with an outcome capture did not see
    /// (a lost response record, a header block of a connection picked up mid-life): it may have
    /// failed. Not in `failed`.
    pub unseen: bool,
}

/// Why the request got its claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reason {
    /// None of its calls failed: its own error (matrix row 1).
    OwnError,
    /// Only fail-open dependencies failed: a coincidence, still its own error.
    FailOpenOnly,
    /// A fail-close dependency failed and the chain keeps its one retry above us.
    AtLeastOnce,
    /// A fail-close dependency failed: the error is its symptom (matrix rows 2 to 4).
    Dependency,
    /// Context lost, but no call of the whole process to a fail-close dependency failed.
    NothingFailedInProcess,
    /// Context lost while a call of the process to a fail-close dependency failed.
    ContextLost,
    /// A handed-off call failed where it could not be placed: it may have been this request's.
    OrphanFailure,
    /// None of its calls failed as far as capture saw, but one's outcome went unseen.
    OutcomeUnseen,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Decision {
    pub claim: Claim,
    pub reason: Reason,
}

/// The claim a failed inbound request passes upward, and why.
pub(super) fn decide(e: &Evidence<'_>) -> Decision {
    let (claim, reason) = if e.context == Context::Lost {
        if e.process_failed {
            (Claim::Missing, Reason::ContextLost)
        } else {
            // Sound without linking: none of its calls can have failed.
            (Claim::Claimed, Reason::NothingFailedInProcess)
        }
    } else if !e.failed.iter().any(FailedCall::is_cause) {
        if e.orphan_failed && e.context == Context::Followed {
            (Claim::Missing, Reason::OrphanFailure)
        } else if e.unseen {
            // Claimed would say no call caused it, unclaimed that one did: neither is known.
            (Claim::Missing, Reason::OutcomeUnseen)
        } else if e.failed.is_empty() {
            (Claim::Claimed, Reason::OwnError)
        } else {
            (Claim::Claimed, Reason::FailOpenOnly)
        }
    } else if e.at_least_once
        && e.failed
            .iter()
            .filter(|c| c.is_cause())
            .all(FailedCall::owes_retry)
    {
        (Claim::Claimed, Reason::AtLeastOnce)
    } else {
        (Claim::Unclaimed, Reason::Dependency)
    };
    Decision { claim, reason }
}

#[cfg(test)]
mod tests;
