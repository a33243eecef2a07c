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

/// Small deterministic RNG (xorshift64*): seeded, so a failure reproduces.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}
