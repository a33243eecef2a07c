//! Stage 3: thread-context association, ownership verdicts, retry detection, amplification.
//! Pure logic: no IO. Input exchanges, output verdicts and edge figures.
pub mod types;

pub use types::{ChildFailure, Edge, ServiceId, Verdict};
