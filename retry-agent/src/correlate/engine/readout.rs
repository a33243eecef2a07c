//! Read-out: per-edge figures over the window (internal edges merged by service name),
//! amplification per depth and storm radius, and the claim each service's errors carry.
use std::collections::BTreeMap;

use super::{
    ADDRS_PER_ENTRY, EdgeBucket, Engine, FAILURE_CLASSES, JITTER_MAX_CV, JITTER_MIN_SAMPLES,
    OVERFLOW_EDGE, Peer, counts, push_bounded, ratio,
};
use crate::{
    correlate::types::{
        ClaimCounts, ClaimSources, DependencyKind, DepthStats, Edge, EdgeStats, LinkCounts,
        PathStats, RECENT_BUCKETS, RetrySuccess, ServiceClaim, ServiceId,
    },
    l7::Claim,
};

impl Engine {
    /// Figures per edge over the window, internal edges merged by service name.
    pub fn edges(&self) -> Vec<EdgeStats> {
        let (from, to) = self.window_epochs();
        self.edges_over(from, to)
    }

    /// The same, over a window that ends with the current, partial bucket: what a burst
    /// evaluation reads, so claims from the last instants count before their bucket completes.
    /// Rates are then a little low (the partial bucket counts as whole): only the claims are
    /// meant to be read from it.
    pub fn edges_through_now(&self) -> Vec<EdgeStats> {
        let to = self.epoch(self.now) + 1;
        self.edges_over(to.saturating_sub(self.window), to)
    }

    fn edges_over(&self, from: u64, to: u64) -> Vec<EdgeStats> {
        let secs = (to - from) as f64 * self.bucket_ns as f64 / 1e9;
        let fault = self.fault_active();
        let mut merged: BTreeMap<Edge, (EdgeBucket, EdgeStats)> = BTreeMap::new();
        // Names: resolving needs &mut for the caches, so use the uncached resolver here.
        // Services whose unattributed claims an edge of that name already counted.
        let mut counted: Vec<(Edge, u32)> = Vec::new();
        for (i, e) in self.edges.iter().enumerate() {
            let mut sum = EdgeBucket::default();
            for b in e.ring.range(from, to) {
                add_bucket(&mut sum, b);
            }
            let (mut recent_requests, mut recent_failures) = (0, 0);
            for b in e
                .ring
                .range(to.saturating_sub(RECENT_BUCKETS).max(from), to)
            {
                recent_requests += u64::from(b.requests);
                recent_failures += u64::from(b.failures);
            }
            // The callee's verdicts whose caller was not seen (through the shim, which capture
            // leaves out, its callers' connections reach it from the shim's address) are
            // claims on every local edge into it: what the shim would stamp on its errors,
            // without waiting for the header to come back.
            let callee_svc = match e.peer {
                Peer::Local { pid, port } => self.svc_index.get(&(pid, port)).copied(),
                _ => None,
            };
            let (mut unattributed, mut unattributed_links) = ([0u32; 3], [0u32; 7]);
            if let Some(si) = callee_svc
                && let Some(svc) = self.svcs.get(si as usize)
            {
                for b in svc.ring.range(from, to) {
                    for (x, y) in unattributed.iter_mut().zip(b.unattributed) {
                        *x += y;
                    }
                    for (x, y) in unattributed_links.iter_mut().zip(b.unattributed_links) {
                        *x += y;
                    }
                }
            }
            if sum.requests == 0 && sum.claims.iter().all(|&n| n == 0) && sum.mismatches == 0 {
                continue;
            }
            let edge = if i as u32 == OVERFLOW_EDGE {
                Edge {
                    caller: self.other.clone(),
                    callee: self.other.clone(),
                }
            } else {
                Edge {
                    caller: self.lookup_name(e.caller, 0),
                    callee: self.lookup_peer(e.peer),
                }
            };
            // The shim's headers on this edge's responses are the same evidence (it stamps
            // the service's claim): the larger of the two counts, never both.
            let header: u32 = sum.header.iter().sum();
            if let Some(si) = callee_svc
                && unattributed.iter().sum::<u32>() > header
                && !counted.iter().any(|(e, s)| *s == si && *e == edge)
            {
                for ((x, h), y) in sum.claims.iter_mut().zip(&mut sum.header).zip(unattributed) {
                    *x = x.saturating_sub(*h) + y;
                    *h = 0;
                }
                for (x, y) in sum.links.iter_mut().zip(unattributed_links) {
                    *x += y;
                }
                counted.push((edge.clone(), si));
            }
            let fresh = !merged.contains_key(&edge);
            let entry = merged
                .entry(edge.clone())
                .or_insert_with(|| (EdgeBucket::default(), empty_stats(edge, secs, fault)));
            add_bucket(&mut entry.0, &sum);
            let s = &mut entry.1;
            s.recent_requests += recent_requests;
            s.recent_failures += recent_failures;
            for a in &e.addrs {
                push_bounded(&mut s.callee_addrs, *a, ADDRS_PER_ENTRY);
            }
            if let Some(b) = e.baseline.rate() {
                s.baseline_rate = Some(s.baseline_rate.unwrap_or(0.0) + b);
            }
            s.timeout_mismatches_total += e.mismatches_total;
            s.requests_total += e.requests_total;
            s.retries_total += e.retries_total;
            // Merged edges: the most cautious learned kind wins (fail-close > unknown > open).
            let kind = self.dependency(i as u32);
            s.dependency = if fresh {
                kind
            } else {
                match (s.dependency, kind) {
                    (DependencyKind::FailClose, _) | (_, DependencyKind::FailClose) => {
                        DependencyKind::FailClose
                    }
                    (DependencyKind::Unknown, _) | (_, DependencyKind::Unknown) => {
                        DependencyKind::Unknown
                    }
                    _ => DependencyKind::FailOpen,
                }
            };
        }
        merged
            .into_values()
            .map(|(b, s)| finish_stats(b, s))
            .collect()
    }

