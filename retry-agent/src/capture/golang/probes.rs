//! Attaching the Go uprobes (retry-ebpf's go.rs) to every Go executable the node runs.
//!
//! Uprobes attach to files: each distinct executable (by device and inode; a container image's
//! copy is a file of its own, reached through `/proc/<pid>/exe`) is inspected once. Programs
//! that are not Go, are too old, or do not use net/http are left alone; a Go program that
//! cannot be instrumented is logged and counted, and keeps the syscall-level linking (never
//! fatal).
use std::{
    collections::HashSet,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf,
    programs::{ProgramError, UProbe, uprobe::UProbeScope},
};

use super::{GoBinary, GoError};

/// Where each program goes: (program, function, at its returns rather than its entry).
pub const PROBES: &[(&str, &str, bool)] = &[
    ("ra_go_serve", "net/http.serverHandler.ServeHTTP", false),
    ("ra_go_round_trip", "net/http.(*persistConn).roundTrip", false),
    ("ra_go_request_write", "net/http.(*Request).write", false),
    ("ra_go_newproc", "runtime.newproc1", false),
    ("ra_go_newproc_ret", "runtime.newproc1", true),
    ("ra_go_exit", "runtime.goexit1", false),
];

fn wanted() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = PROBES.iter().map(|(_, f, _)| *f).collect();
    v.dedup();
    v
}

/// What became of one executable.
#[derive(Debug)]
pub enum Outcome {
    Instrumented(GoBinary),
    /// Not a Go program, or one without an HTTP server or client: nothing to do.
    NotApplicable,
    Failed(GoError),
}

/// The Go probes of one capture.
#[derive(Debug, Default)]
pub struct GoProbes {
    loaded: Option<bool>,
    /// Executables handled (dev, inode), whatever the outcome.
    files: HashSet<(u64, u64)>,
    /// Processes already looked at.
    pids: HashSet<u32>,
    pub instrumented: usize,
    pub failed: usize,
}

impl GoProbes {
    /// Instruments the executables of processes not seen before; returns how many were added.
    /// Blocking /proc and file reads: call it off the hot path.
    pub fn scan(&mut self, ebpf: &mut Ebpf, proc_root: &Path, skip_pid: u32) -> usize {
        let Ok(dir) = std::fs::read_dir(proc_root) else { return 0 };
        let mut live = HashSet::new();
        let mut added = 0;
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            live.insert(pid);
            if pid == skip_pid || !self.pids.insert(pid) {
                continue;
            }
            let exe = proc_root.join(pid.to_string()).join("exe");
            if let Some(true) = self.instrument_file(ebpf, &exe) {
                added += 1;
            }
        }
        // Forget pids that are gone, so a reused pid is looked at again.
        self.pids.retain(|p| live.contains(p));
        added
    }

    /// Instruments one executable unless already handled; Some(true) when probes were added.
    pub fn instrument_file(&mut self, ebpf: &mut Ebpf, exe: &Path) -> Option<bool> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(exe).ok()?;
        if !self.files.insert((meta.dev(), meta.ino())) {
            return None;
        }
        match self.try_instrument(ebpf, exe) {
            Outcome::Instrumented(bin) => {
                tracing::info!(exe = %exe.display(), go = %bin, "Go request context from uprobes");
                self.instrumented += 1;
                Some(true)
            }
            Outcome::NotApplicable => Some(false),
            Outcome::Failed(e) => {
                tracing::warn!(exe = %exe.display(), error = %e, "cannot instrument this Go program: its calls are linked from syscalls only");
                self.failed += 1;
                Some(false)
            }
        }
    }

    fn try_instrument(&mut self, ebpf: &mut Ebpf, exe: &Path) -> Outcome {
        let bin = match GoBinary::inspect(exe, &wanted()) {
            Ok(b) => b,
            Err(GoError::NotGo | GoError::Elf(_)) => return Outcome::NotApplicable,
            Err(e) => return Outcome::Failed(e),
        };
        if !bin.has("net/http.serverHandler.ServeHTTP") && !bin.has("net/http.(*persistConn).roundTrip") {
            return Outcome::NotApplicable;
        }
        if !self.load(ebpf) {
            return Outcome::Failed(GoError::Pclntab("the Go probes do not load on this kernel"));
        }
        match attach(ebpf, exe, &bin) {
            Ok(()) => Outcome::Instrumented(bin),
            Err(e) => Outcome::Failed(e),
        }
    }

    fn load(&mut self, ebpf: &mut Ebpf) -> bool {
        *self.loaded.get_or_insert_with(|| {
            for (prog, _, _) in PROBES {
                // ra_go_newproc_ret is listed once per use; loading twice is an error to skip.
                match program(ebpf, prog).and_then(|p| p.load()) {
                    Ok(()) | Err(ProgramError::AlreadyLoaded) => {}
                    Err(e) => {
                        tracing::warn!(program = prog, error = %e, "Go probe does not load: Go calls are linked from syscalls only");
                        return false;
                    }
                }
            }
            true
        })
    }
}

/// Offsets first (a program lacking a function is refused before anything attaches), then
/// every probe; on any failure the ones attached are detached again.
fn attach(ebpf: &mut Ebpf, exe: &Path, bin: &GoBinary) -> Result<(), GoError> {
    let mut plan: Vec<(&str, Vec<u64>)> = Vec::new();
    for (prog, func, returns) in PROBES {
        if !bin.has(func) {
            continue; // a server without a client (or the reverse): those probes have nothing to do
        }
        let offsets = if *returns { bin.return_offsets(func)? } else { vec![bin.entry_offset(func)?] };
        plan.push((prog, offsets));
    }
    let target: PathBuf = exe.to_path_buf();
    let mut links = Vec::new();
    for (prog, offsets) in &plan {
        let result = program(ebpf, prog).and_then(|p| p.attach(offsets.iter().copied(), &target, UProbeScope::AllProcesses));
        match result {
            Ok(id) => links.push((*prog, id)),
            Err(e) => {
                for (prog, id) in links {
                    if let Ok(p) = program(ebpf, prog) {
                        let _ = p.detach(id);
                    }
                }
                return Err(GoError::Attach(e.to_string()));
            }
        }
    }
    Ok(())
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe, ProgramError> {
    ebpf.program_mut(name).ok_or(ProgramError::NotLoaded)?.try_into()
}
