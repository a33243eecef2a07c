//! The correlation engine (skeleton: API first, logic follows).
use super::{
    config::CorrelateConfig,
    types::{EdgeStats, EngineStats, PathStats, ServiceClaim, Verdict},
};
use crate::{capture::ProcessInfo, l7::Exchange};

pub struct Engine {
    cfg: CorrelateConfig,
    stats: EngineStats,
}

impl Engine {
    pub fn new(cfg: CorrelateConfig) -> Self {
        Engine { cfg, stats: EngineStats::default() }
    }
    pub fn config(&self) -> &CorrelateConfig {
        &self.cfg
    }
    pub fn on_process(&mut self, _info: &ProcessInfo) {}
    pub fn on_process_exit(&mut self, _pid: u32) {}
    /// Feed one completed exchange; verdicts for failed inbound exchanges are appended to `out`
    /// (possibly later, once the context window closes, from `tick`).
    pub fn push(&mut self, _ex: &Exchange, _out: &mut Vec<Verdict>) {
        self.stats.exchanges += 1;
    }
    /// Advance capture time: judge inbound exchanges whose grace has passed.
    pub fn tick(&mut self, _now_ns: u64, _out: &mut Vec<Verdict>) {}
    /// Judge everything still pending (end of a replay, shutdown).
    pub fn flush(&mut self, _out: &mut Vec<Verdict>) {}
    pub fn edges(&self) -> Vec<EdgeStats> {
        Vec::new()
    }
    pub fn paths(&self) -> PathStats {
        PathStats::default()
    }
    pub fn service_claims(&self) -> Vec<ServiceClaim> {
        Vec::new()
    }
    pub fn stats(&self) -> EngineStats {
        self.stats
    }
    /// Latest capture time the engine has seen.
    pub fn now_ns(&self) -> u64 {
        0
    }
}
