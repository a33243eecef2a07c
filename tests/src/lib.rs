//! Kernel and network integration tests: see tests/tests/. `fixture` is what every kernel test
//! shares (capture, ports, peer programs from tests/fixtures/, processes, namespaces).
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
pub mod actuate;
pub mod correlate;
pub mod fixture;
pub mod lab;
pub mod recorder;
