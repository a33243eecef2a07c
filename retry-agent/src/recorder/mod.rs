//! recorder: see ARCHITECTURE.md.
