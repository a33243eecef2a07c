//! retry-agent: kernel event → exchange → verdict → decision → actuator.
//!
//! Modules in data-flow order ([`LAYERS`]); each depends only on the ones before it, and the
//! unit suite fails when one imports a later one (`tests.rs`). The commands (`cmd`) sit above
//! every stage; the test kit (`testkit`) is compiled for tests and the `testkit` feature only.
pub mod settings;
pub mod capture;
pub mod identity;
pub mod l7;
pub mod correlate;
pub mod decide;
pub mod pipeline;
pub mod actuate;
pub mod recorder;
pub mod forensics;
pub mod metrics;
pub mod api;
pub mod cmd;

#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

/// The top-level modules in data-flow order: a module may import only those before it.
/// `testkit` is outside the order: it may use any stage, and only test code may use it.
pub const LAYERS: &[&str] = &[
    "settings",
    "capture",
    "identity",
    "l7",
    "correlate",
    "decide",
    "pipeline",
    "actuate",
    "recorder",
    "forensics",
    "metrics",
    "api",
    "cmd",
];

#[cfg(test)]
mod tests;
