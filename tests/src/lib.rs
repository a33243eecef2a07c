//! Kernel and network integration tests: see tests/tests/. `fixture` is what every kernel test
//! shares (capture, ports, peer programs from tests/fixtures/, processes, namespaces).
pub mod actuate;
pub mod correlate;
pub mod fixture;
pub mod lab;
pub mod recorder;
