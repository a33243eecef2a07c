//! `.go.buildinfo`: the Go version a program was built with.
//!
//! Layout: a 14-byte magic, the pointer size, a flags byte. Since go1.18 (flag bit 1) the
//! version follows inline at offset 32 as a uvarint-length string; before, two pointers at
//! offset 16 lead to Go string headers (data pointer, length) elsewhere in the file.
use std::fmt;

use object::{Object as _, ObjectSection as _};

use super::GoError;

const MAGIC: &[u8] = b"\xff Go buildinf:";
const FLAG_BIG_ENDIAN: u8 = 1;
const FLAG_VERSION_INLINE: u8 = 2;

/// A Go release, e.g. go1.19.8 (pre-releases and devel builds compare as their base release).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct GoVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl GoVersion {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// Parses `go1.19.8`, `go1.21rc2`, `devel go1.22-abcdef …`.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        let s = s.strip_prefix("devel ").unwrap_or(s);
        let s = s.strip_prefix("go")?;
        let mut nums = s.split('.').map(|part| {
            let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u32>().ok()
        });
        let major = nums.next()??;
        let minor = nums.next().flatten().unwrap_or(0);
        let patch = nums.next().flatten().unwrap_or(0);
        Some(Self {
            major,
            minor,
            patch,
        })
    }
}

impl fmt::Display for GoVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "go{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The version recorded in `data` (the bytes of `.go.buildinfo`).
pub fn version<'d, R: object::ReadRef<'d>>(
    file: &object::File<'d, R>,
    data: &[u8],
) -> Result<GoVersion, GoError> {
    if !data.starts_with(MAGIC) {
        return Err(GoError::BuildInfo("bad magic"));
    }
    let ptr_size = usize::from(*data.get(14).ok_or(GoError::BuildInfo("truncated header"))?);
    let flags = *data.get(15).ok_or(GoError::BuildInfo("truncated header"))?;
    let text = if flags & FLAG_VERSION_INLINE != 0 {
        inline_string(
            data.get(32..)
                .ok_or(GoError::BuildInfo("truncated header"))?,
        )?
    } else {
        if ptr_size != 8 && ptr_size != 4 {
            return Err(GoError::BuildInfo("unknown pointer size"));
        }
        let big = flags & FLAG_BIG_ENDIAN != 0;
        let ptr = read_uint(
            data.get(16..16 + ptr_size)
                .ok_or(GoError::BuildInfo("truncated header"))?,
            big,
        );
        let header = read_at(file, ptr, 2 * ptr_size)
            .ok_or(GoError::BuildInfo("version pointer outside the file"))?;
        let str_ptr = read_uint(&header[..ptr_size], big);
        let len = usize::try_from(read_uint(&header[ptr_size..], big))
            .map_err(|_| GoError::BuildInfo("bad length"))?;
        if len > 4096 {
            return Err(GoError::BuildInfo("version string too long"));
        }
        read_at(file, str_ptr, len).ok_or(GoError::BuildInfo("version string outside the file"))?
    };
    let text =
        std::str::from_utf8(&text).map_err(|_| GoError::BuildInfo("version is not UTF-8"))?;
    GoVersion::parse(text).ok_or(GoError::BuildInfo("version is not goX.Y"))
}

/// A uvarint-length-prefixed string at the start of `data`.
fn inline_string(data: &[u8]) -> Result<Vec<u8>, GoError> {
    let mut len: u64 = 0;
    for (i, b) in data.iter().enumerate().take(10) {
        len |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            let start = i + 1;
            let end = usize::try_from(len)
                .ok()
                .and_then(|l| start.checked_add(l))
                .ok_or(GoError::BuildInfo("bad length"))?;
            return data
                .get(start..end)
                .map(<[u8]>::to_vec)
                .ok_or(GoError::BuildInfo("version string truncated"));
        }
    }
    Err(GoError::BuildInfo("bad uvarint"))
}

fn read_uint(bytes: &[u8], big_endian: bool) -> u64 {
    let mut v: u64 = 0;
    if big_endian {
        for b in bytes {
            v = (v << 8) | u64::from(*b);
        }
    } else {
        for b in bytes.iter().rev() {
            v = (v << 8) | u64::from(*b);
        }
    }
    v
}

/// `len` bytes at virtual address `addr`, from whichever section holds them.
fn read_at<'d, R: object::ReadRef<'d>>(
    file: &object::File<'d, R>,
    addr: u64,
    len: usize,
) -> Option<Vec<u8>> {
    file.sections().find_map(|s| {
        let rel = addr.checked_sub(s.address())?;
        let start = usize::try_from(rel).ok()?;
        s.data()
            .ok()?
            .get(start..start.checked_add(len)?)
            .map(<[u8]>::to_vec)
    })
}
