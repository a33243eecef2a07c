//! Verdicts: a failed inbound request's children (thread context, then timing and sole-request
//! links), failure-pattern memory, and the claim it gets.
use super::{
    Child, Engine, GOROUTINE_KEY, MEMORY_DECAY_AT, MEMORY_FAIL_CLOSE, MEMORY_MIN_SAMPLES,
    NS_PER_MS, Peer, Pending, RecentVerdict,
    claim::{self, Context, Evidence, FailedCall, Reason},
    claim_index,
};
use retry_common::GOROUTINE_ROOTED;

use crate::{
    correlate::types::{ChildFailure, DependencyKind, Link, ServiceId, Unlinked, Verdict},
    l7::{Claim, OutcomeClass},
};

/// What judging found about a failed request's context.
struct Found {
    children: Vec<Child>,
    context: Context,
    process_failed: bool,
    orphan_failed: bool,
    /// The link that found the children when thread context could not (`Context::Linked`).
    linked_by: Option<Link>,
    /// When the request was answered: what a retry recovered later did fail for it.
    answered: u64,
    /// Why the trace link could not place its calls, when no link did.
    unlinked: Option<Unlinked>,
}

impl Found {
    /// Its calls that failed before it was answered (none known when the context is lost).
    fn failed_children(&self, answered: u64) -> Vec<Child> {
        if self.context == Context::Lost {
            return Vec::new();
        }
        self.children
            .iter()
            .filter(|c| c.failed() && !c.recovered_by(answered) && c.end <= answered)
            .copied()
            .collect()
    }

    /// Its calls whose outcome went unseen, by `answered` (none known when the context is
    /// lost): each may have failed.
    fn unseen_children(&self, answered: u64) -> impl Iterator<Item = &Child> {
        let known = self.context != Context::Lost;
        self.children
            .iter()
            .filter(move |c| known && c.unseen && !c.recovered_by(answered) && c.end <= answered)
    }
}

/// Thread context cannot decide: it lost the request's context while the process had a failed
/// call, or it saw a failure it cannot place. Only then are the other links tried.
fn needs_link(found: &Found) -> bool {
    let lost = found.context == Context::Lost;
    (lost && found.process_failed) || unplaced(found)
}

/// Its own calls show no failure (an attempt its retry recovered is none), but a call the
/// process handed off failed meanwhile: it may have been this request's.
fn unplaced(found: &Found) -> bool {
    found.context != Context::Lost
        && found.orphan_failed
        && found
            .children
            .iter()
            .all(|c| !c.failed() || c.recovered_by(found.answered))
}

/// How long a failed request may wait past its end for its process's concurrent requests to be
/// answered, so a failed call carrying one of their trace ids, or made on one of their threads,
/// can be placed (see [`Engine::judge_or_wait`]): a few callers' timeouts' worth of a busy
/// service.
pub(super) const TRACE_WAIT_NS: u64 = 3_000_000_000;

/// The most any verdict waits past its end, however long the calls it waits on ran.
pub(super) const MAX_WAIT_NS: u64 = 10_000_000_000;

/// Whether [`Engine::link`] decided, or the verdict waits (for the trace link, or for the
/// request an unplaced failure's thread was serving).
#[derive(PartialEq, Eq)]
enum Linking {
    Done,
    Wait,
}

/// The outcome of linking a request to its calls by the trace id it brought in.
enum TraceLink {
    Linked(Vec<Child>),
    /// Not yet provable: another in-flight request's calls failed meanwhile.
    Wait,
    Unsound(Unlinked),
}

impl Engine {
    pub(super) fn dependency(&self, edge: u32) -> DependencyKind {
        let Some(e) = self.edges.get(edge as usize) else {
            return DependencyKind::Unknown;
        };
        if e.mem_child_fail < MEMORY_MIN_SAMPLES {
            return DependencyKind::Unknown;
        }
        // Laplace-smoothed share of this dependency's failures the caller did not survive.
        if (e.mem_parent_fail + 1.0) / (e.mem_child_fail + 2.0) >= MEMORY_FAIL_CLOSE {
            DependencyKind::FailClose
        } else {
            DependencyKind::FailOpen
        }
    }

    pub(super) fn fail_close(&self, edge: u32) -> bool {
        !self.cfg.failure_memory || self.dependency(edge) != DependencyKind::FailOpen
    }

