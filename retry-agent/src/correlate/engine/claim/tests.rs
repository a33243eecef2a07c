//! The decision matrix as a table: every row of the design's matrix, the coincidental-error
//! (fail-open) cases, at-least-once, and lost or broken links.
use super::{Context, Decision, Evidence, FailedCall, Reason, decide};
use crate::l7::Claim::{self, Claimed, Missing, Unclaimed};

/// A failed call to a fail-close dependency whose callee claimed `claim`.
const fn close(claim: Claim, retryable: bool, retried: bool) -> FailedCall {
    FailedCall {
        fail_close: true,
        callee_claim: claim,
        retryable,
        retried,
    }
}
/// A failed call to a dependency memory knows to be fail-open.
const fn open(claim: Claim) -> FailedCall {
    FailedCall {
        fail_close: false,
        callee_claim: claim,
        retryable: true,
        retried: false,
    }
}

struct Row {
    name: &'static str,
    context: Context,
    failed: &'static [FailedCall],
    process_failed: bool,
    orphan_failed: bool,
    at_least_once: bool,
    unseen: bool,
    want: Claim,
    why: Reason,
}

const fn row(
    name: &'static str,
    failed: &'static [FailedCall],
    at_least_once: bool,
    want: Claim,
    why: Reason,
) -> Row {
    // The common case: thread context followed the request; the process checks agree with
    // its own calls (a fail-close failure among them is a process failure too).
    let mut process_failed = false;
    let mut i = 0;
    while i < failed.len() {
        process_failed |= failed[i].fail_close;
        i += 1;
    }
    Row {
        name,
        context: Context::Followed,
        failed,
        process_failed,
        orphan_failed: false,
        at_least_once,
        unseen: false,
        want,
        why,
    }
}

/// `row`, with a call beside `failed` whose outcome capture did not see.
const fn unseen(
    name: &'static str,
    failed: &'static [FailedCall],
    want: Claim,
    why: Reason,
) -> Row {
    let mut r = row(name, failed, false, want, why);
    r.unseen = true;
    r
}

use Context::{Followed, Linked, Lost};
use Reason::*;

