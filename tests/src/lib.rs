//! Kernel and network integration tests: see tests/tests/. `fixture` is what every kernel test
//! shares (capture, ports, peer programs from tests/fixtures/, processes, namespaces).
pub mod fixture;
pub mod actuate;
pub mod lab;
pub mod correlate;
pub mod recorder;
