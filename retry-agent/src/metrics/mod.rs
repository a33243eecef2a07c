//! Prometheus metrics (prometheus-client): `retry_agent_` prefix, base units, `_total` only on
//! counters, bounded labels with an "other" overflow. Observers take plain numbers and the
//! stages' figures; no stage depends on this module.
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::{
    correlate::{Edge, EdgeStats, EngineStats, PathStats, ServiceId},
    decide::Decision,
    l7::OutcomeClass,
};

#[cfg(test)]
mod tests;

/// Edges that get their own label values; the rest are summed into `caller="other",callee="other"`.
pub const DEFAULT_MAX_EDGE_LABELS: usize = 64;
/// Depths that get their own label value (deeper ones are folded into the last).
const MAX_DEPTH_LABELS: u32 = 16;
pub const OTHER: &str = "other";

/// One edge: the services as the API names them, and their Kubernetes namespaces (empty for a
/// service that is not a workload) so dashboards can sum by namespace. Bounded: at most
/// `max_edge_labels` edges, the rest summed into caller = callee = `other`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EdgeLabels {
    caller: String,
    caller_namespace: String,
    callee: String,
    callee_namespace: String,
}

impl EdgeLabels {
    fn of(e: &Edge) -> Self {
        let ns = |s: &ServiceId| s.namespace().unwrap_or_default().to_string();
        EdgeLabels {
            caller: e.caller.to_string(),
            caller_namespace: ns(&e.caller),
            callee: e.callee.to_string(),
            callee_namespace: ns(&e.callee),
        }
    }

