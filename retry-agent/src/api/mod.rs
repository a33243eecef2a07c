//! api: see ARCHITECTURE.md.
