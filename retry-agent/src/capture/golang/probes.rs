//! Attaching the Go uprobes (retry-ebpf's go.rs) to every Go executable the node runs.
//!
//! Uprobes attach to files: each distinct executable (by device and inode; a container image's
//! copy is a file of its own, reached through `/proc/<pid>/exe`) is inspected once. Programs
//! that are not Go, are too old, or do not use net/http are left alone; a Go program that
//! cannot be instrumented is logged and counted, and keeps the syscall-level linking (never
//! fatal).
use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::mpsc,
};

use aya::{
    Ebpf,
    programs::{ProgramError, UProbe, uprobe::UProbeScope},
};
use retry_common::GoGrpcOffsets;

use super::{GoBinary, GoError, grpc};
use crate::capture::programs::{Hook, ProgramSpec, UprobeTarget};

/// One Go probe: the program, the function, and whether it goes at the function's RETs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub program: String,
    pub function: &'static str,
    pub returns: bool,
}

/// The functions a Go program must have for its HTTP calls to be linked.
const SERVER: &str = "net/http.serverHandler.ServeHTTP";
const CLIENT: &str = "net/http.(*persistConn).roundTrip";
/// Every function the object's Go programs may name; a program naming another one is refused
/// (its function must be looked up in binaries, and names are the only key).
const KNOWN: &[&str] = &[
    SERVER,
    CLIENT,
    "net/http.(*Request).write",
    "runtime.newproc1",
    "runtime.goexit1",
    grpc::SERVER,
    grpc::CLIENT,
];

/// Whether a function belongs to the gRPC-go probes (attached only where the program's DWARF
/// gave their offsets).
fn is_grpc(function: &str) -> bool {
    function == grpc::SERVER || function == grpc::CLIENT
}

/// The object's `go` / `go-ret` programs (their sections name the functions).
pub(crate) fn plan(specs: &[ProgramSpec]) -> Vec<Probe> {
    let mut out = Vec::new();
    for s in specs {
        let Hook::Uprobe(u) = &s.hook else { continue };
        let returns = match u.target {
            UprobeTarget::Go => false,
            UprobeTarget::GoReturns => true,
            UprobeTarget::Libssl | UprobeTarget::Calibrate => continue,
        };
        for f in &u.symbols {
            match KNOWN.iter().find(|k| **k == f.as_str()) {
                Some(function) => out.push(Probe {
                    program: s.name.clone(),
                    function,
                    returns,
                }),
                None => {
                    tracing::warn!(program = %s.name, function = %f, "Go probe on a function the agent does not know: not attached")
                }
            }
        }
    }
    out
}

/// What became of one executable.
#[derive(Debug)]
pub enum Outcome {
    Instrumented(GoBinary),
    /// Not a Go program, or one without an HTTP server or client: nothing to do.
    NotApplicable,
    Failed(GoError),
}

/// An executable read off the main loop, waiting to be attached.
#[derive(Debug)]
struct Inspected {
    key: (u64, u64),
    exe: PathBuf,
    result: Result<GoBinary, GoError>,
}

/// The Go probes of one capture.
#[derive(Debug, Default)]
pub struct GoProbes {
    plan: Vec<Probe>,
    loaded: Option<bool>,
    /// Executables handled or being read (dev, inode), whatever the outcome.
    files: HashSet<(u64, u64)>,
    /// Processes already looked at.
    pids: HashSet<u32>,
    /// Processes whose executable is still being read: they get its gRPC offsets once it is.
    waiting: HashMap<(u64, u64), Vec<u32>>,
    /// Executables read on a blocking thread, for the next scan to attach.
    inspected: Option<(mpsc::Sender<Inspected>, mpsc::Receiver<Inspected>)>,
    /// gRPC-go executables whose stream probes are attached, and their offsets: each of their
    /// processes gets them in the kernel's `GO_GRPC` map.
    grpc_files: HashMap<(u64, u64), GoGrpcOffsets>,
    pub instrumented: usize,
    pub failed: usize,
    /// gRPC-go executables among the instrumented: with their stream probes, and without
    /// (no DWARF and a release the table does not know, or fields missing).
    pub grpc_linked: usize,
    pub grpc_unlinked: usize,
}

