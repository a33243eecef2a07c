//! Inbound (server-role) exchanges: served figures, thread windows (event-loop detection),
//! timeout mismatches, and failed requests queued for their verdict.
use super::{
    Child, Engine, FAILURES_PER_PROCESS, HISTORY_KEEP_NS, Hist, INBOUND_PER_PROCESS,
    INBOUND_PER_THREAD, OVERFLOW_EDGE, Peer, Pending, ThreadCtx, Window, thread_key, tuple_key,
};
use crate::{
    correlate::{table::hash_one, types::Verdict},
    l7::{Exchange, Failure},
};

/// Where a failed request's verdict will look for its context.
struct Queued {
    svc: u32,
    tuple: u64,
    thread: u64,
    window: Window,
    cross_thread: bool,
}

impl Engine {
    /// One server-side exchange, in named steps: where it listens, the served figures, the
    /// process-wide histories, its thread window, then its verdict queued (failed) or what its
    /// success teaches the failure memory.
    pub(super) fn push_server(&mut self, ex: &Exchange, out: &mut Vec<Verdict>) {
        self.stats.inbound += u64::from(ex.weight);
        let svc = self.svc_for(ex.pid, ex.local);
        self.remember_listener(ex);
        // The caller went away (gave up, reset): a timeout mismatch, not this service's error, so
        // no verdict and no failure in its figures. Nor when capture lost the response: a
        // verdict on an answer nobody saw would be a guess (under load, a dropped record made
        // one of each four Go verdicts in the lab's concurrency scenario).
        // Client-side tuple of this connection: (their local, their remote) = (our remote, our local).
        let tuple = tuple_key(ex.remote, ex.local);
        let failed = ex.failed()
            && !caller_gone(ex)
            && !self.closed_after_its_caller(ex, tuple)
            && !ex.outcome_unseen();
        self.book_served(ex, svc, failed);
        self.timeout_mismatch(ex, tuple);

        let thread = thread_key(ex.tid, ex.goid);
        // A Go handler's span, where a probe saw it, bounds its calls better than the wire. A
        // request its connection's end cut off was in flight until then (the lab's Node hop,
        // whose caller gave up after 3 s: its calls were nobody's, 5 verdicts `missing`).
        let end = in_flight_until(ex);
        let window = Window {
            id: ex.id,
            start: ex.handler_start_ns.unwrap_or(ex.request_start_ns),
            end: ex.handler_end_ns.map_or(end, |h| h.min(end)),
        };
        self.record_process_history(ex, window, failed);
        self.record_thread_window(ex.pid, thread, window);
        let cross_thread = ex.goid.is_none() && ex.response_tid.is_some_and(|t| t != ex.tid);
        if failed {
            self.queue_verdict(
                ex,
                Queued {
                    svc,
                    tuple,
                    thread,
                    window,
                    cross_thread,
                },
                out,
            );
        } else if self.cfg.failure_memory && !cross_thread {
            self.learn_from_success(ex.pid, thread, window);
        }
    }

    fn remember_listener(&mut self, ex: &Exchange) {
        if let Some(local) = ex.local {
            let port = local.port();
            let k = self.ns_key(ex.pid, local);
            self.listeners.insert(k, (ex.pid, port));
            // Also by bare address, for late resolution of remote-keyed edges.
            self.listeners
                .insert(hash_one((0u64, local)), (ex.pid, port));
        }
    }

    /// A server's tally: quiet requests the kernel counted, served, in the service's bucket;
    /// nothing else (no window, no verdict: none of them is this).
    pub(super) fn tally_served(&mut self, ex: &Exchange) {
        self.stats.inbound += u64::from(ex.weight);
        let svc = self.svc_for(ex.pid, ex.local);
        self.book_served(ex, svc, false);
    }

    /// A summary's weight counts as that many requests served.
    fn book_served(&mut self, ex: &Exchange, svc: u32, failed: bool) {
        let ep = self.epoch(ex.request_start_ns);
        if let Some(b) = self.svcs.get_mut(svc as usize).and_then(|s| s.ring.at(ep)) {
            b.served = b.served.saturating_add(ex.weight);
            b.failures += u32::from(failed);
        }
    }