const ROWS: &[Row] = &[
    // ---- the design's matrix (at-least-once off, or the edge already retries) ----
    row(
        "1: callee fine, caller erred -> claimed",
        &[],
        false,
        Claimed,
        OwnError,
    ),
    row("1 with at-least-once", &[], true, Claimed, OwnError),
    row(
        "2: callee missing -> unclaimed",
        &[close(Missing, true, false)],
        false,
        Unclaimed,
        Dependency,
    ),
    row(
        "2: callee missing, edge retries -> unclaimed",
        &[close(Missing, true, true)],
        true,
        Unclaimed,
        Dependency,
    ),
    row(
        "3: callee claimed -> unclaimed",
        &[close(Claimed, true, false)],
        false,
        Unclaimed,
        Dependency,
    ),
    row(
        "3: callee claimed, edge retries -> unclaimed",
        &[close(Claimed, true, true)],
        true,
        Unclaimed,
        Dependency,
    ),
    row(
        "4: callee unclaimed -> unclaimed",
        &[close(Unclaimed, true, false)],
        false,
        Unclaimed,
        Dependency,
    ),
    row(
        "4: callee unclaimed is never owed a retry",
        &[close(Unclaimed, true, false)],
        true,
        Unclaimed,
        Dependency,
    ),
    row(
        "4: non-retryable unclaimed",
        &[close(Unclaimed, false, false)],
        true,
        Unclaimed,
        Dependency,
    ),
    // ---- coincidental errors: failure-pattern memory ----
    row(
        "only a fail-open dependency failed -> own error",
        &[open(Claimed)],
        false,
        Claimed,
        FailOpenOnly,
    ),
    row(
        "fail-open dependency unclaimed -> still own error",
        &[open(Unclaimed)],
        true,
        Claimed,
        FailOpenOnly,
    ),
    row(
        "fail-open and fail-close failed -> the fail-close one caused it",
        &[open(Claimed), close(Claimed, false, false)],
        false,
        Unclaimed,
        Dependency,
    ),
    // ---- at-least-once: the chain keeps one retry ----
    row(
        "retryable, claimed below, never retried -> we own it",
        &[close(Claimed, true, false)],
        true,
        Claimed,
        AtLeastOnce,
    ),
    row(
        "retryable, missing below, never retried -> we own it",
        &[close(Missing, true, false)],
        true,
        Claimed,
        AtLeastOnce,
    ),
    row(
        "not retryable (semantic) -> unclaimed",
        &[close(Claimed, false, false)],
        true,
        Unclaimed,
        Dependency,
    ),
    row(
        "two causes, one already retried -> unclaimed",
        &[close(Claimed, true, false), close(Claimed, true, true)],
        true,
        Unclaimed,
        Dependency,
    ),
    row(
        "two causes, both owed -> we own it",
        &[close(Claimed, true, false), close(Missing, true, false)],
        true,
        Claimed,
        AtLeastOnce,
    ),
    row(
        "fail-open call owes nothing, fail-close one does",
        &[open(Unclaimed), close(Claimed, true, false)],
        true,
        Claimed,
        AtLeastOnce,
    ),
    // ---- lost and broken links ----
    Row {
        name: "context lost, a fail-close call failed in the process -> missing",
        context: Lost,
        failed: &[],
        process_failed: true,
        orphan_failed: false,
        at_least_once: true,
        unseen: false,
        want: Missing,
        why: ContextLost,
    },
    Row {
        name: "context lost, nothing failed in the process -> claimed",
        context: Lost,
        failed: &[],
        process_failed: false,
        orphan_failed: false,
        at_least_once: true,
        unseen: false,
        want: Claimed,
        why: NothingFailedInProcess,
    },
    Row {
        name: "context lost, only fail-open failures (not process failures) -> claimed",
        context: Lost,
        failed: &[],
        process_failed: false,
        orphan_failed: false,
        at_least_once: false,
        unseen: false,
        want: Claimed,
        why: NothingFailedInProcess,
    },
    Row {
        name: "followed, no call failed, a handed-off call failed -> missing",
        context: Followed,
        failed: &[],
        process_failed: true,
        orphan_failed: true,
        at_least_once: false,
        unseen: false,
        want: Missing,
        why: OrphanFailure,
    },
    Row {
        name: "followed, fail-open failure, a handed-off call failed -> missing",
        context: Followed,
        failed: &[open(Claimed)],
        process_failed: true,
        orphan_failed: true,
        at_least_once: false,
        unseen: false,
        want: Missing,
        why: OrphanFailure,
    },
    Row {
        name: "followed, own cause found despite an orphan -> unclaimed",
        context: Followed,
        failed: &[close(Claimed, false, false)],
        process_failed: true,
        orphan_failed: true,
        at_least_once: false,
        unseen: false,
        want: Unclaimed,
        why: Dependency,
    },
    Row {
        name: "linked by timing or sole request -> unclaimed",
        context: Linked,
        failed: &[close(Claimed, false, true)],
        process_failed: true,
        orphan_failed: true,
        at_least_once: false,
        unseen: false,
        want: Unclaimed,
        why: Dependency,
    },
    Row {
        name: "linked: the orphan was placed -> not missing",
        context: Linked,
        failed: &[open(Claimed)],
        process_failed: false,
        orphan_failed: true,
        at_least_once: false,
        unseen: false,
        want: Claimed,
        why: FailOpenOnly,
    },
    Row {
        name: "linked, at-least-once applies as for followed context",
        context: Linked,
        failed: &[close(Missing, true, false)],
        process_failed: true,
        orphan_failed: true,
        at_least_once: true,
        unseen: false,
        want: Claimed,
        why: AtLeastOnce,
    },
    // ---- a call's outcome capture did not see ----
    unseen(
        "followed, no call failed, one's outcome unseen -> missing",
        &[],
        Missing,
        OutcomeUnseen,
    ),
    unseen(
        "followed, a fail-open failure and an unseen outcome -> missing",
        &[open(Claimed)],
        Missing,
        OutcomeUnseen,
    ),
    unseen(
        "followed, a seen cause beside an unseen outcome -> unclaimed",
        &[close(Claimed, false, false)],
        Unclaimed,
        Dependency,
    ),
];

#[test]
fn decision_matrix() {
    let mut wrong = Vec::new();
    for r in ROWS {
        let got = decide(&Evidence {
            context: r.context,
            failed: r.failed,
            process_failed: r.process_failed,
            orphan_failed: r.orphan_failed,
            at_least_once: r.at_least_once,
            unseen: r.unseen,
        });
        let want = Decision {
            claim: r.want,
            reason: r.why,
        };
        if got != want {
            wrong.push(format!("{}: got {got:?}, want {want:?}", r.name));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} rows wrong:\n{}",
        wrong.len(),
        ROWS.len(),
        wrong.join("\n")
    );
}

/// Every reason is reachable from the table (a new branch needs a row).
#[test]
fn every_reason_has_a_row() {
    for why in [
        OwnError,
        FailOpenOnly,
        AtLeastOnce,
        Dependency,
        NothingFailedInProcess,
        ContextLost,
        OrphanFailure,
        OutcomeUnseen,
    ] {
        assert!(ROWS.iter().any(|r| r.why == why), "no row for {why:?}");
    }
}
