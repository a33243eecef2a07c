//! Outbound (client-role) exchanges: per-edge figures, retry / hedge detection, the children a
//! thread's inbound request may have caused, and the process-wide failure history.
use super::{
    AbandonedCall, CHILDREN_PER_THREAD, Child, Engine, FAILED_CALLS_PER_PROCESS,
    FAILURES_PER_PROCESS, HISTORY_KEEP_NS, Hist, Peer, RetryState, ThreadCtx, call_key,
    claim_index, class_index, rooted, thread_key, tuple_key,
};
use crate::{
    correlate::table::hash_one,
    l7::{Claim, Exchange, Failure, OutcomeClass, Protocol},
};

/// What one outbound call was, for the counters and the edge's bucket.
struct Call {
    edge: u32,
    retry: bool,
    hedged: bool,
    non_idem: bool,
    prev_class: Option<OutcomeClass>,
    gap: Option<f64>,
    failed: bool,
    header_claim: Option<Claim>,
}

impl Engine {
    /// One client-side exchange, in named steps: its edge and retry, the callee's claim it
    /// carries, the counters and the edge's bucket, then the child it is of its thread.
    pub(super) fn push_client(&mut self, ex: &Exchange) {
        self.stats.outbound += u64::from(ex.weight);
        let edge = self.edge_for(ex.pid, ex.remote);
        let tuple = tuple_key(ex.local, ex.remote);
        if let Some(local) = ex.local {
            let k = self.ns_key(ex.pid, local);
            self.client_socks.insert(k, ex.pid);
            if let Some(remote) = ex.remote {
                self.client_conns.insert(hash_one((k, remote)), ex.pid);
            }
        }
        let (retry, hedged, prev_class, gap, in_hedge) = self.detect_retry(ex, edge);
        // An outcome capture did not see (a lost response record, a header block of a
        // connection picked up mid-life) is no failure, as on the server's side (`push_server`).
        let failed = ex.failure_seen();
        let call = Call {
            edge,
            retry,
            hedged,
            non_idem: retry && !ex.idempotent && !ex.idempotency_key,
            prev_class,
            gap,
            failed,
            header_claim: self.header_claim(ex, edge, tuple, failed),
        };
        self.count_call(&call);
        self.book_call(ex, &call);
        if ex.failure == Some(Failure::Abandoned) {
            // When it gave up: its close, where l7 saw it (else its last byte).
            let at = ex.ended_ns.unwrap_or_else(|| ex.end_ns());
            self.abandoned.insert(
                tuple,
                AbandonedCall {
                    at,
                    edge,
                    hedge: in_hedge,
                },
            );
        }
        let child = Child {
            id: ex.id,
            start: ex.request_start_ns,
            end: ex.end_ns(),
            edge,
            tuple,
            outcome: ex.outcome,
            unseen: ex.outcome_unseen(),
            status: ex.status,
            claim_header: ex.claim_header,
            retry,
            idempotent: ex.idempotent || ex.idempotency_key,
            trace: ex.trace_id,
            retry_key: retry_key(ex, edge).unwrap_or(0),
            recovered_at: None,
            retried_until: 0,
        };
        self.record_child(ex, child, failed);
        if retry && !hedged && child.retry_key != 0 {
            self.mark_retried(ex, child.retry_key, known_success(ex));
        }
    }

    /// A retry of the failed attempts before it (same process, same request): they show the
    /// request that made them still in flight until its end, and when it succeeded they are
    /// recovered. Recovered attempts stay in the histories (the edge's figures count them) but
    /// explain no error of the request that made them.
    fn mark_retried(&mut self, ex: &Exchange, key: u64, succeeded: bool) {
        let before = ex.request_start_ns;
        let end = ex.end_ns();
        let mark = |c: &mut Child| {
            if c.retry_key == key && c.end <= before && c.outcome.is_failure() {
                c.retried_until = c.retried_until.max(end);
                if succeeded {
                    c.recovered_at.get_or_insert(before);
                }
            }
        };
        if let Some(p) = self.procs.get_mut(&ex.pid) {
            // The newest attempts of the request: as many as a process's failures held before
            // the history kept more (a chain longer than that is a flood, not a retry loop).
            p.failures
                .update_of_key(key, FAILURES_PER_PROCESS, |(c, _)| mark(c));
        }
        if let Some(ctx) = self.threads.get_mut(&(ex.pid, call_key(ex))) {
            ctx.children.iter_mut().for_each(mark);
        }
    }

    /// The callee's claim, when it cannot come from our own verdict on its inbound side.
    fn header_claim(
        &mut self,
        ex: &Exchange,
        edge: u32,
        tuple: u64,
        failed: bool,
    ) -> Option<Claim> {
        let local_callee = matches!(
            self.edges.get(edge as usize).map(|e| e.peer),
            Some(Peer::Local { .. })
        );
        let no_server_side = matches!(
            ex.failure,
            Some(Failure::ConnectRefused | Failure::ConnectTimeout)
        );
        // A loopback callee not seen serving yet is on this node: its verdict will say.
        let loopback = ex.remote.is_some_and(|r| r.ip().is_loopback());
        if failed && ((!local_callee && !loopback) || no_server_side) {
            Some(ex.claim_header.unwrap_or(Claim::Missing))
        } else if failed && let Some(c) = ex.claim_header {
            // A local callee behind a proxy (our shim stamps claims): its verdict cannot find
            // this edge (its inbound peer is the proxy), so the header is the edge's evidence.
            self.header_claimed.insert(tuple, ());
            Some(c)
        } else {
            None
        }
    }

