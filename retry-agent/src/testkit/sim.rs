//! A deterministic call-graph simulator: synthetic exchanges with thread context, fed through
//! the real [`Engine`] and [`Decider`], with the decisions applied the way an actuator would.
//! Used by the unit tests (the design's numbers). No IO, no clock.
use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
};

use super::ExchangeBuilder;
use crate::{
    correlate::{CorrelateConfig, Engine, ServiceMatch, ServiceOverride, Verdict},
    decide::{Action, DecideConfig, Decider, Decision, Reason},
    l7::{Claim, Exchange, Failure},
};

/// One service in the simulated graph.
#[derive(Clone, Debug)]
pub struct Node {
    pub name: String,
    /// Called in order for every request.
    pub calls: Vec<usize>,
    /// Attempts per call (1 = no retries).
    pub attempts: u32,
    /// Probability this node fails a request on its own (deterministic generator).
    pub own_fault: f64,
    /// Calls whose failure the node survives (a cache).
    pub fail_open: Vec<usize>,
    /// Outbound calls run on a worker thread: the engine cannot link them to the request.
    pub context_break: bool,
    /// Its inbound exchanges are seen (false: a service the agent does not observe, e.g. on
    /// another node: its claims are missing).
    pub captured: bool,
}

impl Node {
    pub fn new(name: &str, calls: Vec<usize>, attempts: u32) -> Self {
        Node {
            name: name.into(),
            calls,
            attempts,
            own_fault: 0.0,
            fail_open: Vec::new(),
            context_break: false,
            captured: true,
        }
    }
}

/// How the simulated actuator applies a decision to an edge.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Limit {
    /// No retries.
    None,
    /// Retries up to this fraction of first attempts.
    Budget(f64),
}

#[derive(Default, Clone, Copy)]
struct EdgeUse {
    first: u64,
    retries: u64,
}

const US: u64 = 1_000;

/// The simulator: nodes, the engine, the decider, and the decisions in force.
pub struct Sim {
    pub nodes: Vec<Node>,
    pub engine: Engine,
    pub decider: Decider,
    /// Whether decisions are applied to the simulated clients.
    pub apply_decisions: bool,
    /// A client-side budget on every edge regardless of decisions (the design's plain budgets).
    pub client_budget: Option<f64>,
    limits: BTreeMap<(usize, usize), Limit>,
    usage: BTreeMap<(usize, usize), EdgeUse>,
    served: Vec<u64>,
    pub verdicts: Vec<Verdict>,
    pub decisions: Vec<Decision>,
    t: u64,
    next_id: u64,
    next_port: u16,
    rng: u64,
    fault: Vec<f64>,
    /// Root request number: distinct logical requests have distinct paths.
    req: u64,
}

fn pid_of(i: usize) -> u32 {
    1000 + i as u32
}

fn addr_of(i: usize) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(10, 0, (i / 250) as u8, (i % 250) as u8 + 1)),
        8080,
    )
}

impl Sim {
    /// `cfg`'s service names get one `pid:N=name` per node.
    pub fn new(nodes: Vec<Node>, mut cfg: CorrelateConfig, dcfg: DecideConfig) -> Self {
        for (i, n) in nodes.iter().enumerate() {
            cfg.service_names.push(ServiceOverride {
                matcher: ServiceMatch::Pid(pid_of(i)),
                name: n.name.clone(),
            });
        }
        let fault = vec![0.0; nodes.len()];
        Sim {
            served: vec![0; nodes.len()],
            nodes,
            engine: Engine::new(cfg),
            decider: Decider::new(dcfg),
            apply_decisions: false,
            client_budget: None,
            limits: BTreeMap::new(),
            usage: BTreeMap::new(),
            verdicts: Vec::new(),
            decisions: Vec::new(),
            t: 1_000_000_000,
            next_id: 1,
            next_port: 20_000,
            rng: 0x9e37_79b9_7f4a_7c15,
            fault,
            req: 0,
        }
    }