    /// Process-wide histories, for the links thread context cannot make.
    fn record_process_history(&mut self, ex: &Exchange, window: Window, failed: bool) {
        if let Some(rs) = ex.response_start_ns {
            self.room_for(ex.pid, Hist::Responses, FAILURES_PER_PROCESS)
                .responses
                .push_back((rs, ex.id));
        }
        let p = self.room_for(ex.pid, Hist::Inbound, INBOUND_PER_PROCESS);
        // Answered first, first out: the front is the oldest answer. Past
        // `FAILURES_PER_PROCESS` entries only those a wait may still need stay.
        let mut aged = 0;
        while p.inbound.len() >= FAILURES_PER_PROCESS
            && p.inbound
                .front()
                .is_some_and(|f| f.1.saturating_add(HISTORY_KEEP_NS) < window.end)
            && p.pop_oldest(Hist::Inbound)
        {
            aged += 1;
        }
        p.inbound
            .push_back((window.start, window.end, ex.id, ex.trace_id, failed));
        self.hist.inbound = self.hist.inbound.saturating_sub(aged);
    }

    /// The request's window on its thread; one overlapping another marks an event loop.
    fn record_thread_window(&mut self, pid: u32, thread: u64, window: Window) {
        let ctx = self
            .threads
            .get_or_insert_with((pid, thread), ThreadCtx::default);
        if ctx
            .inbound
            .iter()
            .any(|w| w.id != window.id && w.start < window.end && window.start < w.end)
        {
            ctx.event_loop = true;
        }
        if ctx.inbound.len() >= INBOUND_PER_THREAD {
            ctx.inbound.pop_front();
        }
        ctx.inbound.push_back(window);
    }

    /// A failed request waits `context_grace_ms` for late children before it is judged.
    fn queue_verdict(&mut self, ex: &Exchange, q: Queued, out: &mut Vec<Verdict>) {
        let Queued {
            svc,
            tuple,
            thread,
            window,
            cross_thread,
        } = q;
        // A failed response whose timing was lost (l7 saw the connection end before the
        // response completed): the span of the request is unknown, so is its context.
        let span_unknown =
            ex.response_start_ns.is_none() && ex.response_end_ns.is_none() && ex.status.is_some();
        let (ambiguous, children) = self.children_of(ex.pid, thread, window.start, window.end);
        let ambiguous = ambiguous || span_unknown;
        let process_failed = self.process_failed_during(ex.pid, window.start, window.end);
        let orphan_failed = self.orphan_failed_during(ex.pid, thread, window.start, window.end);
        if self.pending.len() >= self.cfg.max_pending
            && let Some(p) = self.pending.pop_front()
        {
            // Bounded: judge the oldest now rather than drop it.
            self.stats.evictions += 1;
            self.judge(p, out);
        }
        let p = Pending {
            deadline: window.end.saturating_add(self.grace_ns),
            id: ex.id,
            pid: ex.pid,
            thread,
            start: ex.request_start_ns,
            end: window.end,
            svc,
            tuple,
            local: ex.local,
            remote: ex.remote,
            outcome: ex.outcome,
            status: ex.status,
            cross_thread,
            ambiguous,
            children,
            process_failed,
            orphan_failed,
            resp_start: ex.response_start_ns,
            req_end: ex.request_end_ns,
            trace: ex.trace_id,
        };
        // A goroutine serves one request at a time, and so does a thread l7 saw read and answer
        // this request with no other in between: a cause among its calls is final now.
        let alone = ex.goid.is_some() || (ex.sole_on_thread && !cross_thread);
        if alone && self.judge_at_answer(&p, out) {
            return;
        }
        self.pending.push_back(p);
    }

    /// A success despite failed children: evidence those dependencies are fail-open. A failure a
    /// later retry on the same edge recovered is no such evidence: the caller survived it by
    /// retrying, not by doing without (a fail-close dependency under a transient fault looks
    /// exactly like that). No allocation unless a child failed: this is the hot path.
    fn learn_from_success(&mut self, pid: u32, thread: u64, window: Window) {
        let mut failed_edges: Vec<u32> = match self.threads.get(&(pid, thread)) {
            Some(ctx) if !ctx.event_loop && ctx.children_lost_until < window.start => {
                let in_window = |c: &&Child| c.start >= window.start && c.start <= window.end;
                ctx.children
                    .iter()
                    .filter(in_window)
                    .filter(|c| c.failed())
                    .filter(|c| {
                        !ctx.children.iter().filter(in_window).any(|r| {
                            r.retry
                                && r.edge == c.edge
                                && r.start > c.start
                                && !r.outcome.is_failure()
                        })
                    })
                    .map(|c| c.edge)
                    .collect()
            }
            _ => Vec::new(),
        };
        failed_edges.sort_unstable();
        failed_edges.dedup();
        for edge in failed_edges {
            self.remember(edge, false);
        }
    }

