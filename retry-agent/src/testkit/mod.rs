//! Test kit: hand-made exchanges ([`ExchangeBuilder`]), the deterministic call-graph simulator
//! ([`sim`]), a synthetic wire-faithful storm ([`synth`]) and small shared helpers. Compiled for
//! the unit tests and with the `testkit` feature (integration tests, benchmarks), never into the
//! release binary; only test code uses it.
pub mod decision;
pub mod exchange;
pub mod sim;
pub mod synth;

pub use decision::decision;
pub use exchange::{ExchangeBuilder, class_of_status};
pub use sim::{Node, Sim};
pub use synth::StormScenario;

/// A fresh path under the system temp directory, unique per process and call (removed if it
/// exists; not created).
pub fn temp_dir(tag: &str) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "ra-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}