    /// Engine-wide retry counters (retry success by the class of the failure retried).
    fn count_call(&mut self, c: &Call) {
        if !c.retry {
            return;
        }
        self.stats.retries += 1;
        if c.hedged {
            self.stats.hedged_retries += 1;
        }
        if c.non_idem {
            self.stats.non_idempotent_retries += 1;
        }
        if let Some(i) = c.prev_class.and_then(class_index)
            && let Some(slot) = self.stats.retry_outcomes.get_mut(i + 1)
        {
            slot.0 += 1;
            slot.1 += u64::from(!c.failed);
        }
    }

    /// The edge's totals and its time bucket.
    /// A summary's weight counts as that many calls, those the kernel counted before it as
    /// first attempts (quiet ones: what follows a failure is sent whole).
    fn book_call(&mut self, ex: &Exchange, c: &Call) {
        if let Some(e) = self.edges.get_mut(c.edge as usize) {
            e.requests_total += u64::from(ex.weight);
            e.retries_total += u64::from(c.retry);
        }
        let Some(b) = self.edge_bucket(c.edge, ex.request_start_ns) else {
            return;
        };
        b.requests = b.requests.saturating_add(ex.weight);
        let counted = ex.weight.saturating_sub(1);
        if c.retry {
            b.retries += 1;
            b.first = b.first.saturating_add(counted);
        } else {
            b.first = b.first.saturating_add(ex.weight);
        }
        b.failures += u32::from(c.failed);
        b.hedged += u32::from(c.hedged);
        b.non_idempotent += u32::from(c.non_idem);
        if let Some(i) = c.prev_class.and_then(class_index) {
            if let Some(n) = b.retry_n.get_mut(i) {
                *n += 1;
            }
            if !c.failed
                && let Some(n) = b.retry_ok.get_mut(i)
            {
                *n += 1;
            }
        }
        if let Some(g) = c.gap {
            b.gap_n += 1;
            b.gap_sum += g;
            b.gap_sq += g * g;
        }
        if let Some(claim) = c.header_claim {
            let i = claim_index(claim);
            for n in [b.claims.get_mut(i), b.header.get_mut(i)]
                .into_iter()
                .flatten()
            {
                *n += 1;
            }
        }
    }

    /// A client's tally: quiet calls the kernel counted, first attempts that went well, on the
    /// edge and in its bucket; nothing else (no retry, no child: none of them is this).
    pub(super) fn tally_calls(&mut self, ex: &Exchange) {
        self.stats.outbound += u64::from(ex.weight);
        let edge = self.edge_for(ex.pid, ex.remote);
        if let Some(e) = self.edges.get_mut(edge as usize) {
            e.requests_total += u64::from(ex.weight);
        }
        if let Some(b) = self.edge_bucket(edge, ex.request_start_ns) {
            b.requests = b.requests.saturating_add(ex.weight);
            b.first = b.first.saturating_add(ex.weight);
        }
    }

    /// The call as a child of its thread (or goroutine) and, failed, in the process history.
    fn record_child(&mut self, ex: &Exchange, child: Child, failed: bool) {
        if failed {
            let p = self.room_for(ex.pid, Hist::Failures, FAILED_CALLS_PER_PROCESS);
            // Past `FAILURES_PER_PROCESS` entries only those a wait may still need stay (as for
            // the inbound history), so a process that failed once keeps no more than before.
            let mut aged = 0;
            while p.failures.len() >= FAILURES_PER_PROCESS
                && p.failures
                    .front()
                    .is_some_and(|(c, _)| c.end.saturating_add(HISTORY_KEEP_NS) < child.end)
                && p.pop_oldest(Hist::Failures)
            {
                aged += 1;
            }
            p.failures
                .push_back((child, call_key(ex) | rooted(ex.goid)));
            self.hist.failures = self.hist.failures.saturating_sub(aged);
        }
        let ctx = self
            .threads
            .get_or_insert_with((ex.pid, call_key(ex)), ThreadCtx::default);
        if ctx.children.len() >= CHILDREN_PER_THREAD
            && let Some(old) = ctx.children.pop_front()
        {
            ctx.children_lost_until = ctx.children_lost_until.max(old.start);
        }
        ctx.children.push_back(child);
    }