impl GoProbes {
    pub fn new(plan: Vec<Probe>) -> Self {
        Self {
            plan,
            ..Self::default()
        }
    }

    fn wanted(&self) -> Vec<&'static str> {
        let mut v: Vec<&'static str> = self.plan.iter().map(|p| p.function).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Instruments the executables of processes not seen before, reading them here; returns how
    /// many were added. Blocking /proc and file reads: at start-up, or where waiting is fine.
    pub fn scan(
        &mut self,
        ebpf: &mut Ebpf,
        proc_root: &Path,
        skip_pid: u32,
        scope: &crate::capture::Scope,
    ) -> usize {
        let wanted = self.wanted();
        self.discover(ebpf, proc_root, skip_pid, scope)
            .into_iter()
            .map(|(exe, key)| {
                let result = GoBinary::inspect(&exe, &wanted);
                self.finish(ebpf, Inspected { key, exe, result })
            })
            .filter(|added| *added)
            .count()
    }

    /// As [`GoProbes::scan`], but new executables are read on tokio's blocking threads (a Go
    /// binary's symbols and DWARF take ~40 ms for 12 MB; the caller's loop carries the node's
    /// events meanwhile) and attached by a later call. Returns how many this call attached.
    /// Must be called inside a tokio runtime.
    pub fn scan_in_background(
        &mut self,
        ebpf: &mut Ebpf,
        proc_root: &Path,
        skip_pid: u32,
        scope: &crate::capture::Scope,
    ) -> usize {
        let mut added = 0;
        if let Some((_, rx)) = &self.inspected {
            let done: Vec<Inspected> = rx.try_iter().collect();
            for i in done {
                added += usize::from(self.finish(ebpf, i));
            }
        }
        let new = self.discover(ebpf, proc_root, skip_pid, scope);
        if new.is_empty() {
            return added;
        }
        let tx = self.inspected.get_or_insert_with(mpsc::channel).0.clone();
        let wanted = self.wanted();
        tokio::task::spawn_blocking(move || {
            for (exe, key) in new {
                let result = GoBinary::inspect(&exe, &wanted);
                if tx.send(Inspected { key, exe, result }).is_err() {
                    return; // the capture is gone
                }
            }
        });
        added
    }

    /// Executables being read on a blocking thread, not attached yet.
    pub fn inspecting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Lists the processes not seen before: the executables not handled yet are returned (one
    /// path each), processes of handled gRPC-go executables get their offsets now, those of
    /// executables being read once they are.
    fn discover(
        &mut self,
        ebpf: &mut Ebpf,
        proc_root: &Path,
        skip_pid: u32,
        scope: &crate::capture::Scope,
    ) -> Vec<(PathBuf, (u64, u64))> {
        // No Go program in the object: nothing to attach, so nothing worth reading.
        if self.plan.is_empty() {
            return Vec::new();
        }
        let Ok(dir) = std::fs::read_dir(proc_root) else {
            return Vec::new();
        };
        let mut live = HashSet::new();
        let mut new = Vec::new();
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            live.insert(pid);
            if pid == skip_pid || !self.pids.insert(pid) {
                continue;
            }
            // Outside the scope its sockets are untracked: its Go probes would only cost.
            if !scope.contains_pid(proc_root, pid) {
                continue;
            }
            let exe = proc_root.join(pid.to_string()).join("exe");
            let Some(key) = file_key(&exe) else { continue };
            if self.files.insert(key) {
                self.waiting.entry(key).or_default().push(pid);
                new.push((exe, key));
            } else if let Some(w) = self.waiting.get_mut(&key) {
                w.push(pid);
            } else if let Some(o) = self.grpc_files.get(&key) {
                set_grpc_offsets(ebpf, pid, o);
            }
        }
        // Forget pids that are gone, so a reused pid is looked at again.
        self.pids.retain(|p| live.contains(p));
        new
    }

