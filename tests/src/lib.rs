//! Kernel and network integration tests: see tests/tests/.