    pub(super) fn remember(&mut self, edge: u32, parent_failed: bool) {
        if let Some(e) = self.edges.get_mut(edge as usize) {
            if e.mem_child_fail >= MEMORY_DECAY_AT {
                // Halve the evidence so a dependency that changes behaviour is relearned.
                e.mem_child_fail /= 2.0;
                e.mem_parent_fail /= 2.0;
            }
            e.mem_child_fail += 1.0;
            e.mem_parent_fail += f32::from(u8::from(parent_failed));
        }
    }

    /// The callee's claim on a failed child call.
    pub(super) fn callee_claim(&self, c: &Child) -> Claim {
        if let Some(v) = self.recent_verdicts.get(&c.tuple)
            && v.start >= c.start
            && v.end <= c.end.saturating_add(self.grace_ns)
        {
            return v.claim;
        }
        c.claim_header.unwrap_or(Claim::Missing)
    }

    /// The verdict on a failed inbound request whose grace period is over.
    /// Judges `p` now, whatever is still unknown (eviction, end of input).
    pub(super) fn judge(&mut self, p: Pending, out: &mut Vec<Verdict>) {
        self.judge_or_wait(p, out, false);
    }

    /// Judges `p`, or, when `may_wait` and its trace link waits for concurrent requests of its
    /// process (see [`TRACE_WAIT_NS`]), hands it back to be judged later.
    pub(super) fn judge_or_wait(
        &mut self,
        p: Pending,
        out: &mut Vec<Verdict>,
        may_wait: bool,
    ) -> Option<Pending> {
        let mut found = self.gather(&p);
        let may_wait = may_wait && self.wait_until(&p) > self.now;
        if self.link(&p, &mut found, may_wait) == Linking::Wait {
            return Some(p);
        }
        self.conclude(&p, &found, out);
        None
    }

    /// Until when `p` may wait for its process's concurrent requests: [`TRACE_WAIT_NS`] past
    /// its end or past the end of the last call of the process that failed during it (or of
    /// that call's newest retry), whichever is later (a request whose call failed late, or
    /// that retried it, answers that much later; measured: a caller's request that ran 3.9 s
    /// left 3 verdicts at its hop `missing` when the wait counted from their own end, and a
    /// 2.3 s call retried for 2 s more left 5 when it counted from the failed attempt's end),
    /// never more than [`MAX_WAIT_NS`] past its end.
    fn wait_until(&self, p: &Pending) -> u64 {
        let last_failure = self.procs.get(&p.pid).map_or(0, |x| {
            x.failures
                .ending_from(p.start)
                .filter(|(c, _)| c.start <= p.end && c.end >= p.start)
                .map(|(c, _)| c.end.max(c.retried_until))
                .max()
                .unwrap_or(0)
        });
        p.end
            .max(last_failure)
            .saturating_add(TRACE_WAIT_NS)
            .min(p.end.saturating_add(MAX_WAIT_NS))
    }

    /// The verdict on a failed request served alone, at its answer: a Go request (its
    /// goroutine's calls, and those the uprobes traced to it as their root; a goroutine serves
    /// one request at a time), or a thread's that l7 saw read and answer it with no other
    /// request of that thread in flight (`Exchange::sole_on_thread`: not an event loop, whose
    /// overlapping requests the grace period otherwise waits to see). When its own calls show a
    /// failed fail-close dependency, it is unclaimed whatever else arrives later — more calls
    /// only add causes, and the process-wide checks only matter when no cause is known — so
    /// waiting the grace period would only delay the decision above it. Returns whether it was
    /// judged.
    pub(super) fn judge_at_answer(&mut self, p: &Pending, out: &mut Vec<Verdict>) -> bool {
        let found = self.gather(p);
        if found.context != Context::Followed || needs_link(&found) {
            return false;
        }
        let failed = found.failed_children(p.end);
        let calls = self.failed_calls(&failed);
        if self.decide_on(&found, &calls).reason != Reason::Dependency {
            return false;
        }
        self.stats.early_verdicts += 1;
        self.conclude(p, &found, out);
        true
    }

    fn decide_on(&self, found: &Found, calls: &[FailedCall]) -> claim::Decision {
        claim::decide(&Evidence {
            context: found.context,
            failed: calls,
            process_failed: found.process_failed,
            orphan_failed: found.orphan_failed,
            at_least_once: self.cfg.at_least_once,
            unseen: found
                .unseen_children(found.answered)
                .any(|c| self.fail_close(c.edge)),
        })
    }

