//! The embedded eBPF object altered the ways a kernel can refuse part of it, so the capture's
//! handling of a refusal is tested against the real kernel: a program the verifier refuses (as
//! another kernel's verifier or JIT would refuse one of ours), a tracepoint the kernel does not
//! have (as on an architecture without that syscall).
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

/// The embedded object.
fn embedded() -> Vec<u8> {
    retry_agent::capture::EBPF_OBJECT.to_vec()
}

/// The object with `program`'s first instruction replaced by `exit`, which every verifier
/// refuses: what follows it is unreachable (`unreachable insn 1`).
pub fn refusing(program: &str) -> Vec<u8> {
    let mut obj = embedded();
    let at = {
        let file = object::File::parse(&*obj).expect("the embedded object parses");
        let sym = file
            .symbols()
            .find(|s| s.name() == Ok(program))
            .unwrap_or_else(|| panic!("no program {program} in the object"));
        let section = file
            .section_by_index(sym.section_index().expect("a program lives in a section"))
            .unwrap();
        let (start, _) = section
            .file_range()
            .expect("a program's code is in the file");
        (start + sym.address()) as usize
    };
    // BPF_JMP | BPF_EXIT, no registers, no offset, no immediate.
    obj[at..at + 8].copy_from_slice(&[0x95, 0, 0, 0, 0, 0, 0, 0]);
    obj
}

/// The object with the tracepoint `name` (e.g. `sys_exit_readv`) renamed, wherever the object
/// names it, to one no kernel has: the same length with its last character `_`.
pub fn without_tracepoint(name: &str) -> Vec<u8> {
    let mut obj = embedded();
    let from = format!("/{name}\0");
    let mut to = from.clone().into_bytes();
    let last = to.len() - 2;
    to[last] = b'_';
    let mut found = 0;
    let mut i = 0;
    while let Some(k) = obj[i..]
        .windows(from.len())
        .position(|w| w == from.as_bytes())
    {
        let at = i + k;
        obj[at..at + to.len()].copy_from_slice(&to);
        found += 1;
        i = at + to.len();
    }
    assert!(found > 0, "the object never names {name}");
    obj
}
