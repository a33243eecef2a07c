//! Go binaries: what the Go uprobes need to know about an executable before attaching.
//!
//! A Go program is recognised by its build-info section (`.go.buildinfo`, which also names the
//! Go version); its functions are found in the symbol table, or, when the binary is stripped
//! (`-ldflags=-s -w`), in the pclntab the Go runtime itself needs and that stripping keeps.
//! Uretprobes are unsafe on Go (the runtime moves goroutine stacks, and a uretprobe rewrites the
//! return address on the stack), so a function's returns are probed as uprobes on each of its
//! RET instructions, found by decoding its body.
//!
//! Pure: reads a file's bytes, never attaches anything; every malformed input is a typed error.
mod buildinfo;
mod dwarf;
pub mod grpc;
mod pclntab;
mod probes;

use std::{collections::HashMap, fmt, path::Path};

use iced_x86::{Decoder, DecoderOptions, Mnemonic};
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

pub use buildinfo::GoVersion;
pub(crate) use probes::plan;
pub use probes::{GoProbes, Probe};

/// Why a file cannot be instrumented as a Go program.
#[derive(Debug, thiserror::Error)]
pub enum GoError {
    #[error("reading the executable: {0}")]
    Io(#[from] std::io::Error),
    #[error("not an ELF file this agent can read: {0}")]
    Elf(#[from] object::Error),
    #[error("not a Go program (no .go.buildinfo section)")]
    NotGo,
    #[error("Go build info is malformed: {0}")]
    BuildInfo(&'static str),
    #[error("{0} is older than go1.17: arguments are not passed in registers")]
    TooOld(GoVersion),
    #[error("only x86-64 Go programs are instrumented (this one is {0:?})")]
    Architecture(object::Architecture),
    #[error("the function table (.gopclntab) is malformed: {0}")]
    Pclntab(&'static str),
    #[error("{0} is not in this program")]
    MissingFunction(&'static str),
    #[error("attaching the uprobes: {0}")]
    Attach(String),
    #[error("built without DWARF (-ldflags=-w): struct field offsets unknown")]
    NoDwarf,
    #[error("the DWARF is malformed: {0}")]
    Dwarf(String),
    #[error("{0}.{1} is not in this program's DWARF")]
    MissingField(&'static str, &'static str),
    #[error("built without DWARF, and the struct layout of gRPC-go {0}.{1} is not known")]
    UnknownLayout(u32, u32),
}

/// A function's place in the file: where its code starts and ends (virtual addresses) and how
/// a virtual address becomes the file offset a uprobe is attached at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FuncRange {
    pub entry: u64,
    pub end: u64,
}

/// What the agent knows about one Go executable.
#[derive(Debug)]
pub struct GoBinary {
    pub version: GoVersion,
    /// Whether the names came from the symbol table (false: from the pclntab; stripped).
    pub has_symbols: bool,
    functions: HashMap<&'static str, FuncRange>,
    /// For a gRPC-go program: where its stream probes read (or why they cannot).
    pub grpc: Option<Result<retry_common::GoGrpcOffsets, GoError>>,
    /// `.text`: virtual address, file offset, bytes (for RET decoding).
    text_addr: u64,
    text_offset: u64,
    text: Vec<u8>,
}

impl fmt::Display for GoBinary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({})",
            self.version,
            if self.has_symbols {
                "symbols"
            } else {
                "stripped: pclntab"
            }
        )
    }
}

impl GoBinary {
    /// Reads `path` and looks up `wanted` functions (missing ones are simply absent: a program
    /// that is not an HTTP server has no `net/http.serverHandler.ServeHTTP`).
    pub fn inspect(path: &Path, wanted: &[&'static str]) -> Result<Self, GoError> {
        // Read on demand: most executables on a node are not Go, and only their headers are
        // needed to say so.
        let cache = object::ReadCache::new(std::fs::File::open(path)?);
        Self::parse(&cache, wanted)
    }

    pub fn parse<'d, R: object::ReadRef<'d>>(
        data: R,
        wanted: &[&'static str],
    ) -> Result<Self, GoError> {
        let file = object::File::parse(data)?;
        let info = file
            .section_by_name(".go.buildinfo")
            .ok_or(GoError::NotGo)?;
        let version = buildinfo::version(&file, info.data()?)?;
        if file.architecture() != object::Architecture::X86_64 {
            return Err(GoError::Architecture(file.architecture()));
        }
        if version < GoVersion::new(1, 17, 0) {
            return Err(GoError::TooOld(version));
        }
        let text = file
            .section_by_name(".text")
            .ok_or(GoError::Pclntab("no .text section"))?;
        let (text_offset, _) = text
            .file_range()
            .ok_or(GoError::Pclntab(".text has no file range"))?;
        let mut functions = from_symbols(&file, wanted);
        let has_symbols = file.symbols().next().is_some();
        if !has_symbols || functions.len() < wanted.len() {
            let tab = file
                .section_by_name(".gopclntab")
                .ok_or(GoError::Pclntab("no .gopclntab section"))?;
            for (name, range) in pclntab::lookup(tab.data()?, wanted)? {
                functions.entry(name).or_insert(range);
            }
        }
        let grpc = (functions.contains_key(grpc::SERVER) || functions.contains_key(grpc::CLIENT))
            .then(|| grpc::offsets(&file));
        Ok(Self {
            version,
            has_symbols,
            functions,
            grpc,
            text_addr: text.address(),
            text_offset,
            text: text.data()?.to_vec(),
        })
    }

    pub fn has(&self, name: &str) -> bool {
        self.functions.contains_key(name)
    }

    /// The file offset of `name`'s first instruction (where an entry uprobe goes).
    pub fn entry_offset(&self, name: &'static str) -> Result<u64, GoError> {
        let f = self
            .functions
            .get(name)
            .ok_or(GoError::MissingFunction(name))?;
        self.file_offset(f.entry)
            .ok_or(GoError::Pclntab("function outside .text"))
    }

    /// The file offsets of every RET instruction in `name` (where its "return" uprobes go).
    pub fn return_offsets(&self, name: &'static str) -> Result<Vec<u64>, GoError> {
        let f = *self
            .functions
            .get(name)
            .ok_or(GoError::MissingFunction(name))?;
        let start = f
            .entry
            .checked_sub(self.text_addr)
            .ok_or(GoError::Pclntab("function before .text"))?;
        let end = f
            .end
            .checked_sub(self.text_addr)
            .ok_or(GoError::Pclntab("function end before .text"))?;
        let body = usize::try_from(start)
            .ok()
            .zip(usize::try_from(end).ok())
            .and_then(|(s, e)| self.text.get(s..e))
            .ok_or(GoError::Pclntab("function outside .text"))?;
        let rets = ret_addresses(body, f.entry);
        if rets.is_empty() {
            return Err(GoError::Pclntab("function has no RET instruction"));
        }
        rets.into_iter()
            .map(|a| {
                self.file_offset(a)
                    .ok_or(GoError::Pclntab("RET outside .text"))
            })
            .collect()
    }

    fn file_offset(&self, addr: u64) -> Option<u64> {
        let rel = addr.checked_sub(self.text_addr)?;
        (rel < self.text.len() as u64).then(|| self.text_offset + rel)
    }
}

/// Function ranges from the ELF symbol table (sizes included), for the wanted names.
fn from_symbols<'d, R: object::ReadRef<'d>>(
    file: &object::File<'d, R>,
    wanted: &[&'static str],
) -> HashMap<&'static str, FuncRange> {
    let mut out = HashMap::new();
    for sym in file.symbols() {
        let Ok(name) = sym.name() else { continue };
        if let Some(w) = wanted.iter().find(|w| **w == name)
            && sym.size() > 0
        {
            out.insert(
                *w,
                FuncRange {
                    entry: sym.address(),
                    end: sym.address() + sym.size(),
                },
            );
        }
    }
    out
}

/// Addresses of the RET instructions in `body`, which starts at virtual address `ip`.
/// Decoding runs linearly: Go puts no data in amd64 function bodies (jump tables live in
/// rodata), and padding after the last instruction is INT3, which decodes harmlessly.
fn ret_addresses(body: &[u8], ip: u64) -> Vec<u64> {
    let mut decoder = Decoder::with_ip(64, body, ip, DecoderOptions::NONE);
    let mut out = Vec::new();
    while decoder.can_decode() {
        let insn = decoder.decode();
        if insn.mnemonic() == Mnemonic::Ret {
            out.push(insn.ip());
        }
    }
    out
}

#[cfg(test)]
mod tests;