    /// A chain 0 → 1 → … → n-1, every hop making `attempts` attempts.
    pub fn chain(names: &[&str], attempts: u32, cfg: CorrelateConfig, dcfg: DecideConfig) -> Self {
        let nodes = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                Node::new(
                    n,
                    if i + 1 < names.len() {
                        vec![i + 1]
                    } else {
                        vec![]
                    },
                    attempts,
                )
            })
            .collect();
        Sim::new(nodes, cfg, dcfg)
    }

    /// Set a node's probability of failing on its own (e.g. 1.0: the fault).
    pub fn set_fault(&mut self, node: usize, p: f64) {
        if let Some(f) = self.fault.get_mut(node) {
            *f = p;
        }
    }

    pub fn now_ns(&self) -> u64 {
        self.t
    }

    fn rand(&mut self) -> f64 {
        // xorshift64*: deterministic, good enough for fault draws.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Run `seconds` of traffic at `rate` root requests per second into node 0, evaluating the
    /// decider every simulated second. Returns requests served per node in that time.
    pub fn run(&mut self, seconds: u64, rate: u64) -> Vec<u64> {
        self.served = vec![0; self.nodes.len()];
        self.usage.clear();
        let gap = 1_000_000_000 / rate.max(1);
        for s in 0..seconds {
            let second_start = self.t;
            for _ in 0..rate {
                let start = self.t;
                self.req += 1;
                let client =
                    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 168, 0, 1)), self.port());
                let (_, end) = self.serve(0, client, start);
                // Requests never overlap on a thread: the sim has one thread per service.
                self.t = (start + gap).max(end + US);
            }
            let _ = s;
            self.t = self.t.max(second_start + 1_000_000_000);
            let mut out = Vec::new();
            self.engine.tick(self.t, &mut out);
            self.verdicts.extend(out);
            let issued = self.decider.evaluate(&self.engine, self.t);
            self.decisions.extend(issued.iter().cloned());
            // Always tracked, enforced only while `apply_decisions` (so a run can show what
            // would have happened without them).
            self.apply(&issued);
        }
        self.served.clone()
    }

    fn apply(&mut self, issued: &[Decision]) {
        for d in issued {
            let (Some(a), Some(b)) = (
                self.index(d.edge.caller.as_str()),
                self.index(d.edge.callee.as_str()),
            ) else {
                continue;
            };
            match (d.action, d.reason) {
                (Action::Allow, _) => {
                    self.limits.remove(&(a, b));
                }
                (Action::SuppressRetries, Reason::CalleeUnclaimed) => {
                    self.limits.insert((a, b), Limit::None);
                }
                (Action::SuppressRetries, Reason::OverBudget | Reason::Amplification) => {
                    self.limits
                        .insert((a, b), Limit::Budget(self.decider.config().retry_budget));
                }
            }
        }
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    fn port(&mut self) -> u16 {
        self.next_port = if self.next_port >= 60_000 {
            20_000
        } else {
            self.next_port + 1
        };
        self.next_port
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn push(&mut self, ex: Exchange) {
        let mut out = Vec::new();
        self.engine.push(&ex, &mut out);
        self.verdicts.extend(out);
    }

    /// Node `i` serves one request from `from` starting at `t0`; returns (ok, end time).
    fn serve(&mut self, i: usize, from: SocketAddr, t0: u64) -> (bool, u64) {
        if let Some(s) = self.served.get_mut(i) {
            *s += 1;
        }
        let Some(node) = self.nodes.get(i).cloned() else {
            return (false, t0);
        };
        let pid = pid_of(i);
        let mut t = t0 + 10 * US;
        let mut ok = true;
        for &c in &node.calls {
            let (child_ok, end) = self.call(i, c, t, &node);
            t = end + 10 * US;
            if !child_ok && !node.fail_open.contains(&c) {
                ok = false;
            }
        }
        let fault = self
            .fault
            .get(i)
            .copied()
            .unwrap_or(0.0)
            .max(node.own_fault);
        if fault > 0.0 && self.rand() < fault {
            ok = false;
        }
        t += 10 * US;
        let id = self.id();
        let ex = ExchangeBuilder::server(id, pid, pid * 10, addr_of(i), from, t0, t)
            .status(if ok { 200 } else { 503 });
        if node.captured {
            self.push(ex.build());
        }
        (ok, t)
    }

    /// Node `i` calls node `c` with its retry policy and the limits in force.
    fn call(&mut self, i: usize, c: usize, t0: u64, node: &Node) -> (bool, u64) {
        let pid = pid_of(i);
        let tid = if node.context_break {
            pid * 10 + 1
        } else {
            pid * 10
        };
        let mut t = t0;
        for k in 1..=node.attempts.max(1) {
            let usage = self.usage.entry((i, c)).or_default();
            if k == 1 {
                usage.first += 1;
            } else {
                let limit = if self.apply_decisions {
                    self.limits.get(&(i, c)).copied()
                } else {
                    None
                };
                let budget = match (limit, self.client_budget) {
                    (Some(Limit::None), _) => break,
                    (Some(Limit::Budget(b)), Some(cb)) => Some(b.min(cb)),
                    (Some(Limit::Budget(b)), None) | (None, Some(b)) => Some(b),
                    (None, None) => None,
                };
                if let Some(b) = budget
                    && (usage.retries + 1) as f64 > b * usage.first as f64 + 1e-9
                {
                    break;
                }
                usage.retries += 1;
            }
            let local = SocketAddr::new(addr_of(i).ip(), self.port());
            let (ok, end) = self.serve(c, local, t + 5 * US);
            let end = end + 5 * US;
            let id = self.id();
            let path = format!("/r/{}", self.req);
            let ex = ExchangeBuilder::client(id, pid, tid, local, addr_of(c), t, end)
                .route(&path)
                .status(if ok { 200 } else { 503 });
            self.push(ex.build());
            // Fixed backoff before the next attempt.
            t = end + 100 * US;
            if ok {
                return (true, end);
            }
        }
        (false, t)
    }

    /// Mutable access to a node (set up faults, fail-open calls, context breaks).
    pub fn node(&mut self, i: usize) -> Option<&mut Node> {
        self.nodes.get_mut(i)
    }

    /// Verdicts the engine gave node `i`'s failed requests: (claimed, unclaimed, missing).
    pub fn claims_of(&self, name: &str) -> (usize, usize, usize) {
        let mut c = (0, 0, 0);
        for v in self.verdicts.iter().filter(|v| v.service.as_str() == name) {
            match v.claim {
                Claim::Claimed => c.0 += 1,
                Claim::Unclaimed => c.1 += 1,
                Claim::Missing => c.2 += 1,
            }
        }
        c
    }

    /// A failure that never got an HTTP response (for tests that need one).
    pub fn abandoned(b: ExchangeBuilder) -> Exchange {
        b.failure(Failure::Abandoned).build()
    }
}

#[cfg(test)]
mod tests;
