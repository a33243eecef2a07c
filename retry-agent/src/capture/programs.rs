//! What is attached, read from the object itself: each program's ELF section is written by its
//! attribute on the kernel side (retry-ebpf), so the attribute is the one place that says where
//! a program goes.
//!
//! - `tracepoint/<category>/<name>`: attached at load to that tracepoint.
//! - `uprobe/<target>:<symbol>[,<symbol>…]` and `uretprobe/…`: a uprobe family, attached per file
//!   of `<target>` by that target's module (`libssl`: [`super::tls`]; `go`, `go-ret`:
//!   [`super::golang`]; `calibrate`: [`super::calibrate`]).
//!
//! Anything else (a kprobe, an unknown uprobe target) fails the load with the program's name:
//! a program the capture does not know how to attach must never sit silently unattached. To add
//! a uprobe family, add its target to [`UprobeTarget`] and a module that attaches its programs.
use object::{Object as _, ObjectSection as _, ObjectSymbol as _, SectionKind, SymbolKind};

/// Where one program goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Hook {
    Tracepoint { category: String, name: String },
    Uprobe(Uprobe),
}

/// One uprobe program of a family: the symbols it probes in every file of its target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Uprobe {
    pub target: UprobeTarget,
    pub symbols: Vec<String>,
    /// A return probe (`uretprobe`).
    pub ret: bool,
}

/// The uprobe families the capture attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum UprobeTarget {
    /// Every OpenSSL shared library the node's processes map ([`super::tls`]).
    Libssl,
    /// Every Go executable the node runs, at the function's entry ([`super::golang`]).
    Go,
    /// Every Go executable, at each RET instruction of the function (uretprobes are unsafe on
    /// Go's moving stacks).
    GoReturns,
    /// One function of the agent's own, in its own process: what a uprobe costs on this node
    /// ([`super::calibrate`]).
    Calibrate,
}

impl UprobeTarget {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "libssl" => Some(UprobeTarget::Libssl),
            "go" => Some(UprobeTarget::Go),
            "go-ret" => Some(UprobeTarget::GoReturns),
            "calibrate" => Some(UprobeTarget::Calibrate),
            _ => None,
        }
    }
}

/// A program of the object and where it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ProgramSpec {
    pub name: String,
    pub hook: Hook,
}

#[derive(Debug, thiserror::Error)]
pub enum ProgramsError {
    #[error("the eBPF object does not parse as ELF: {0}")]
    Elf(String),
    #[error(
        "program {program} is in section {section}, which the capture does not know how to attach"
    )]
    Unattachable { program: String, section: String },
}

/// Every program in `object` with its hook, sorted by name.
pub(crate) fn programs(object: &[u8]) -> Result<Vec<ProgramSpec>, ProgramsError> {
    let file = object::File::parse(object).map_err(|e| ProgramsError::Elf(e.to_string()))?;
    let mut out = Vec::new();
    for sym in file.symbols() {
        if sym.kind() != SymbolKind::Text || !sym.is_global() {
            continue;
        }
        let Some(section) = sym
            .section_index()
            .and_then(|i| file.section_by_index(i).ok())
        else {
            continue;
        };
        // `.text` holds BPF subprograms (functions programs call), not programs.
        if section.kind() != SectionKind::Text || section.name() == Ok(".text") {
            continue;
        }
        let (Ok(program), Ok(section)) = (sym.name(), section.name()) else {
            continue;
        };
        let hook = hook(section).ok_or_else(|| ProgramsError::Unattachable {
            program: program.to_string(),
            section: section.to_string(),
        })?;
        out.push(ProgramSpec {
            name: program.to_string(),
            hook,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The hook a section name says, if the capture attaches it.
fn hook(section: &str) -> Option<Hook> {
    let (kind, rest) = section.split_once('/')?;
    match kind {
        "tracepoint" => {
            let (category, name) = rest.split_once('/')?;
            (!category.is_empty() && !name.is_empty() && !name.contains('/')).then(|| {
                Hook::Tracepoint {
                    category: category.to_string(),
                    name: name.to_string(),
                }
            })
        }
        "uprobe" | "uretprobe" => {
            let (target, symbols) = rest.split_once(':')?;
            let symbols: Vec<String> = symbols
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            if symbols.is_empty() {
                return None;
            }
            Some(Hook::Uprobe(Uprobe {
                target: UprobeTarget::parse(target)?,
                symbols,
                ret: kind == "uretprobe",
            }))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;