    /// Decides, learns, books and emits the verdict on `p` from what judging found.
    fn conclude(&mut self, p: &Pending, found: &Found, out: &mut Vec<Verdict>) {
        let failed = found.failed_children(p.end);
        // Memory learns only from contexts thread context proved.
        if self.cfg.failure_memory && found.context == Context::Followed {
            self.learn(&failed);
        }
        let calls = self.failed_calls(&failed);
        let decision = self.decide_on(found, &calls);
        let caused_by = if decision.reason == Reason::Dependency {
            self.caused_by(&failed, &calls)
        } else {
            Vec::new()
        };
        let link = verdict_link(p, found, decision.claim);
        if decision.claim == Claim::Missing {
            let why = if decision.reason == Reason::OutcomeUnseen {
                Unlinked::OutcomeUnseen
            } else {
                found.unlinked.unwrap_or(Unlinked::NoTrace)
            };
            if let Some(n) = self.stats.unlinked.get_mut(why.index()) {
                *n += 1;
            }
        }
        let (service, caller) = self.book(p, decision.claim, link);
        out.push(Verdict {
            exchange: p.id,
            service,
            caller,
            claim: decision.claim,
            outcome: p.outcome,
            status: p.status,
            caused_by,
            ts_ns: p.end,
            link,
        });
    }

    /// Arrival-time context plus whatever arrived during the grace period, and the
    /// process-wide checks (as of now when the failure history still covers the request).
    fn gather(&self, p: &Pending) -> Found {
        let mut children = p.children.clone();
        let mut ambiguous = p.ambiguous || p.cross_thread;
        if let Some(ctx) = self.threads.get(&(p.pid, p.thread)) {
            ambiguous |= ctx.event_loop;
            for c in ctx
                .children
                .iter()
                .filter(|c| c.start >= p.start && c.start <= p.end)
            {
                if !children.iter().any(|k| k.id == c.id) {
                    children.push(*c);
                }
            }
        }
        let covered = self
            .procs
            .get(&p.pid)
            .is_none_or(|x| x.failures_lost_until < p.start);
        let (process_failed, orphan_failed) = if covered {
            (
                self.process_failed_during(p.pid, p.start, p.end),
                self.orphan_failed_during(p.pid, p.thread, p.start, p.end),
            )
        } else {
            (p.process_failed, p.orphan_failed)
        };
        let context = if ambiguous {
            Context::Lost
        } else {
            Context::Followed
        };
        Found {
            children,
            context,
            process_failed,
            orphan_failed,
            linked_by: None,
            answered: p.end,
            unlinked: None,
        }
    }

    /// Thread context cannot tell (or saw a failure it cannot place): try the timing link,
    /// then, for a lost context, the sole-request link.
    /// A trace link that is not provable yet returns `Wait` when `may_wait` (nothing changed).
    fn link(&mut self, p: &Pending, found: &mut Found, may_wait: bool) -> Linking {
        if !needs_link(found) {
            return Linking::Done;
        }
        let lost = found.context == Context::Lost;
        let trace = self.trace_link(p);
        if may_wait && matches!(trace, TraceLink::Wait) {
            return Linking::Wait;
        }
        if may_wait
            && !matches!(trace, TraceLink::Linked(_))
            && unplaced(found)
            && self.orphans_may_be_placed(p)
        {
            return Linking::Wait;
        }
        if let TraceLink::Linked(cs) = trace {
            found.children = cs;
            found.context = Context::Linked;
            found.linked_by = Some(Link::TraceHeader);
            self.stats.trace_links += 1;
        } else if let Some(c) = self.link_by_timing(p) {
            found.children = vec![c];
            found.context = Context::Linked;
            found.linked_by = Some(Link::Timing);
            self.stats.timing_links += 1;
        } else if lost && let Some(cs) = self.link_sole_inbound(p) {
            found.children = cs;
            found.context = Context::Linked;
            found.linked_by = Some(Link::SoleInbound);
            self.stats.sole_links += 1;
        } else {
            found.unlinked = Some(match trace {
                TraceLink::Unsound(why) => why,
                _ => Unlinked::WaitExpired,
            });
        }
        Linking::Done
    }

