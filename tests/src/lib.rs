//! Kernel and network integration tests: see tests/tests/. `fixture` is what every kernel test
//! shares (capture, ports, peer programs from tests/fixtures/, processes, namespaces);
//! `altered` the embedded eBPF object changed the ways a kernel can refuse part of it.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
pub mod actuate;
pub mod altered;
pub mod correlate;
pub mod fixture;
pub mod lab;
pub mod recorder;
