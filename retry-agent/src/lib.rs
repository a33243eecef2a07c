//! retry-agent: kernel event → chunk → exchange → verdict → decision → actuator.
//!
//! Modules in data-flow order; each depends only on the ones before it.
pub mod settings;
pub mod capture;
pub mod l7;
pub mod correlate;
pub mod decide;
pub mod pipeline;
pub mod actuate;
pub mod recorder;
pub mod metrics;
pub mod api;
pub mod app;
pub mod cli;