    /// Failure-pattern memory: each dependency that failed in a context that failed.
    fn learn(&mut self, failed: &[Child]) {
        let mut seen: Vec<u32> = Vec::new();
        for c in failed {
            if !seen.contains(&c.edge) {
                seen.push(c.edge);
                self.remember(c.edge, true);
            }
        }
    }

    /// What the claim decision needs to know about each failed call.
    fn failed_calls(&self, failed: &[Child]) -> Vec<FailedCall> {
        failed
            .iter()
            .map(|c| FailedCall {
                fail_close: self.fail_close(c.edge),
                callee_claim: self.callee_claim(c),
                retryable: match c.outcome {
                    OutcomeClass::Transient => true,
                    OutcomeClass::Unknown => c.idempotent,
                    _ => false,
                },
                retried: self
                    .edges
                    .get(c.edge as usize)
                    .is_some_and(|e| e.retries_total > 0)
                    || failed.iter().any(|o| o.edge == c.edge && o.retry),
            })
            .collect()
    }

    /// The failed calls that caused an unclaimed error, named.
    fn caused_by(&mut self, failed: &[Child], calls: &[FailedCall]) -> Vec<ChildFailure> {
        let mut caused_by = Vec::new();
        for (c, _) in failed.iter().zip(calls).filter(|(_, f)| f.is_cause()) {
            let callee = self
                .edges
                .get(c.edge as usize)
                .map(|e| e.peer)
                .unwrap_or(Peer::Overflow);
            let callee = self.peer_name(callee);
            caused_by.push(ChildFailure {
                exchange: c.id,
                callee,
                outcome: c.outcome,
                status: c.status,
            });
        }
        caused_by
    }

    /// Counts the claim (engine, service figures, the caller's edge) and remembers it for the
    /// caller's own verdict. Returns the names of the service and of its caller, if known.
    fn book(&mut self, p: &Pending, claim: Claim, link: Link) -> (ServiceId, Option<ServiceId>) {
        self.stats.verdicts.add(claim);
        self.recent_verdicts.insert(
            p.tuple,
            RecentVerdict {
                claim,
                start: p.start,
                end: p.end,
            },
        );
        let ep = self.epoch(p.start);
        if let Some(b) = self
            .svcs
            .get_mut(p.svc as usize)
            .and_then(|s| s.ring.at(ep))
            && let Some(n) = b.claims.get_mut(claim_index(claim))
        {
            *n += 1;
        }
        // The caller's edge learns the claim its callee (us) gave.
        let caller = self.caller_pid(p.pid, p.local, p.remote);
        let (svc_pid, svc_port) = self
            .svcs
            .get(p.svc as usize)
            .map_or((p.pid, 0), |s| (s.pid, s.port));
        let caller_name = match caller {
            Some(c) => {
                let edge = self.edge_key(
                    c,
                    Peer::Local {
                        pid: svc_pid,
                        port: svc_port,
                    },
                    None,
                );
                let counted = self.header_claimed.get(&p.tuple).is_some();
                if !counted && let Some(b) = self.edge_bucket(edge, p.start) {
                    let slots = [
                        b.claims.get_mut(claim_index(claim)),
                        b.links.get_mut(link.index()),
                    ];
                    for n in slots.into_iter().flatten() {
                        *n += 1;
                    }
                }
                Some(self.name(c, 0))
            }
            None => {
                if let Some(b) = self
                    .svcs
                    .get_mut(p.svc as usize)
                    .and_then(|s| s.ring.at(ep))
                {
                    let slots = [
                        b.unattributed.get_mut(claim_index(claim)),
                        b.unattributed_links.get_mut(link.index()),
                    ];
                    for n in slots.into_iter().flatten() {
                        *n += 1;
                    }
                }
                None
            }
        };
        (self.name(svc_pid, svc_port), caller_name)
    }

    /// When this was the only inbound request the process served during its span, every
    /// outbound call the process made inside that span was made for it, whichever thread (or
    /// goroutine, or event-loop turn) did the I/O. None when another known inbound request
    /// overlaps, or the process's failure history does not reach back that far. (A request
    /// still unanswered when we judge is not known yet: the grace period is the margin.)
    pub(super) fn link_sole_inbound(&self, p: &Pending) -> Option<Vec<Child>> {
        let proc_ = self.procs.get(&p.pid)?;
        if !proc_.reaches_back_to(p.start, p.id) {
            return None;
        }
        let overlapped = proc_
            .inbound
            .ending_from(p.start)
            .any(|&(s, e, id, _, _)| id != p.id && s < p.end && p.start < e);
        if overlapped {
            return None;
        }
        let children: Vec<Child> = proc_
            .failures
            .ending_from(p.start)
            .map(|(c, _)| *c)
            .filter(|c| c.start >= p.start && c.end <= p.end)
            .collect();
        (!children.is_empty()).then_some(children)
    }

