//! Uprobes, one module per family. A family is attached per file of its target (the `path` of
//! its `#[uprobe(path = ..., function = ...)]` attributes), which userspace resolves: `libssl`
//! is every OpenSSL shared library the node's processes map (capture/tls.rs); `go` (entries) and
//! `go-ret` (each RET instruction of the function: uretprobes are unsafe on Go) are every Go
//! executable the node runs (capture/golang); `calibrate` is one function of the agent itself,
//! timed at start (capture/calibrate.rs). A new family is a module here with its own target
//! name and a userspace attacher for it.
pub mod calibrate;
pub mod go;
pub mod libssl;
