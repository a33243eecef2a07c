//! `.gopclntab`: the function table the Go runtime keeps for stack traces, present even in
//! stripped binaries. Only what finding functions by name needs is read: the header, the
//! function table (entry, offset of its `_func`), and each `_func`'s name offset.
//!
//! Header (go1.18+, magic 0xfffffff0/0xfffffff1): magic u32, 2 pad bytes, min instruction size,
//! pointer size, then nfunc, nfiles, textStart, funcnameOffset, cuOffset, filetabOffset,
//! pctabOffset, pclnOffset as pointer-sized words; the function table at pclnOffset holds
//! (entryoff u32, funcoff u32) pairs relative to textStart and pclnOffset, ending with the end
//! PC's offset. go1.16/1.17 (magic 0xfffffffa) have no textStart and pointer-sized pairs with
//! absolute entries.
//!
//! The whole table is walked (some names occur twice: see the ABI0 wrappers below).
use std::collections::HashMap;

use super::{FuncRange, GoError};

const MAGIC_116: u32 = 0xffff_fffa;
const MAGIC_118: u32 = 0xffff_fff0;
const MAGIC_120: u32 = 0xffff_fff1;

/// Ranges of the `wanted` functions found in `tab`.
pub fn lookup(
    tab: &[u8],
    wanted: &[&'static str],
) -> Result<HashMap<&'static str, FuncRange>, GoError> {
    let magic = u32::from_le_bytes(bytes::<4>(tab, 0)?);
    let ptr = usize::from(*tab.get(7).ok_or(GoError::Pclntab("truncated header"))?);
    if ptr != 8 {
        return Err(GoError::Pclntab("only 64-bit tables are read"));
    }
    let word =
        |i: usize| -> Result<u64, GoError> { Ok(u64::from_le_bytes(bytes::<8>(tab, 8 + i * 8)?)) };
    let (nfunc, text_start, funcname_off, pcln_off, new) = match magic {
        MAGIC_118 | MAGIC_120 => (word(0)?, word(2)?, word(3)?, word(7)?, true),
        MAGIC_116 => (word(0)?, 0, word(2)?, word(6)?, false),
        _ => return Err(GoError::Pclntab("unknown magic (Go version not supported)")),
    };
    let nfunc = usize::try_from(nfunc).map_err(|_| GoError::Pclntab("bad nfunc"))?;
    let funcnames = usize::try_from(funcname_off).map_err(|_| GoError::Pclntab("bad offset"))?;
    let pcln = usize::try_from(pcln_off).map_err(|_| GoError::Pclntab("bad offset"))?;
    if nfunc > tab.len() {
        return Err(GoError::Pclntab("nfunc larger than the table"));
    }
    let pair = if new { 8 } else { 16 };
    let entry_at = |i: usize| -> Result<(u64, usize), GoError> {
        let at = pcln + i * pair;
        if new {
            let entry = u64::from(u32::from_le_bytes(bytes::<4>(tab, at)?)) + text_start;
            let func = u32::from_le_bytes(bytes::<4>(tab, at + 4)?) as usize;
            Ok((entry, func))
        } else {
            let entry = u64::from_le_bytes(bytes::<8>(tab, at)?);
            let func = usize::try_from(u64::from_le_bytes(bytes::<8>(tab, at + 8)?))
                .map_err(|_| GoError::Pclntab("bad offset"))?;
            Ok((entry, func))
        }
    };
    let mut out = HashMap::new();
    for i in 0..nfunc {
        let (entry, func) = entry_at(i)?;
        // _func: entry (u32 offset since go1.18, a pointer before), then nameOff int32.
        let name_field = pcln + func + if new { 4 } else { 8 };
        let name_off = i32::from_le_bytes(bytes::<4>(tab, name_field)?);
        let Ok(name_off) = usize::try_from(name_off) else {
            continue;
        };
        let name = c_str(tab, funcnames + name_off)?;
        if let Some(w) = wanted.iter().find(|w| w.as_bytes() == name) {
            // The next entry (or the table's end PC) closes the function.
            let end = entry_at(i + 1)?.0;
            if end <= entry {
                return Err(GoError::Pclntab("function table not sorted"));
            }
            // A function called from assembly also has an ABI0 wrapper of the same name (a
            // few bytes that call it with register arguments): the larger body is the real one.
            let range = FuncRange { entry, end };
            out.entry(*w)
                .and_modify(|r: &mut FuncRange| {
                    if range.end - range.entry > r.end - r.entry {
                        *r = range;
                    }
                })
                .or_insert(range);
        }
    }
    Ok(out)
}

fn bytes<const N: usize>(tab: &[u8], at: usize) -> Result<[u8; N], GoError> {
    tab.get(
        at..at
            .checked_add(N)
            .ok_or(GoError::Pclntab("offset overflow"))?,
    )
    .and_then(|s| s.try_into().ok())
    .ok_or(GoError::Pclntab("offset past the table"))
}

fn c_str(tab: &[u8], at: usize) -> Result<&[u8], GoError> {
    let rest = tab
        .get(at..)
        .ok_or(GoError::Pclntab("name past the table"))?;
    let end = rest
        .iter()
        .position(|b| *b == 0)
        .ok_or(GoError::Pclntab("unterminated name"))?;
    Ok(&rest[..end])
}