    /// The request carried a propagated trace id and the process forwards it: its failed calls
    /// are the process's failed calls carrying that id that it started while in flight,
    /// whichever thread made them. Sound only when (a) no other known inbound request of the
    /// process with the same id overlaps it (a fan-out of one trace into this process, or a
    /// caller's hedge), (b) every fail-close failure of the process during it carries the trace
    /// id of a known inbound request of the process in flight when the call started (a failed
    /// call without one, e.g. to a database, or with a fresh id an SDK that lost the context
    /// made up, could be this request's), and (c) the process's histories reach back to it. (As for the sole-request link, a request still
    /// unanswered when we judge is not known yet: the grace period is the margin.)
    /// The trace link, or why not: `Wait` when a failed call during `p` carried a trace id no
    /// known inbound request of the process brought in, most likely one of its concurrent
    /// requests still in flight. Until that one is answered the link cannot be proved.
    fn trace_link(&self, p: &Pending) -> TraceLink {
        let Some(trace) = p.trace else {
            return TraceLink::Unsound(Unlinked::NoTrace);
        };
        let Some(proc_) = self.procs.get(&p.pid) else {
            return TraceLink::Unsound(Unlinked::HistoryLost);
        };
        if !proc_.reaches_back_to(p.start, p.id) {
            return TraceLink::Unsound(Unlinked::HistoryLost);
        }
        let same_trace_overlaps = proc_
            .inbound
            .of_key(trace)
            .rev()
            .any(|&(s, e, id, _, _)| id != p.id && s < p.end && p.start < e);
        if same_trace_overlaps {
            return TraceLink::Unsound(Unlinked::TraceShared);
        }
        let during = |c: &Child| c.start <= p.end && c.end >= p.start;
        let placed = |c: &Child| {
            c.trace.is_some_and(|t| {
                proc_
                    .inbound
                    .of_key(t)
                    .rev()
                    .any(|&(s, e, _, _, _)| s <= c.start && c.start <= e)
            })
        };
        let mut unplaced = proc_
            .failures
            .ending_from(p.start)
            .filter(|(c, _)| {
                during(c) && !c.recovered_by(p.end) && self.fail_close(c.edge) && !placed(c)
            })
            .peekable();
        if unplaced.peek().is_some() {
            // A call without a trace id (a database, an SDK that lost the context) could be
            // this request's: never provable. One with another request's id: wait for it.
            let all_traced = unplaced.all(|(c, _)| c.trace.is_some_and(|t| t != trace));
            return if all_traced {
                TraceLink::Wait
            } else {
                TraceLink::Unsound(Unlinked::UntracedCall)
            };
        }
        TraceLink::Linked(
            // A call starting in the span ended in it or after.
            proc_
                .failures
                .ending_from(p.start)
                .map(|(c, _)| *c)
                .filter(|c| {
                    c.trace == Some(trace)
                        && !c.recovered_by(p.end)
                        && c.start >= p.start
                        && c.start <= p.end
                })
                .collect(),
        )
    }