    /// Amplification per depth of the node's call graph and the storm radius.
    pub fn paths(&self) -> PathStats {
        let (from, to) = self.window_epochs();
        let secs = (to - from) as f64 * self.bucket_ns as f64 / 1e9;
        let edges = self.edges();
        // Local services with their window arrival and baseline, merged by name.
        let mut svc: BTreeMap<ServiceId, (f64, Option<f64>)> = BTreeMap::new();
        for s in &self.svcs {
            let served: u64 = s.ring.range(from, to).map(|b| u64::from(b.served)).sum();
            if served == 0 && s.baseline.rate().is_none() {
                continue;
            }
            let e = svc
                .entry(self.lookup_name(s.pid, s.port))
                .or_insert((0.0, None));
            e.0 += served as f64 / secs;
            if let Some(b) = s.baseline.rate() {
                e.1 = Some(e.1.unwrap_or(0.0) + b);
            }
        }
        let active: Vec<&EdgeStats> = edges.iter().filter(|e| e.requests > 0).collect();
        let has_caller = |s: &ServiceId| {
            active.iter().any(|e| {
                &e.edge.callee == s && svc.contains_key(&e.edge.caller) && &e.edge.caller != s
            })
        };
        let mut depth_of: BTreeMap<ServiceId, u32> = BTreeMap::new();
        let mut frontier: Vec<ServiceId> = svc.keys().filter(|s| !has_caller(s)).cloned().collect();
        let mut d = 0u32;
        while !frontier.is_empty() && d <= 64 {
            let mut next = Vec::new();
            for s in frontier {
                if depth_of.contains_key(&s) {
                    continue;
                }
                depth_of.insert(s.clone(), d);
                for e in active.iter().filter(|e| e.edge.caller == s) {
                    if svc.contains_key(&e.edge.callee) && !depth_of.contains_key(&e.edge.callee) {
                        next.push(e.edge.callee.clone());
                    }
                }
            }
            frontier = next;
            d += 1;
        }
        let mut depths: BTreeMap<u32, DepthStats> = BTreeMap::new();
        for (s, depth) in &depth_of {
            let Some(&(rate, base)) = svc.get(s) else {
                continue;
            };
            let ds = depths.entry(*depth).or_insert_with(|| DepthStats {
                depth: *depth,
                services: Vec::new(),
                arrival_rate: 0.0,
                baseline_rate: None,
                amplification: 1.0,
            });
            ds.services.push(s.clone());
            ds.arrival_rate += rate;
            if let Some(b) = base {
                ds.baseline_rate = Some(ds.baseline_rate.unwrap_or(0.0) + b);
            }
        }
        for ds in depths.values_mut() {
            ds.amplification = match ds.baseline_rate {
                Some(b) if b > 0.0 => ds.arrival_rate / b,
                _ => 1.0,
            };
        }
        let fault = self.fault_active();
        let (storm_radius, storm_path) = if fault {
            storm(&edges)
        } else {
            (0, Vec::new())
        };
        PathStats {
            depths: depths.into_values().collect(),
            storm_radius,
            storm_path,
            fault_active: fault,
        }
    }

