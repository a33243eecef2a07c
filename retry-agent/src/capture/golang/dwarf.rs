//! Struct field offsets from a Go program's DWARF, for the probes that follow pointers through
//! a library's own structs (gRPC-go's transport). The Go linker zlib-compresses its DWARF
//! sections (SHF_COMPRESSED); names are inline strings (DW_FORM_string), which is all this
//! reads. A binary built with `-ldflags=-w` (or `-s -w`) has none: that is `GoError::NoDwarf`.
use std::{borrow::Cow, collections::HashMap};

use gimli::{AttributeValue, DebugAbbrev, DebugInfo, LittleEndian, constants};
use object::{CompressionFormat, Object as _, ObjectSection as _};

use super::GoError;

/// Largest DWARF section read (inflated). The agent reads the binaries of every workload on
/// the node, some of them not its operators': a section claiming more is refused rather than
/// inflated (a zlib bomb would otherwise cost that much memory). A 12 MB gRPC-go binary has
/// 1.2 MB of .debug_info (compressed), read and walked in ~40 ms.
const MAX_SECTION_BYTES: u64 = 64 << 20;

/// The bytes of a DWARF section, decompressed; None when the file has no such section.
fn section<'d, R: object::ReadRef<'d>>(
    file: &object::File<'d, R>,
    name: &str,
) -> Result<Option<Cow<'d, [u8]>>, GoError> {
    let Some(sec) = file.section_by_name(name) else {
        return Ok(None);
    };
    let c = sec.compressed_data()?;
    if c.uncompressed_size > MAX_SECTION_BYTES {
        return Err(GoError::Dwarf(format!(
            "{name}: {} bytes, more than the {MAX_SECTION_BYTES} read",
            c.uncompressed_size
        )));
    }
    match c.format {
        CompressionFormat::None => Ok(Some(Cow::Borrowed(c.data))),
        CompressionFormat::Zlib => {
            // The header's size bounds the output: a corrupt stream cannot balloon.
            let limit = usize::try_from(c.uncompressed_size).unwrap_or(usize::MAX);
            miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(c.data, limit)
                .map(|v| Some(Cow::Owned(v)))
                .map_err(|_| GoError::Dwarf(format!("{name}: bad zlib stream")))
        }
        f => Err(GoError::Dwarf(format!(
            "{name}: unsupported compression {f:?}"
        ))),
    }
}

/// Byte offsets of the wanted `(struct, member)` pairs (struct names are package-qualified, as
/// Go writes them: `google.golang.org/grpc/internal/transport.Stream`). Pairs not found are
/// absent from the result; the walk stops once every pair is found.
pub(super) fn field_offsets<'d, 'w, R: object::ReadRef<'d>>(
    file: &object::File<'d, R>,
    wanted: &[(&'w str, &'w str)],
) -> Result<HashMap<(&'w str, &'w str), u64>, GoError> {
    let info = section(file, ".debug_info")?.ok_or(GoError::NoDwarf)?;
    let abbrev = section(file, ".debug_abbrev")?.ok_or(GoError::NoDwarf)?;
    let info = DebugInfo::new(&info, LittleEndian);
    let abbrev = DebugAbbrev::new(&abbrev, LittleEndian);
    let dwarf = |e: gimli::Error| GoError::Dwarf(e.to_string());
    let mut out = HashMap::new();
    let mut units = info.units();
    while let Some(unit) = units.next().map_err(dwarf)? {
        let abbrevs = unit.abbreviations(&abbrev).map_err(dwarf)?;
        let mut entries = unit.entries(&abbrevs);
        // The wanted struct being walked, and the depth of its DIE.
        let mut current: Option<(&'w str, isize)> = None;
        while let Some(e) = entries.next_dfs().map_err(dwarf)? {
            let depth = e.depth();
            if let Some((_, d)) = current
                && depth <= d
            {
                current = None;
            }
            let name = match e.attr_value(constants::DW_AT_name) {
                Some(AttributeValue::String(s)) => std::str::from_utf8(s.slice()).ok(),
                _ => None,
            };
            match e.tag() {
                constants::DW_TAG_structure_type => {
                    current = name.and_then(|n| {
                        wanted
                            .iter()
                            .find(|(s, _)| *s == n)
                            .map(|(s, _)| (*s, depth))
                    });
                }
                constants::DW_TAG_member => {
                    let (Some((st, d)), Some(member)) = (current, name) else {
                        continue;
                    };
                    if depth != d + 1 {
                        continue;
                    }
                    let Some(&(s, m)) = wanted.iter().find(|(s, m)| *s == st && *m == member)
                    else {
                        continue;
                    };
                    let at = e
                        .attr_value(constants::DW_AT_data_member_location)
                        .and_then(|v| v.udata_value());
                    if let Some(at) = at {
                        out.insert((s, m), at);
                        if out.len() == wanted.len() {
                            return Ok(out);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    Ok(out)
}
