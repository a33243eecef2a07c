//! Uprobes, one module per family. A family is attached per file of its target (the `path` of
//! its `#[uprobe(path = ..., function = ...)]` attributes), which userspace resolves: `libssl`
//! is every OpenSSL shared library the node's processes map (capture/tls.rs). A new family (Go's
//! crypto/tls, say) is a module here with its own target name and a userspace attacher for it.
pub mod libssl;