    /// Per service: the claim its error responses should carry now (majority of the window
    /// that ends with the current, partial bucket: a claim counts from the verdict that makes
    /// it, not a bucket later).
    pub fn service_claims(&self) -> Vec<ServiceClaim> {
        let to = self.epoch(self.now) + 1;
        let from = to.saturating_sub(self.window);
        let mut by: BTreeMap<ServiceId, ServiceClaim> = BTreeMap::new();
        for s in &self.svcs {
            let mut c = [0u32; 3];
            for b in s.ring.range(from, to) {
                for (x, y) in c.iter_mut().zip(b.claims) {
                    *x += y;
                }
            }
            let name = self.lookup_name(s.pid, s.port);
            let e = by.entry(name.clone()).or_insert_with(|| ServiceClaim {
                service: name,
                addrs: Vec::new(),
                claim: Claim::Missing,
                counts: ClaimCounts::default(),
            });
            for a in &s.addrs {
                push_bounded(&mut e.addrs, *a, ADDRS_PER_ENTRY);
            }
            let add = counts(c);
            e.counts.claimed += add.claimed;
            e.counts.unclaimed += add.unclaimed;
            e.counts.missing += add.missing;
        }
        by.into_values()
            .map(|mut s| {
                s.claim = s.counts.majority().unwrap_or(Claim::Missing);
                s
            })
            .collect()
    }
}

fn add_bucket(a: &mut EdgeBucket, b: &EdgeBucket) {
    a.requests += b.requests;
    a.first += b.first;
    a.retries += b.retries;
    a.failures += b.failures;
    a.hedged += b.hedged;
    a.non_idempotent += b.non_idempotent;
    a.mismatches += b.mismatches;
    for (x, y) in a.claims.iter_mut().zip(b.claims) {
        *x += y;
    }
    for (x, y) in a.header.iter_mut().zip(b.header) {
        *x += y;
    }
    for (x, y) in a.links.iter_mut().zip(b.links) {
        *x += y;
    }
    for i in 0..4 {
        if let (Some(x), Some(y)) = (a.retry_n.get_mut(i), b.retry_n.get(i)) {
            *x += y;
        }
        if let (Some(x), Some(y)) = (a.retry_ok.get_mut(i), b.retry_ok.get(i)) {
            *x += y;
        }
    }
    a.gap_n += b.gap_n;
    a.gap_sum += b.gap_sum;
    a.gap_sq += b.gap_sq;
}

fn empty_stats(edge: Edge, secs: f64, fault: bool) -> EdgeStats {
    EdgeStats {
        edge,
        callee_addrs: Vec::new(),
        window_seconds: secs,
        request_rate: 0.0,
        requests: 0,
        first_attempts: 0,
        retries: 0,
        failures: 0,
        attempts_per_request: 1.0,
        retry_ratio: 0.0,
        failure_ratio: 0.0,
        recent_requests: 0,
        recent_failures: 0,
        retry_success: Vec::new(),
        callee_claims: ClaimCounts::default(),
        claim_sources: ClaimSources::default(),
        amplification: 1.0,
        baseline_rate: None,
        fault_active: fault,
        hedged_retries: 0,
        non_idempotent_retries: 0,
        no_jitter: false,
        timeout_mismatches: 0,
        timeout_mismatches_total: 0,
        requests_total: 0,
        retries_total: 0,
        dependency: DependencyKind::Unknown,
    }
}

