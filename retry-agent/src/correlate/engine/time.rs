//! Capture time: verdicts due after their grace period, buckets rolled into baselines, fault
//! windows (baselines frozen while a fault lasts).
use super::{Engine, FAULT_MIN_FAILURES, HISTORY_KEEP_NS};
use crate::correlate::types::Verdict;

/// A waiting verdict is looked at again at most this often (when the grace is shorter).
const TRACE_RECHECK_NS: u64 = 50_000_000;

impl Engine {
    pub(super) fn advance(&mut self, t: u64, out: &mut Vec<Verdict>) {
        if t > self.now {
            self.now = t;
        }
        while self.pending.front().is_some_and(|p| p.deadline <= self.now) {
            if let Some(p) = self.pending.pop_front()
                && let Some(mut p) = self.judge_or_wait(p, out, true)
            {
                // Back of the queue, due one grace later: deadlines stay in order (every other
                // one is at most now + grace), and the loop ends (it is after now).
                p.deadline = self.now.saturating_add(self.grace_ns.max(TRACE_RECHECK_NS));
                self.pending.push_back(p);
            }
        }
        self.roll();
    }

    pub(super) fn epoch(&self, t: u64) -> u64 {
        t / self.bucket_ns
    }

    /// Check complete buckets for faults and fold them into baselines (frozen during faults).
    pub(super) fn roll(&mut self) {
        let now_epoch = self.epoch(self.now);
        let from = match self.rolled_epoch {
            Some(r) if r >= now_epoch => return,
            Some(r) => r.max(now_epoch.saturating_sub(self.window)),
            None => now_epoch.saturating_sub(1),
        };
        let ratio = self.cfg.fault_failure_ratio;
        let faulty = |failures: u32, total: u32| {
            failures >= FAULT_MIN_FAILURES && f64::from(failures) >= ratio * f64::from(total)
        };
        for ep in from..now_epoch {
            let fault = self.edges.iter().any(|e| {
                e.ring
                    .get(ep)
                    .is_some_and(|b| faulty(b.failures, b.requests))
            }) || self
                .svcs
                .iter()
                .any(|s| s.ring.get(ep).is_some_and(|b| faulty(b.failures, b.served)));
            if fault {
                self.fault_epoch = Some(ep);
            }
            if self.fault_epoch.is_some_and(|f| ep < f + self.window) {
                continue; // frozen
            }
            let secs = self.bucket_ns as f64 / 1e9;
            for e in &mut self.edges {
                if let Some(b) = e.ring.get(ep).filter(|b| b.requests > 0) {
                    let r = f64::from(b.requests) / secs;
                    e.baseline.fold(r);
                }
            }
            for s in &mut self.svcs {
                if let Some(b) = s.ring.get(ep).filter(|b| b.served > 0) {
                    let r = f64::from(b.served) / secs;
                    s.baseline.fold(r);
                }
            }
        }
        self.rolled_epoch = Some(now_epoch);
        self.release_exited();
        self.recount_histories();
    }

    /// Exited processes whose entries their names keep: past the keep horizon no verdict can
    /// need their histories (up to ~80 KB for a busy one), so a node whose pods restart does
    /// not hold every dead process's.
    fn release_exited(&mut self) {
        let horizon = self.now.saturating_sub(HISTORY_KEEP_NS);
        for p in self.procs.values_mut() {
            let held = !(p.failures.is_empty() && p.inbound.is_empty() && p.responses.is_empty());
            if p.exited && p.exited_at < horizon && held {
                p.release_histories();
            }
        }
    }

    pub(super) fn fault_active(&self) -> bool {
        let now_epoch = self.epoch(self.now);
        self.fault_epoch
            .is_some_and(|f| now_epoch < f + 1 + self.window)
    }

    /// Complete buckets of the current window: [from, to).
    pub(super) fn window_epochs(&self) -> (u64, u64) {
        let to = self.epoch(self.now);
        (to.saturating_sub(self.window), to)
    }
}