    /// Attaches one executable read by [`GoBinary::inspect`], counts and logs the outcome, and hands the
    /// gRPC offsets to the processes that run it; true when probes were added.
    fn finish(&mut self, ebpf: &mut Ebpf, i: Inspected) -> bool {
        let Inspected { key, exe, result } = i;
        let pids = self.waiting.remove(&key).unwrap_or_default();
        let outcome = match result {
            Ok(bin) => self.attach_inspected(ebpf, &exe, bin),
            Err(GoError::NotGo | GoError::Elf(_)) => Outcome::NotApplicable,
            Err(e) => Outcome::Failed(e),
        };
        match outcome {
            Outcome::Instrumented(bin) => {
                match &bin.grpc {
                    Some(Ok(o)) => {
                        self.grpc_files.insert(key, *o);
                        self.grpc_linked += 1;
                        for pid in pids {
                            set_grpc_offsets(ebpf, pid, o);
                        }
                    }
                    Some(Err(e)) => {
                        self.grpc_unlinked += 1;
                        tracing::warn!(exe = %exe.display(), error = %e, "gRPC-go streams of this program are linked from syscalls only");
                    }
                    None => {}
                }
                tracing::info!(exe = %exe.display(), go = %bin, "Go request context from uprobes");
                self.instrumented += 1;
                true
            }
            Outcome::NotApplicable => false,
            Outcome::Failed(e) => {
                tracing::warn!(exe = %exe.display(), error = %e, "cannot instrument this Go program: its calls are linked from syscalls only");
                self.failed += 1;
                false
            }
        }
    }

    fn attach_inspected(&mut self, ebpf: &mut Ebpf, exe: &Path, bin: GoBinary) -> Outcome {
        if ![SERVER, CLIENT, grpc::SERVER, grpc::CLIENT]
            .iter()
            .any(|f| bin.has(f))
        {
            return Outcome::NotApplicable;
        }
        if !self.load(ebpf) {
            return Outcome::Failed(GoError::Pclntab("the Go probes do not load on this kernel"));
        }
        match attach(ebpf, exe, &bin, &self.plan) {
            Ok(()) => Outcome::Instrumented(bin),
            Err(e) => Outcome::Failed(e),
        }
    }

    fn load(&mut self, ebpf: &mut Ebpf) -> bool {
        *self.loaded.get_or_insert_with(|| {
            for probe in &self.plan {
                let prog = probe.program.as_str();
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
fn attach(ebpf: &mut Ebpf, exe: &Path, bin: &GoBinary, probes: &[Probe]) -> Result<(), GoError> {
    let mut plan: Vec<(&str, Vec<u64>)> = Vec::new();
    let grpc_ok = matches!(bin.grpc, Some(Ok(_)));
    for p in probes {
        if !bin.has(p.function) {
            continue; // a server without a client (or the reverse): those probes have nothing to do
        }
        if is_grpc(p.function) && !grpc_ok {
            continue; // nowhere known to read: the streams keep the syscall-level linking
        }
        let offsets = if p.returns {
            bin.return_offsets(p.function)?
        } else {
            vec![bin.entry_offset(p.function)?]
        };
        plan.push((p.program.as_str(), offsets));
    }
    let target: PathBuf = exe.to_path_buf();
    let mut links = Vec::new();
    for (prog, offsets) in &plan {
        let result = program(ebpf, prog)
            .and_then(|p| p.attach(offsets.iter().copied(), &target, UProbeScope::AllProcesses));
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

fn file_key(exe: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(exe).ok()?;
    Some((meta.dev(), meta.ino()))
}

/// Tells the kernel where process `pid`'s gRPC-go structs keep what the stream probes read.
fn set_grpc_offsets(ebpf: &mut Ebpf, pid: u32, o: &GoGrpcOffsets) {
    let map = ebpf
        .map_mut(retry_common::names::GO_GRPC)
        .ok_or_else(|| "no such map".to_string())
        .and_then(|m| {
            aya::maps::HashMap::<_, u32, GoGrpcOffsets>::try_from(m).map_err(|e| e.to_string())
        });
    let result = map.and_then(|mut m| m.insert(&pid, o, 0).map_err(|e| e.to_string()));
    if let Err(e) = result {
        tracing::warn!(pid, error = %e, "cannot hand gRPC-go offsets to the kernel: this process's streams are linked from syscalls only");
    }
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe, ProgramError> {
    ebpf.program_mut(name)
        .ok_or(ProgramError::NotLoaded)?
        .try_into()
}
