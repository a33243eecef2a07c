//! metrics: see ARCHITECTURE.md.
