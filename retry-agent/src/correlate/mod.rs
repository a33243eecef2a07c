//! Stage 3: thread-context association, ownership verdicts, retry detection, amplification.
//! Pure logic: no IO. Input exchanges, output verdicts and edge figures.
pub mod config;
mod engine;
mod table;
pub mod types;

pub use config::{ConfigError, CorrelateConfig, ServiceMatch, ServiceOverride};
pub use engine::Engine;
pub use types::{
    ChildFailure, ClaimCounts, ClaimSources, DependencyKind, DepthStats, Edge, EdgeStats,
    EngineStats, Link, LinkCounts, PathStats, RetrySuccess, ServiceClaim, ServiceId, Unlinked,
    Verdict,
};