    /// The one failed outbound call of the process that completed within `timing_link_ms`
    /// before this response started, after the request was read, that no other response of
    /// the process followed as closely and that no other request of the process was known to be
    /// in flight for when it started. An event loop answers right after the call it waited
    /// for returns; when two calls or two responses compete, nothing is linked. A failed attempt
    /// its retry recovered is no candidate (it ended nothing).
    pub(super) fn link_by_timing(&self, p: &Pending) -> Option<Child> {
        let gap = self.cfg.timing_link_ms.saturating_mul(NS_PER_MS);
        let resp = p.resp_start?;
        if gap == 0 {
            return None;
        }
        let proc_ = self.procs.get(&p.pid)?;
        let before = |t: u64| t <= resp && resp - t <= gap;
        let mut found = None;
        for (c, _) in proc_.failures.ending_from(p.req_end) {
            if c.start >= p.req_end && c.end <= resp && before(c.end) && !c.recovered_by(p.end) {
                if found.is_some() {
                    return None; // two candidates
                }
                found = Some(*c);
            }
        }
        let c = found?;
        // The rivals below must be knowable: an evicted response or request could be one.
        if proc_.responses_lost_until >= c.end || !proc_.inbound_covers(c.start) {
            return None;
        }
        // Another response of the process written as soon after the call: it could be the one
        // the call answered.
        let competing_response = proc_
            .responses
            .iter()
            .any(|&(rs, id)| id != p.id && rs >= c.end && rs.saturating_sub(c.end) <= gap);
        if competing_response {
            return None;
        }
        // Another request of the process in flight when the call started could be the one it
        // was made for, whatever it answered: it may have answered later after work of its
        // own, retried the call, or survived it by a fallback. Measured at 8+ requests in
        // flight per service (lab concurrency): counting only rivals that failed, 1 of 1 and
        // 2 of 2 timing links were wrong, the call's owner answering after the verdict.
        let rival = proc_
            .inbound
            .ending_from(c.start)
            .any(|&(s, e, id, _, _)| id != p.id && s <= c.start && c.start < e);
        if rival {
            return None;
        }
        Some(c)
    }

    pub(super) fn process_failed_during(&self, pid: u32, start: u64, end: u64) -> bool {
        let Some(p) = self.procs.get(&pid) else {
            return false;
        };
        if p.failures_lost_until >= start {
            return true; // cannot prove otherwise
        }
        p.failures.ending_from(start).any(|(c, _)| {
            c.start <= end && c.end >= start && !c.recovered_by(end) && self.fail_close(c.edge)
        })
    }

    /// A fail-close outbound failure of the process during [start, end] on another thread that
    /// was serving no inbound request then: work handed off to a pool, i.e. a context we could
    /// not follow. Its inbound request is somewhere; it may be ours. Not so a Go call the
    /// uprobes traced to another request goroutine: that request may still be in flight (its
    /// window not known yet), but the call is its, not ours.
    pub(super) fn orphan_failed_during(&self, pid: u32, thread: u64, start: u64, end: u64) -> bool {
        self.orphan_threads(pid, thread, start, end)
            .next()
            .is_some()
    }

    /// The threads of the fail-close failures of `pid` during [start, end] made outside `thread`
    /// on a thread not known to be serving an inbound request then.
    fn orphan_threads(
        &self,
        pid: u32,
        thread: u64,
        start: u64,
        end: u64,
    ) -> impl Iterator<Item = u64> + '_ {
        let failures = self.procs.get(&pid).map(|p| p.failures.ending_from(start));
        failures.into_iter().flatten().filter_map(move |&(c, t)| {
            let (s, e, edge) = (c.start, c.end, c.edge);
            let traced = t & GOROUTINE_ROOTED != 0;
            let t = t & !GOROUTINE_ROOTED;
            let orphan = t != thread
                && !traced
                && s <= end
                && e >= start
                && self.fail_close(edge)
                && !self
                    .threads
                    .get(&(pid, t))
                    .is_some_and(|ctx| ctx.inbound.iter().any(|w| w.start <= s && s <= w.end));
            orphan.then_some(t)
        })
    }

    /// An unplaced failure was made on a thread that serves requests (it answered one before):
    /// it was most likely serving another request still in flight, whose window places the
    /// failure once it is answered. Worth waiting for (until [`Engine::wait_until`]); a thread that
    /// never served one (a pool's) is not.
    fn orphans_may_be_placed(&self, p: &Pending) -> bool {
        self.orphan_threads(p.pid, p.thread, p.start, p.end)
            .any(|t| {
                self.threads
                    .get(&(p.pid, t))
                    .is_some_and(|ctx| !ctx.inbound.is_empty())
            })
    }
}

/// What a verdict rests on: how its calls were tied to it. A `missing` verdict rests on
/// nothing; a followed context on its thread or, for Go, its goroutine (`thread_key` tags those).
fn verdict_link(p: &Pending, found: &Found, claim: Claim) -> Link {
    if claim == Claim::Missing {
        return Link::Unlinked;
    }
    match found.context {
        Context::Followed if p.thread & GOROUTINE_KEY != 0 => Link::GoUprobes,
        Context::Followed => Link::Thread,
        Context::Linked => found.linked_by.unwrap_or(Link::Unlinked),
        Context::Lost => Link::ProcessQuiet,
    }
}
