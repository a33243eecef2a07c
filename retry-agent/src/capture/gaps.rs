//! What the capture goes without when a program does not load: a named gap, not a dead agent.
//!
//! A DaemonSet meets every kernel of a fleet. On one of them the JIT may give up on one of the
//! data programs (they are at the size where 6.18's x86 JIT stops converging), a verifier may
//! be stricter, or the architecture may have no such syscall at all (arm64 has no `dup2`, `fork`
//! or `vfork`, so no tracepoint for them). Refusing to start for any of those left a node with
//! no capture at all, restarting forever. A program is either **required** — without it what is
//! captured would be wrong, not only partial: the connections' opening and closing, which every
//! record is keyed on — or it leaves a **gap**: the I/O of one syscall unseen, fds reused by
//! `dup2` or sockets inherited across `fork` not followed. A gap is logged, kept
//! ([`super::Capture::gaps`]) and exported (`retry_agent_capture_programs_missing`); a
//! required program that fails stops the load with the reason, as before.
use std::path::Path;

use super::{CaptureError, programs::ProgramSpec};

/// Why a program is not attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GapReason {
    /// The kernel has no such tracepoint: on this architecture the syscall does not exist, so
    /// nothing can make the call the program would have seen.
    NoTracepoint,
    /// The verifier refused it.
    Verifier,
    /// The verifier accepted it and the kernel's JIT failed to compile it.
    Jit,
    /// Anything else: found, loaded and not attached.
    Attach,
}

impl GapReason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            GapReason::NoTracepoint => "no_tracepoint",
            GapReason::Verifier => "verifier",
            GapReason::Jit => "jit",
            GapReason::Attach => "attach",
        }
    }
}

/// A program of the object the capture runs without.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gap {
    pub program: String,
    /// `category/name`.
    pub tracepoint: String,
    pub reason: GapReason,
    /// The error, as the load would have reported it (empty for a missing tracepoint).
    pub detail: String,
}

/// Programs without which records would be misattributed, not only missed: a connection is
/// known from its connect or accept to its close (or its socket's end, or its process's), and
/// every record is keyed on it. Named by program, the object's own names (the object test
/// holds each one there, on its tracepoint), not by tracepoint: a kernel that lacks one of
/// these tracepoints cannot run the capture. `accept` is not among them: an architecture
/// without that syscall has libc call `accept4`.
pub(super) const REQUIRED: &[(&str, &str)] = &[
    ("ra_enter_connect", "syscalls/sys_enter_connect"),
    ("ra_exit_connect", "syscalls/sys_exit_connect"),
    ("ra_enter_accept4", "syscalls/sys_enter_accept4"),
    ("ra_exit_accept4", "syscalls/sys_exit_accept4"),
    ("ra_enter_close", "syscalls/sys_enter_close"),
    ("ra_sock_state", "sock/inet_sock_set_state"),
    ("ra_process_exit", "sched/sched_process_exit"),
];

/// Whether the capture cannot run without `spec`.
pub(super) fn required(spec: &ProgramSpec) -> bool {
    REQUIRED.iter().any(|(program, _)| *program == spec.name)
}

/// Whether `events` (a tracefs `events` directory) has the tracepoint; true when there is no
/// tracefs to ask, so that attaching says what is wrong.
pub(super) fn has_tracepoint(events: Option<&Path>, category: &str, name: &str) -> bool {
    events.is_none_or(|e| e.join(category).join(name).is_dir())
}

/// What a tracepoint program's failed load or attach means: a gap the capture runs with, or
/// (required programs) the load's error.
pub(super) fn settle(
    spec: &ProgramSpec,
    tracepoint: String,
    outcome: Result<(), CaptureError>,
) -> Result<Option<Gap>, CaptureError> {
    let Err(e) = outcome else { return Ok(None) };
    if required(spec) {
        return Err(e);
    }
    let reason = match &e {
        CaptureError::Verifier { .. } => GapReason::Verifier,
        CaptureError::Jit { .. } => GapReason::Jit,
        _ => GapReason::Attach,
    };
    Ok(Some(Gap {
        program: spec.name.clone(),
        tracepoint,
        reason,
        detail: crate::settings::error_chain(&e),
    }))
}

/// The gap of a tracepoint the kernel does not have; `Err` when the capture needs it (a kernel
/// without syscall tracepoints at all ends here, at the first required one).
pub(super) fn absent(spec: &ProgramSpec, tracepoint: String) -> Result<Gap, CaptureError> {
    if required(spec) {
        return Err(CaptureError::NoTracepoint {
            program: spec.name.clone(),
            tracepoint,
        });
    }
    Ok(Gap {
        program: spec.name.clone(),
        tracepoint,
        reason: GapReason::NoTracepoint,
        detail: String::new(),
    })
}

#[cfg(test)]
mod tests;