    /// Attempt k+1 of the same request on the same edge: returns (retry, hedged, class of the
    /// failure retried, gap since the previous attempt ended in seconds).
    ///
    /// Two identical calls in flight at once are a hedge only when one of them was given up
    /// (closed while waiting, or its stream cancelled): that is what hedging clients do to the
    /// loser (gRPC, Envoy, Go's hedgers), and what many workers polling the same URL never do.
    /// A hedger that lets the loser run to its end is seen only by its markers.
    pub(super) fn detect_retry(
        &mut self,
        ex: &Exchange,
        edge: u32,
    ) -> (bool, bool, Option<OutcomeClass>, Option<f64>, bool) {
        let marker = ex.retry_markers.says_retry();
        let Some(key) = retry_key(ex, edge) else {
            let class = marker.then_some(OutcomeClass::Unknown);
            return (marker, false, class, None, false);
        };
        let start = ex.request_start_ns;
        let given_up = ex.failure.is_some_and(Failure::given_up);
        // A given-up attempt was in flight until its close, not only until its last request byte.
        let end = match ex.ended_ns {
            Some(closed) if given_up => closed.max(ex.end_ns()),
            _ => ex.end_ns(),
        };
        let window = self.retry_window_ns;
        let prev = self.retry_keys.get(&key).copied();
        let mut out = (false, false, None, None);
        let mut attempt = 1;
        // One of two identical calls in flight together, one of them dropped (either one).
        let mut in_hedge = false;
        match prev {
            Some(p) if start >= p.start => {
                if p.end > start {
                    // The previous attempt was still in flight: a hedge, if either was dropped.
                    if start - p.start <= window && (given_up || p.given_up) {
                        out = (true, true, Some(OutcomeClass::Unknown), None);
                        attempt = p.attempt + 1;
                        in_hedge = true;
                    }
                } else if p.failed
                    && start - p.end <= window
                    && !self.context_ended(ex.pid, p, start)
                {
                    let gap = (start - p.end) as f64 / 1e9;
                    out = (true, false, Some(p.outcome), Some(gap));
                    attempt = p.attempt + 1;
                }
            }
            Some(p) => {
                // Reported out of order: this attempt started first and was still running when
                // the recorded one started, so the recorded one was its hedge. Fix the books.
                if end > p.start
                    && p.start - start <= window
                    && p.attempt == 1
                    && (given_up || p.given_up)
                {
                    let ep = self.epoch(p.start);
                    if let Some(e) = self.edges.get_mut(edge as usize) {
                        e.retries_total += 1;
                        if let Some(b) = e.ring.at(ep) {
                            b.first = b.first.saturating_sub(1);
                            b.retries += 1;
                            b.hedged += 1;
                        }
                    }
                    self.stats.retries += 1;
                    self.stats.hedged_retries += 1;
                    if let Some(r) = self.retry_keys.get_mut(&key) {
                        r.attempt = 2;
                    }
                    in_hedge = true;
                }
                return if marker {
                    (true, false, Some(OutcomeClass::Unknown), None, in_hedge)
                } else {
                    (false, false, None, None, in_hedge)
                };
            }
            None => {}
        }
        if marker && !out.0 {
            out = (
                true,
                false,
                Some(prev.map_or(OutcomeClass::Unknown, |p| p.outcome)),
                None,
            );
            attempt = 2;
        }
        let thread = thread_key(ex.tid, ex.goid);
        self.retry_keys.insert(
            key,
            RetryState {
                start,
                end,
                outcome: ex.outcome,
                attempt,
                thread,
                given_up,
                failed: ex.failure_seen(),
            },
        );
        (out.0, out.1, out.2, out.3, in_hedge)
    }

    /// The inbound request that made attempt `p` was answered before `start`: a repeat now is
    /// not that request's retry (it is a new request, e.g. our caller's retry reaching us).
    /// Only known for threads that serve one request at a time.
    pub(super) fn context_ended(&self, pid: u32, p: RetryState, start: u64) -> bool {
        self.threads.get(&(pid, p.thread)).is_some_and(|ctx| {
            !ctx.event_loop
                && ctx
                    .inbound
                    .iter()
                    .any(|w| w.start <= p.start && w.end >= p.end && w.end <= start)
        })
    }
}

/// What makes two attempts "the same request": process, edge, method, authority, path, query,
/// body and the propagated trace id. Without a method there is nothing to call the same request
/// (opaque bytes). The trace id tells identical calls made for different inbound requests apart
/// (an event loop's `GET /config` per request, which no thread context separates): retries keep
/// the headers of their first attempt, so they keep its trace. A caller that starts a new trace
/// per attempt (instrumented client, uninstrumented server side) has its retries seen only by
/// their markers; calls that carry no trace id match as before.
fn retry_key(ex: &Exchange, edge: u32) -> Option<u64> {
    if ex.protocol == Protocol::Opaque || ex.method.is_none() {
        return None;
    }
    Some(hash_one((
        ex.pid,
        edge,
        &ex.method,
        ex.authority.as_deref(),
        // The path, not the route: /users/1 and /users/2 are different requests.
        ex.path.as_deref().or(ex.route.as_deref()),
        ex.query_hash,
        ex.body_hash,
        ex.trace_id,
    )))
}

/// The call is known to have succeeded: fully seen, and over HTTP/2 with a gRPC status of OK
/// (a gRPC call whose trailers went unseen reads as HTTP 200; it may have failed).
fn known_success(ex: &Exchange) -> bool {
    !ex.failed() && !ex.unknown && (ex.protocol != Protocol::Http2 || ex.grpc_status == Some(0))
}