    fn other() -> Self {
        EdgeLabels {
            caller: OTHER.to_string(),
            caller_namespace: String::new(),
            callee: OTHER.to_string(),
            callee_namespace: String::new(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    outcome_class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClaimLabels {
    claim: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BindingLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LinkLabels {
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    action: &'static str,
    reason: &'static str,
    /// What the decision rests on (`decide::Basis`, or `none` for one without evidence).
    basis: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// A program of the eBPF object: bounded by the object (a few dozen), not by what is observed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GapLabels {
    program: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MapLabels {
    map: &'static str,
}

/// One actuator's outcomes: `ok`, `failed`, or `dropped` (superseded or over the pending bound
/// while it was busy). Bounded: the actuator kinds configured.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActuatorLabels {
    actuator: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DepthLabels {
    depth: String,
}

type GaugeF = Gauge<f64, AtomicU64>;

/// Holder of the registry and every metric. Shared by reference (`Arc`): all methods take `&self`.
pub struct Metrics {
    registry: Registry,
    max_edge_labels: usize,
    retry_ratio: Family<EdgeLabels, GaugeF>,
    amplification: Family<EdgeLabels, GaugeF>,
    request_rate: Family<EdgeLabels, GaugeF>,
    retry_success_ratio: Family<ClassLabels, GaugeF>,
    depth_amplification: Family<DepthLabels, GaugeF>,
    storm_radius: Gauge,
    verdicts: Family<ClaimLabels, Counter>,
    retries: Counter,
    hedged_retries: Counter,
    non_idempotent_retries: Counter,
    timeout_mismatches: Counter,
    correlate_evictions: Counter,
    links: Family<LinkLabels, Counter>,
    unlinked: Family<ReasonLabels, Counter>,
    tls_libraries: Gauge,
    go_programs: Gauge,
    go_programs_failed: Gauge,
    go_grpc_programs: Gauge,
    go_grpc_programs_unlinked: Gauge,
    go_uprobes: Gauge,
    uprobe_cost: GaugeF,
    decisions: Family<DecisionLabels, Counter>,
    suppressed_edges: Gauge,
    identity_failures: Family<ReasonLabels, Counter>,
    capture_events: Counter,
    capture_drops: Counter,
    capture_arg_insert_failures: Family<MapLabels, Counter>,
    capture_programs_missing: Family<GapLabels, Gauge>,
    actuator_operations: Family<ActuatorLabels, Counter>,
    recorder_evictions: Counter,
    recorder_bytes: Gauge,
    recorder_held_bytes: Gauge,
    recorder_history: GaugeF,
    l7_exchanges: Counter,
    l7_summarised_exchanges: Counter,
    l7_counted_exchanges: Counter,
    l7_evictions: Counter,
    l7_stream_bindings: Family<BindingLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self::with_max_edge_labels(DEFAULT_MAX_EDGE_LABELS)
    }

    pub fn with_max_edge_labels(max_edge_labels: usize) -> Self {
        let mut registry = Registry::with_prefix("retry_agent");
        let m = Metrics {
            max_edge_labels: max_edge_labels.max(1),
            retry_ratio: Family::default(),
            amplification: Family::default(),
            request_rate: Family::default(),
            retry_success_ratio: Family::default(),
            depth_amplification: Family::default(),
            storm_radius: Gauge::default(),
            verdicts: Family::default(),
            retries: Counter::default(),
            hedged_retries: Counter::default(),
            non_idempotent_retries: Counter::default(),
            timeout_mismatches: Counter::default(),
            correlate_evictions: Counter::default(),
            links: Family::default(),
            unlinked: Family::default(),
            tls_libraries: Gauge::default(),
            go_programs: Gauge::default(),
            go_programs_failed: Gauge::default(),
            go_grpc_programs: Gauge::default(),
            go_grpc_programs_unlinked: Gauge::default(),
            go_uprobes: Gauge::default(),
            uprobe_cost: GaugeF::default(),
            decisions: Family::default(),
            identity_failures: Family::default(),
            suppressed_edges: Gauge::default(),
            capture_events: Counter::default(),
            capture_drops: Counter::default(),
            capture_arg_insert_failures: Family::default(),
            capture_programs_missing: Family::default(),
            actuator_operations: Family::default(),
            recorder_evictions: Counter::default(),
            recorder_bytes: Gauge::default(),
            recorder_held_bytes: Gauge::default(),
            recorder_history: GaugeF::default(),
            l7_exchanges: Counter::default(),
            l7_summarised_exchanges: Counter::default(),
            l7_counted_exchanges: Counter::default(),
            l7_evictions: Counter::default(),
            l7_stream_bindings: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "retry_ratio",
            "Retries / requests per edge over the sliding window",
            m.retry_ratio.clone(),
        );
        registry.register(
            "amplification_factor",
            "Request rate on an edge over its baseline (frozen while a fault is active)",
            m.amplification.clone(),
        );
        registry.register_with_unit(
            "edge_requests",
            "Requests (all attempts) per second on an edge over the sliding window",
            prometheus_client::registry::Unit::Other("per_second".into()),
            m.request_rate.clone(),
        );
        registry.register(
            "retry_success_ratio",
            "Retries that succeeded / retries, by the class of the failure retried (window)",
            m.retry_success_ratio.clone(),
        );
        registry.register(
            "depth_amplification_factor",
            "Arrival rate over baseline at the services at each depth of the node's call graph",
            m.depth_amplification.clone(),
        );
        registry.register(
            "storm_radius",
            "Longest chain of edges retrying during a fault",
            m.storm_radius.clone(),
        );
        registry.register(
            "verdicts",
            "Ownership verdicts for failed inbound exchanges",
            m.verdicts.clone(),
        );
        registry.register(
            "retries",
            "Retry attempts detected on outbound exchanges",
            m.retries.clone(),
        );
        registry.register(
            "hedged_retries",
            "Retries started while the previous attempt was in flight",
            m.hedged_retries.clone(),
        );
        registry.register(
            "non_idempotent_retries",
            "Retries of non-idempotent requests without an idempotency key",
            m.non_idempotent_retries.clone(),
        );
        registry.register(
            "timeout_mismatch",
            "Exchanges the caller abandoned while the callee was still working on them",
            m.timeout_mismatches.clone(),
        );
        registry.register(
            "correlate_evictions",
            "Contexts or pending verdicts dropped by the correlation engine's bounds",
            m.correlate_evictions.clone(),
        );
        registry.register(
            "correlate_links",
            "Failed inbound requests thread context could not link, linked another way (timing: the call just before the response; sole_inbound: the only request the process served)",
            m.links.clone(),
        );
        registry.register(
            "correlate_unlinked",
            "Failed inbound requests judged missing because no link placed their calls, by why the trace link could not (no_trace, trace_shared, untraced_call, wait_expired, history_lost)",
            m.unlinked.clone(),
        );
        registry.register(
            "tls_libraries",
            "libssl files instrumented for TLS plaintext",
            m.tls_libraries.clone(),
        );
        registry.register(
            "go_programs",
            "Go executables instrumented for request context",
            m.go_programs.clone(),
        );
        registry.register(
            "go_programs_failed",
            "Go executables that could not be instrumented (their calls are linked from syscalls only)",
            m.go_programs_failed.clone(),
        );
        registry.register(
            "go_grpc_programs",
            "gRPC-go executables whose streams the Go probes bind to their requests",
            m.go_grpc_programs.clone(),
        );
        registry.register(
            "go_grpc_programs_unlinked",
            "gRPC-go executables without stream probes (no DWARF and an unknown release, or fields missing): their streams are linked from syscalls only",
            m.go_grpc_programs_unlinked.clone(),
        );
        registry.register(
            "go_uprobes",
            "Whether the Go uprobes are attached (1) or not (0): --capture-go, and with auto the measured uprobe cost",
            m.go_uprobes.clone(),
        );
        registry.register_with_unit(
            "uprobe_cost",
            "What one uprobe hit cost on this node, measured at start (0: not measured)",
            prometheus_client::registry::Unit::Seconds,
            m.uprobe_cost.clone(),
        );
        registry.register(
            "decisions",
            "Decisions issued (suppressions, renewals, lifts)",
            m.decisions.clone(),
        );
        registry.register(
            "suppressed_edges",
            "Edges with retries suppressed now",
            m.suppressed_edges.clone(),
        );
        registry.register(
            "identity_failures",
            "Processes or containers left unnamed (named comm:port), by reason",
            m.identity_failures.clone(),
        );
        registry.register(
            "capture_events",
            "Kernel events decoded",
            m.capture_events.clone(),
        );
        registry.register(
            "capture_drops",
            "Kernel events lost (ring buffer full or channel full)",
            m.capture_drops.clone(),
        );
        registry.register(
            "capture_arg_insert_failures",
            "Traced syscalls lost because the kernel's per-thread argument map was full, by map",
            m.capture_arg_insert_failures.clone(),
        );
        registry.register(
            "capture_programs_missing",
            "Programs of the eBPF object the capture runs without (1), by program and reason: no_tracepoint (the kernel has no such syscall: nothing is missed), verifier, jit or attach (what the program would see goes unseen)",
            m.capture_programs_missing.clone(),
        );
        registry.register(
            "actuator_operations",
            "Decisions and claim sets handed to each actuator, by outcome (dropped: superseded while it was busy, or over its pending bound)",
            m.actuator_operations.clone(),
        );
        registry.register(
            "recorder_evictions",
            "Records the flight recorder's ring let go, by age or by its memory bound",
            m.recorder_evictions.clone(),
        );
        registry.register_with_unit(
            "recorder",
            "What the flight recorder's ring holds, as charged against its memory bound",
            prometheus_client::registry::Unit::Bytes,
            m.recorder_bytes.clone(),
        );
        registry.register_with_unit(
            "recorder_held",
            "What dumps being written (or a storm's held onset) still hold of what the ring let go, counted against the same memory bound",
            prometheus_client::registry::Unit::Bytes,
            m.recorder_held_bytes.clone(),
        );
        registry.register_with_unit(
            "recorder_history",
            "How far back the flight recorder's ring reaches: its newest record's time less its oldest's",
            prometheus_client::registry::Unit::Seconds,
            m.recorder_history.clone(),
        );
        registry.register(
            "l7_exchanges",
            "HTTP exchanges reassembled",
            m.l7_exchanges.clone(),
        );
        registry.register(
            "l7_summarised_exchanges",
            "Of the exchanges, those made from a kernel summary (--capture-summarize): a quiet exchange's request line, status and times, no headers",
            m.l7_summarised_exchanges.clone(),
        );
        registry.register(
            "l7_counted_exchanges",
            "Quiet exchanges the kernel counted and did not send (--capture-summary-every): in the edge and service figures through their summaries' weights, not in l7_exchanges",
            m.l7_counted_exchanges.clone(),
        );
        registry.register(
            "l7_evictions",
            "State dropped by l7's bounds: connections (table full, idle timeout), requests or streams (in-flight cap); not closes",
            m.l7_evictions.clone(),
        );
        registry.register(
            "l7_stream_bindings",
            "HTTP/2 streams the Go probes bound to a request context (gRPC-go), by result (unmatched: the connection was not tracked or not HTTP/2)",
            m.l7_stream_bindings.clone(),
        );
        Metrics { registry, ..m }
    }

    /// OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut s = String::new();
        // Writing into a String cannot fail; an error here would be an encoder bug: serve what we have.
        if encode(&mut s, &self.registry).is_err() {
            tracing::warn!("metrics encoding failed");
        }
        s
    }

    /// Per-edge gauges from the engine's edge figures (replaces the previous set).
    pub fn observe_edges(&self, edges: &[EdgeStats]) {
        self.retry_ratio.clear();
        self.amplification.clear();
        self.request_rate.clear();
        let mut sorted: Vec<&EdgeStats> = edges.iter().collect();
        // Busiest edges keep their own label; stable order so labels do not hop between scrapes.
        sorted.sort_by(|a, b| {
            b.requests
                .cmp(&a.requests)
                .then_with(|| a.edge.cmp(&b.edge))
        });
        let (named, rest) = sorted.split_at(sorted.len().min(self.max_edge_labels));
        for e in named {
            let l = EdgeLabels::of(&e.edge);
            self.retry_ratio.get_or_create(&l).set(e.retry_ratio);
            self.amplification.get_or_create(&l).set(e.amplification);
            self.request_rate.get_or_create(&l).set(e.request_rate);
        }
        if !rest.is_empty() {
            let l = EdgeLabels::other();
            let requests: u64 = rest.iter().map(|e| e.requests).sum();
            let retries: u64 = rest.iter().map(|e| e.retries).sum();
            let rate: f64 = rest.iter().map(|e| e.request_rate).sum();
            let base: f64 = rest.iter().filter_map(|e| e.baseline_rate).sum();
            self.retry_ratio
                .get_or_create(&l)
                .set(ratio(retries, requests));
            self.amplification
                .get_or_create(&l)
                .set(if base > 0.0 { rate / base } else { 1.0 });
            self.request_rate.get_or_create(&l).set(rate);
        }
        for class in OutcomeClass::ALL.into_iter().filter(|c| c.is_failure()) {
            let (n, ok) = edges
                .iter()
                .flat_map(|e| e.retry_success.iter())
                .filter(|r| r.outcome_class == class)
                .fold((0, 0), |(n, ok), r| (n + r.retries, ok + r.succeeded));
            self.retry_success_ratio
                .get_or_create(&ClassLabels {
                    outcome_class: class.as_str(),
                })
                .set(ratio(ok, n));
        }
    }

    pub fn observe_paths(&self, paths: &PathStats) {
        self.depth_amplification.clear();
        for d in &paths.depths {
            let depth = d.depth.min(MAX_DEPTH_LABELS);
            let label = if d.depth >= MAX_DEPTH_LABELS {
                format!("{depth}+")
            } else {
                depth.to_string()
            };
            self.depth_amplification
                .get_or_create(&DepthLabels { depth: label })
                .set(d.amplification);
        }
        self.storm_radius.set(i64::from(paths.storm_radius));
    }

    /// Engine totals since start (monotonic): counters follow them.
    pub fn observe_engine(&self, s: &EngineStats) {
        for claim in [
            crate::l7::Claim::Claimed,
            crate::l7::Claim::Unclaimed,
            crate::l7::Claim::Missing,
        ] {
            set_counter(
                &self.verdicts.get_or_create(&ClaimLabels {
                    claim: claim.as_str(),
                }),
                s.verdicts.get(claim),
            );
        }
        set_counter(&self.retries, s.retries);
        set_counter(&self.hedged_retries, s.hedged_retries);
        set_counter(&self.non_idempotent_retries, s.non_idempotent_retries);
        set_counter(&self.timeout_mismatches, s.timeout_mismatches);
        set_counter(&self.correlate_evictions, s.evictions);
        set_counter(
            &self.links.get_or_create(&LinkLabels { method: "timing" }),
            s.timing_links,
        );
        set_counter(
            &self.links.get_or_create(&LinkLabels {
                method: "sole_inbound",
            }),
            s.sole_links,
        );
        set_counter(
            &self.links.get_or_create(&LinkLabels {
                method: "trace_header",
            }),
            s.trace_links,
        );
        for (why, n) in crate::correlate::Unlinked::ALL.iter().zip(s.unlinked) {
            set_counter(
                &self.unlinked.get_or_create(&ReasonLabels {
                    reason: why.as_str(),
                }),
                n,
            );
        }
    }

    /// Decisions as they are issued, and the number in force.
    pub fn observe_decisions(&self, issued: &[Decision], active: usize) {
        for d in issued {
            self.decisions
                .get_or_create(&DecisionLabels {
                    action: d.action.as_str(),
                    reason: d.reason.as_str(),
                    basis: d.evidence.as_ref().map_or("none", |e| e.basis.as_str()),
                })
                .inc();
        }
        self.suppressed_edges
            .set(i64::try_from(active).unwrap_or(i64::MAX));
    }

    /// What identity could not name, as its totals by reason.
    pub fn observe_identity(&self, failures: &[(crate::identity::FailureReason, u64)]) {
        for (r, n) in failures {
            set_counter(
                &self
                    .identity_failures
                    .get_or_create(&ReasonLabels { reason: r.as_str() }),
                *n,
            );
        }
    }

    /// libssl files instrumented so far.
    pub fn observe_tls(&self, libraries: usize) {
        self.tls_libraries
            .set(i64::try_from(libraries).unwrap_or(i64::MAX));
    }

    /// Go executables instrumented so far, and those that could not be.
    /// Whether the Go uprobes are on, and what a uprobe hit costs here (when measured).
    pub fn observe_uprobes(&self, go_on: bool, cost: Option<std::time::Duration>) {
        self.go_uprobes.set(i64::from(go_on));
        self.uprobe_cost.set(cost.map_or(0.0, |c| c.as_secs_f64()));
    }

    pub fn observe_go(&self, (instrumented, failed): (usize, usize), grpc: (usize, usize)) {
        let set = |g: &Gauge, n: usize| g.set(i64::try_from(n).unwrap_or(i64::MAX));
        set(&self.go_programs, instrumented);
        set(&self.go_programs_failed, failed);
        set(&self.go_grpc_programs, grpc.0);
        set(&self.go_grpc_programs_unlinked, grpc.1);
    }

    /// The programs the capture runs without (once, at load).
    pub fn observe_gaps(&self, gaps: &[crate::capture::Gap]) {
        for g in gaps {
            self.capture_programs_missing
                .get_or_create(&GapLabels {
                    program: g.program.clone(),
                    reason: g.reason.as_str(),
                })
                .set(1);
        }
    }

    /// Capture totals since start (events decoded, events lost).
    pub fn observe_capture(&self, events: u64, drops: u64) {
        set_counter(&self.capture_events, events);
        set_counter(&self.capture_drops, drops);
    }

    /// Each actuator's outcome totals (the dispatcher's counters).
    pub fn observe_actuators(&self, stats: &[crate::actuate::ActuatorStats]) {
        for a in stats {
            for (outcome, n) in [("ok", a.ok), ("failed", a.failed), ("dropped", a.dropped)] {
                set_counter(
                    &self.actuator_operations.get_or_create(&ActuatorLabels {
                        actuator: a.name,
                        outcome,
                    }),
                    n,
                );
            }
        }
    }

    /// Failed inserts into the kernel's per-thread argument maps, by `retry_common::arg_map` slot.
    pub fn observe_arg_insert_failures(&self, by_slot: &[u64]) {
        for (map, n) in retry_common::arg_map::LABELS.iter().zip(by_slot) {
            set_counter(
                &self
                    .capture_arg_insert_failures
                    .get_or_create(&MapLabels { map }),
                *n,
            );
        }
    }

    /// The recorder's ring: what it evicted since start (by age and by size), what it holds.
    pub fn observe_recorder(&self, s: &crate::recorder::RecorderStats) {
        set_counter(
            &self.recorder_evictions,
            s.evicted_age_total + s.evicted_size_total,
        );
        self.recorder_bytes
            .set(i64::try_from(s.bytes_in_ring).unwrap_or(i64::MAX));
        self.recorder_held_bytes
            .set(i64::try_from(s.bytes_held_by_dumps).unwrap_or(i64::MAX));
        let history = if s.records_in_ring == 0 {
            0
        } else {
            s.newest_ns.saturating_sub(s.oldest_ns)
        };
        self.recorder_history.set(history as f64 / 1e9);
    }

    /// l7 totals since start (exchanges emitted, connections/streams evicted).
    pub fn observe_l7(&self, l: &crate::l7::L7Stats) {
        set_counter(&self.l7_exchanges, l.exchanges);
        set_counter(&self.l7_summarised_exchanges, l.summarised_exchanges);
        set_counter(&self.l7_counted_exchanges, l.counted_exchanges);
        set_counter(&self.l7_evictions, l.evictions());
        for (result, n) in [
            ("bound", l.stream_bindings),
            ("unmatched", l.stream_bindings_unmatched),
        ] {
            set_counter(
                &self
                    .l7_stream_bindings
                    .get_or_create(&BindingLabels { result }),
                n,
            );
        }
    }
}

/// Counters mirror a monotonic total kept elsewhere; never move backwards (a restarted source
/// would otherwise look like a counter reset).
fn set_counter(c: &Counter, total: u64) {
    c.inner().fetch_max(total, Ordering::Relaxed);
}

fn ratio(n: u64, d: u64) -> f64 {
    if d == 0 { 0.0 } else { n as f64 / d as f64 }
}