    /// The server dropped a request it never answered after its caller on this node had given
    /// up on it: the close answered the caller's (a Node server closes the connection on the
    /// caller's FIN), so it is no failure of the server's.
    fn closed_after_its_caller(&self, ex: &Exchange, tuple: u64) -> bool {
        ex.response_start_ns.is_none()
            && ex.status.is_none()
            && matches!(self.abandoned.get(&tuple), Some(a) if ex.ended_ns.is_some_and(|e| e >= a.at))
    }

    pub(super) fn timeout_mismatch(&mut self, ex: &Exchange, tuple: u64) {
        let abandoned = self.abandoned.get(&tuple).copied();
        let edge = match abandoned {
            // A hedge's loser: its caller dropped it once the twin answered. The work was the
            // hedge's price, not a sign of timeouts shorter than this service's work.
            Some(a) if a.hedge => None,
            // The caller gave up before we finished (answered, or dropped when it left): our
            // work was wasted.
            Some(a) if in_flight_until(ex) > a.at => Some(a.edge),
            _ if caller_gone(ex) => {
                // The peer closed or reset while we were still working (caller not on this node,
                // or not captured): attribute to its edge if we know it.
                let caller = self.caller_pid(ex.pid, ex.local, ex.remote);
                Some(match caller {
                    Some(c) => {
                        let svc_port = ex.local.map_or(0, |a| a.port());
                        self.edge_key(
                            c,
                            Peer::Local {
                                pid: ex.pid,
                                port: svc_port,
                            },
                            ex.local,
                        )
                    }
                    None => OVERFLOW_EDGE,
                })
            }
            _ => None,
        };
        if let Some(edge) = edge {
            // Once per connection: a caller that gave up closes it, and l7 may report both the
            // unanswered request and the late response written into the closed socket.
            if self.mismatched.get(&tuple).is_some() {
                return;
            }
            self.mismatched.insert(tuple, ());
            self.stats.timeout_mismatches += 1;
            if let Some(e) = self.edges.get_mut(edge as usize) {
                e.mismatches_total += 1;
            }
            if let Some(b) = self.edge_bucket(edge, ex.request_start_ns) {
                b.mismatches += 1;
            }
        }
    }

    /// Children of a context on (pid, thread) spanning [start, end]; `true` if the context is
    /// ambiguous (event loop, lost children, unknown thread).
    pub(super) fn children_of(
        &mut self,
        pid: u32,
        thread: u64,
        start: u64,
        end: u64,
    ) -> (bool, Vec<Child>) {
        let Some(ctx) = self.threads.get(&(pid, thread)) else {
            return (true, Vec::new());
        };
        let ambiguous = ctx.event_loop || ctx.children_lost_until >= start;
        let children = ctx
            .children
            .iter()
            .filter(|c| c.start >= start && c.start <= end)
            .copied()
            .collect();
        (ambiguous, children)
    }
}

/// Until when the request was in flight: its last byte, or the close that cut it off (also the
/// capture time the engine's clock reaches with it).
pub(super) fn in_flight_until(ex: &Exchange) -> u64 {
    last_ns(ex).max(ex.ended_ns.unwrap_or(0))
}

/// The latest byte of an exchange seen: l7 may lose the response end (a close racing the last
/// write) and keep only its start.
fn last_ns(ex: &Exchange) -> u64 {
    ex.response_end_ns
        .unwrap_or(0)
        .max(ex.response_start_ns.unwrap_or(0))
        .max(ex.request_end_ns)
}

/// A server-side exchange the caller ended before it got its answer: it gave up (or reset).
/// Not `ClosedNoResponse` (our own close, or idleness), and not an error response that was
/// written whole before a close raced it (the service did answer, with an error).
pub(super) fn caller_gone(ex: &Exchange) -> bool {
    match ex.failure {
        Some(Failure::Abandoned | Failure::Reset) => true,
        Some(Failure::ResetMidResponse) => !ex.status.is_some_and(|s| s >= 400),
        _ => false,
    }
}