fn finish_stats(b: EdgeBucket, mut s: EdgeStats) -> EdgeStats {
    s.requests = u64::from(b.requests);
    s.first_attempts = u64::from(b.first);
    s.retries = u64::from(b.retries);
    s.failures = u64::from(b.failures);
    s.request_rate = if s.window_seconds > 0.0 {
        s.requests as f64 / s.window_seconds
    } else {
        0.0
    };
    s.attempts_per_request = if b.first > 0 {
        s.requests as f64 / s.first_attempts as f64
    } else {
        1.0
    };
    s.retry_ratio = ratio(s.retries, s.requests);
    s.failure_ratio = ratio(s.failures, s.requests);
    s.retry_success = FAILURE_CLASSES
        .iter()
        .zip(b.retry_n.iter().zip(b.retry_ok.iter()))
        .filter(|(_, (n, _))| **n > 0)
        .map(|(c, (n, ok))| RetrySuccess {
            outcome_class: *c,
            retries: u64::from(*n),
            succeeded: u64::from(*ok),
            ratio: ratio(u64::from(*ok), u64::from(*n)),
        })
        .collect();
    s.callee_claims = counts(b.claims);
    let header = counts(b.header);
    s.claim_sources = ClaimSources {
        verdicts: ClaimCounts {
            claimed: s.callee_claims.claimed.saturating_sub(header.claimed),
            unclaimed: s.callee_claims.unclaimed.saturating_sub(header.unclaimed),
            missing: s.callee_claims.missing.saturating_sub(header.missing),
        },
        links: LinkCounts::from_array(b.links),
        header,
    };
    s.amplification = match s.baseline_rate {
        Some(base) if base > 0.0 => s.request_rate / base,
        _ => 1.0,
    };
    s.hedged_retries = u64::from(b.hedged);
    s.non_idempotent_retries = u64::from(b.non_idempotent);
    s.timeout_mismatches = u64::from(b.mismatches);
    if b.gap_n >= JITTER_MIN_SAMPLES && b.gap_sum > 0.0 {
        let n = f64::from(b.gap_n);
        let mean = b.gap_sum / n;
        let var = (b.gap_sq / n - mean * mean).max(0.0);
        s.no_jitter = var.sqrt() / mean < JITTER_MAX_CV;
    }
    s
}

/// Longest chain of edges with retries in the window. Memoised depth-first search; a node on
/// the current path is not re-entered, so cycles end the chain instead of looping.
fn storm(edges: &[EdgeStats]) -> (u32, Vec<ServiceId>) {
    let retrying: Vec<&Edge> = edges
        .iter()
        .filter(|e| e.retries > 0)
        .map(|e| &e.edge)
        .collect();
    fn longest(
        from: &ServiceId,
        edges: &[&Edge],
        stack: &mut Vec<ServiceId>,
        memo: &mut BTreeMap<ServiceId, Vec<ServiceId>>,
    ) -> Vec<ServiceId> {
        if let Some(m) = memo.get(from) {
            return m.clone();
        }
        let mut best: Vec<ServiceId> = Vec::new();
        if stack.len() <= 64 {
            stack.push(from.clone());
            let next: Vec<ServiceId> = edges
                .iter()
                .filter(|e| &e.caller == from && !stack.contains(&e.callee))
                .map(|e| e.callee.clone())
                .collect();
            for callee in next {
                let tail = longest(&callee, edges, stack, memo);
                if tail.len() + 1 > best.len() {
                    best = std::iter::once(callee).chain(tail).collect();
                }
            }
            stack.pop();
        }
        memo.insert(from.clone(), best.clone());
        best
    }
    let mut memo = BTreeMap::new();
    let mut best: Vec<ServiceId> = Vec::new();
    for e in &retrying {
        let tail = longest(&e.caller, &retrying, &mut Vec::new(), &mut memo);
        if tail.len() + 1 > best.len() {
            best = std::iter::once(e.caller.clone()).chain(tail).collect();
        }
    }
    ((best.len().saturating_sub(1)) as u32, best)
}
