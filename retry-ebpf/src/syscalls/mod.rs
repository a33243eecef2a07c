//! Syscall tracepoints (`syscalls:sys_enter_*`/`sys_exit_*`), by concern.
mod conn;
mod fd;
pub mod fork;
mod io;
