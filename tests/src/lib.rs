//! Kernel and network integration tests: see tests/tests/.
pub mod capture;
pub mod actuate;
pub mod lab;
pub mod correlate;
pub mod recorder;
