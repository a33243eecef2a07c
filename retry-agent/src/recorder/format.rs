//! The dump file format, version 1.
//!
//! ```text
//! file   = header block* end
//! header = "RAFLTREC" version:u16 flags:u16 len:u32 crc:u32 json[len]
//!          crc = crc32c(version..len ++ json); json = DumpHeader
//! block  = "RAB1" seq:u32 count:u32 clen:u32 ulen:u32 crc:u32 zstd[clen]
//!          crc = crc32c(seq..ulen ++ zstd); zstd decompresses to `count` JSON lines, one Record each
//! end    = "RAE1" blocks:u32 records:u64 crc:u32      crc = crc32c(blocks ++ records)
//! ```
//! All integers little-endian. Every block checks itself, so the reader keeps every intact block
//! of a truncated or partly overwritten file: after a bad block it resynchronises on the next
//! block magic (never trusting a length it could not verify). Sequence numbers and the end record
//! say what was lost. A header whose checksum holds and whose version is newer than this reader
//! is refused.
use std::{
    fs::File,
    io::{self, Write},
    path::Path,
};

use serde::{Deserialize, Serialize};

use super::{DumpReason, RecorderConfig};
use crate::pipeline::Record;

pub const MAGIC: &[u8; 8] = b"RAFLTREC";
pub const FORMAT_VERSION: u16 = 1;
const BLOCK_MAGIC: &[u8; 4] = b"RAB1";
const END_MAGIC: &[u8; 4] = b"RAE1";
const HEADER_FIXED: usize = 8 + 2 + 2 + 4 + 4;
const BLOCK_HDR: usize = 4 + 4 * 5;
const END_LEN: usize = 4 + 4 + 8 + 4;
/// A block is cut at this many uncompressed bytes or records: the unit of loss.
const BLOCK_TARGET_BYTES: usize = 128 * 1024;
const BLOCK_MAX_RECORDS: u32 = 2048;
/// Readers refuse blocks claiming more than this (bounds memory on corrupt input).
const BLOCK_MAX_BYTES: usize = 16 << 20;
const HEADER_MAX_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("not a retry-agent dump (no header magic and no intact block)")]
    NotADump,
    #[error(
        "dump format version {found} is newer than this retry-agent understands (up to {supported}); \
         use a newer retry-agent to read it"
    )]
    FutureVersion { found: u16, supported: u16 },
    #[error("cannot read dump {path}")]
    Read {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// Everything about a dump except its records.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DumpHeader {
    pub agent_version: String,
    pub kernel: String,
    pub node: String,
    /// Wall clock and CLOCK_MONOTONIC at the time of the dump: maps record times to wall time.
    pub created_unix_ms: u64,
    pub created_mono_ns: u64,
    /// Record time range (CLOCK_MONOTONIC ns) the dump covers.
    pub from_ns: u64,
    pub to_ns: u64,
    pub reason: DumpReason,
    /// The recorder config in force (kept loose so old dumps parse after the config grows).
    pub config: serde_json::Value,
    /// Records the ring had already let go of before the first one in this dump.
    #[serde(default)]
    pub missing_before: u64,
    /// Records the ring let go in the middle of this dump's range (a storm dump whose
    /// after-window outlasted what the ring holds): the records on either side of the gap are
    /// here, the ones in it are not.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub missing_between: u64,
    /// The live pipeline's settings ([`crate::pipeline::PipelineConfig`]), so a replay runs
    /// with what the agent ran with. Loose for the same reason as `config`; null if unknown.
    #[serde(default)]
    pub pipeline: serde_json::Value,
}

impl DumpHeader {
    pub fn new(reason: DumpReason, config: RecorderConfig, from_ns: u64, to_ns: u64) -> Self {
        DumpHeader {
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            kernel: read_trim("/proc/sys/kernel/osrelease"),
            node: node_name(),
            created_unix_ms: unix_ms(),
            created_mono_ns: mono_ns(),
            from_ns,
            to_ns,
            reason,
            config: serde_json::to_value(config).unwrap_or(serde_json::Value::Null),
            missing_before: 0,
            missing_between: 0,
            pipeline: serde_json::Value::Null,
        }
    }

    /// Wall-clock ms for a record time in this dump.
    pub fn wall_ms(&self, ts_ns: u64) -> i128 {
        self.created_unix_ms as i128 - (self.created_mono_ns as i128 - ts_ns as i128) / 1_000_000
    }
}

fn read_trim(p: &str) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

pub(crate) fn node_name() -> String {
    let n = read_trim("/proc/sys/kernel/hostname");
    // The node goes into file names: keep it to a safe alphabet.
    let n: String = n
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if n.is_empty() { "node".into() } else { n }
}

pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// CLOCK_MONOTONIC, the clock event timestamps use.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; CLOCK_MONOTONIC always exists.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Create a new file readable by its owner only (dumps hold traffic metadata).
pub fn create_private(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// Byte range and record count of one written block (tests use it to know what is intact).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSpan {
    pub start: u64,
    pub end: u64,
    pub records: u32,
}

/// Streams records into blocks.
pub struct DumpWriter<W: Write> {
    out: W,
    pos: u64,
    buf: Vec<u8>,
    count: u32,
    seq: u32,
    total_records: u64,
    spans: Vec<BlockSpan>,
}

impl<W: Write> DumpWriter<W> {
    pub fn new(mut out: W, header: &DumpHeader) -> io::Result<Self> {
        let json = serde_json::to_vec(header).map_err(io::Error::other)?;
        let len = u32::try_from(json.len()).map_err(|_| io::Error::other("header too large"))?;
        let mut fixed = Vec::with_capacity(HEADER_FIXED);
        fixed.extend_from_slice(MAGIC);
        fixed.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        fixed.extend_from_slice(&0u16.to_le_bytes());
        fixed.extend_from_slice(&len.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&fixed[8..]), &json);
        fixed.extend_from_slice(&crc.to_le_bytes());
        out.write_all(&fixed)?;
        out.write_all(&json)?;
        Ok(DumpWriter {
            out,
            pos: (fixed.len() + json.len()) as u64,
            buf: Vec::with_capacity(BLOCK_TARGET_BYTES + 4096),
            count: 0,
            seq: 0,
            total_records: 0,
            spans: Vec::new(),
        })
    }

    pub fn push(&mut self, rec: &Record) -> io::Result<()> {
        serde_json::to_writer(&mut self.buf, rec).map_err(io::Error::other)?;
        self.buf.push(b'\n');
        self.count += 1;
        if self.buf.len() >= BLOCK_TARGET_BYTES || self.count >= BLOCK_MAX_RECORDS {
            self.flush_block()?;
        }
        Ok(())
    }

    fn flush_block(&mut self) -> io::Result<()> {
        if self.count == 0 {
            return Ok(());
        }
        let z = zstd::bulk::compress(&self.buf, 3)?;
        let clen = u32::try_from(z.len()).map_err(|_| io::Error::other("block too large"))?;
        let ulen =
            u32::try_from(self.buf.len()).map_err(|_| io::Error::other("block too large"))?;
        let mut hdr = Vec::with_capacity(BLOCK_HDR);
        hdr.extend_from_slice(BLOCK_MAGIC);
        for v in [self.seq, self.count, clen, ulen] {
            hdr.extend_from_slice(&v.to_le_bytes());
        }
        let crc = crc32c::crc32c_append(crc32c::crc32c(&hdr[4..]), &z);
        hdr.extend_from_slice(&crc.to_le_bytes());
        self.out.write_all(&hdr)?;
        self.out.write_all(&z)?;
        let end = self.pos + (hdr.len() + z.len()) as u64;
        self.spans.push(BlockSpan {
            start: self.pos,
            end,
            records: self.count,
        });
        self.pos = end;
        self.total_records += u64::from(self.count);
        self.seq += 1;
        self.count = 0;
        self.buf.clear();
        Ok(())
    }

    pub fn spans(&self) -> &[BlockSpan] {
        &self.spans
    }

    /// Flush the last block and write the end record; returns the sink.
    pub fn finish(mut self) -> io::Result<W> {
        self.flush_block()?;
        let mut end = Vec::with_capacity(END_LEN);
        end.extend_from_slice(END_MAGIC);
        end.extend_from_slice(&self.seq.to_le_bytes());
        end.extend_from_slice(&self.total_records.to_le_bytes());
        let crc = crc32c::crc32c(&end[4..]);
        end.extend_from_slice(&crc.to_le_bytes());
        self.out.write_all(&end)?;
        Ok(self.out)
    }

    /// Like `finish`, also returning the block spans.
    pub fn finish_with_spans(mut self) -> io::Result<(W, Vec<BlockSpan>)> {
        self.flush_block()?;
        let spans = self.spans.clone();
        Ok((self.finish()?, spans))
    }
}

/// What the reader could not recover.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Loss {
    /// The header failed its checksum (or was cut): times/config unknown, records still read.
    pub header_damaged: bool,
    pub blocks_ok: u64,
    /// Blocks known missing (sequence gaps, and the end record's count when it survived).
    pub blocks_lost: u64,
    /// Records known missing (only when the end record survived).
    pub records_lost: Option<u64>,
    /// Bytes that belonged to no intact block.
    pub bytes_skipped: u64,
    /// No end record: the file was cut (or its end overwritten); blocks after the last intact one
    /// may be missing without being counted.
    pub truncated: bool,
    /// Lines inside intact blocks that did not parse (a newer writer's record kinds).
    pub bad_records: u64,
}

impl Loss {
    pub fn is_clean(&self) -> bool {
        let records_lost = self.records_lost.filter(|&n| n > 0);
        Loss {
            blocks_ok: self.blocks_ok,
            records_lost,
            ..self.clone()
        } == Loss {
            blocks_ok: self.blocks_ok,
            ..Loss::default()
        }
    }
}

impl std::fmt::Display for Loss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_clean() {
            return write!(f, "intact ({} blocks)", self.blocks_ok);
        }
        write!(
            f,
            "{} blocks intact, {} lost",
            self.blocks_ok, self.blocks_lost
        )?;
        if let Some(r) = self.records_lost {
            write!(f, " ({r} records)")?;
        }
        if self.bytes_skipped > 0 {
            write!(f, ", {} bytes unreadable", self.bytes_skipped)?;
        }
        if self.header_damaged {
            write!(f, ", header damaged")?;
        }
        if self.truncated {
            write!(
                f,
                ", file truncated (end record missing: later blocks may be lost)"
            )?;
        }
        if self.bad_records > 0 {
            write!(f, ", {} unparseable records", self.bad_records)?;
        }
        Ok(())
    }
}

#[derive(Clone, Debug)]
pub struct ReadOutcome {
    pub header: Option<DumpHeader>,
    pub records: Vec<Record>,
    pub loss: Loss,
}

pub struct DumpReader;

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        b.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

enum Item {
    Block {
        seq: u32,
        records: Vec<Record>,
        bad: u64,
    },
    End {
        blocks: u32,
        records: u64,
    },
}

impl DumpReader {
    pub fn open(path: &Path) -> Result<ReadOutcome, FormatError> {
        let bytes = std::fs::read(path).map_err(|source| FormatError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::read(&bytes)
    }

    /// Read everything recoverable. Never panics on any input.
    pub fn read(b: &[u8]) -> Result<ReadOutcome, FormatError> {
        let mut loss = Loss::default();
        let (header, mut pos) = match Self::header(b)? {
            Some((h, end)) => (Some(h), end),
            None => {
                loss.header_damaged = true;
                (None, 0)
            }
        };
        let mut records = Vec::new();
        let mut seqs: Vec<u32> = Vec::new();
        let mut end: Option<(u32, u64)> = None;
        let mut skip_start: Option<usize> = None;
        while pos < b.len() {
            match Self::item_at(b, pos) {
                Some((item, len)) => {
                    if let Some(s) = skip_start.take() {
                        loss.bytes_skipped += (pos - s) as u64;
                    }
                    match item {
                        Item::Block {
                            seq,
                            records: mut r,
                            bad,
                            ..
                        } => {
                            seqs.push(seq);
                            loss.bad_records += bad;
                            records.append(&mut r);
                        }
                        Item::End { blocks, records } => end = Some((blocks, records)),
                    }
                    pos += len;
                }
                None => {
                    skip_start.get_or_insert(pos);
                    pos = Self::next_magic(b, pos + 1);
                }
            }
        }
        if let Some(s) = skip_start {
            loss.bytes_skipped += (b.len() - s) as u64;
        }
        if header.is_none()
            && seqs.is_empty()
            && end.is_none()
            && b.get(..8) != Some(MAGIC.as_slice())
        {
            return Err(FormatError::NotADump);
        }
        loss.blocks_ok = seqs.len() as u64;
        seqs.sort_unstable();
        seqs.dedup();
        let seen = seqs.len() as u64;
        let highest = seqs.last().map_or(0, |&s| u64::from(s) + 1);
        match end {
            Some((blocks, total)) => {
                let expected = u64::from(blocks).max(highest);
                loss.blocks_lost = expected - seen;
                loss.records_lost =
                    Some(total.saturating_sub(records.len() as u64 + loss.bad_records));
            }
            None => {
                loss.truncated = true;
                loss.blocks_lost = highest - seen;
            }
        }
        Ok(ReadOutcome {
            header,
            records,
            loss,
        })
    }

    /// Parse the header; `Ok(None)` when it is damaged (the blocks may still be fine).
    fn header(b: &[u8]) -> Result<Option<(DumpHeader, usize)>, FormatError> {
        if b.get(..8) != Some(MAGIC.as_slice()) {
            return Ok(None);
        }
        let (Some(version), Some(len), Some(crc)) = (u16_at(b, 8), u32_at(b, 12), u32_at(b, 16))
        else {
            return Ok(None);
        };
        let len = len as usize;
        if len > HEADER_MAX_BYTES {
            return Ok(None);
        }
        let Some(json) = b.get(HEADER_FIXED..HEADER_FIXED + len) else {
            return Ok(None);
        };
        let Some(fixed) = b.get(8..16) else {
            return Ok(None);
        };
        if crc32c::crc32c_append(crc32c::crc32c(fixed), json) != crc {
            return Ok(None);
        }
        // Only a header that checks out can refuse the file: a flipped bit must not.
        if version > FORMAT_VERSION {
            return Err(FormatError::FutureVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        match serde_json::from_slice::<DumpHeader>(json) {
            Ok(h) => Ok(Some((h, HEADER_FIXED + len))),
            Err(_) => Ok(None),
        }
    }

    fn next_magic(b: &[u8], from: usize) -> usize {
        let mut i = from;
        while i + 4 <= b.len() {
            if let Some(w) = b.get(i..i + 4)
                && (w == BLOCK_MAGIC || w == END_MAGIC)
            {
                return i;
            }
            i += 1;
        }
        b.len()
    }

    fn item_at(b: &[u8], pos: usize) -> Option<(Item, usize)> {
        let magic = b.get(pos..pos + 4)?;
        if magic == END_MAGIC {
            let body = b.get(pos + 4..pos + 16)?;
            let crc = u32_at(b, pos + 16)?;
            if crc32c::crc32c(body) != crc {
                return None;
            }
            return Some((
                Item::End {
                    blocks: u32_at(b, pos + 4)?,
                    records: u64_at(b, pos + 8)?,
                },
                END_LEN,
            ));
        }
        if magic != BLOCK_MAGIC {
            return None;
        }
        let seq = u32_at(b, pos + 4)?;
        let count = u32_at(b, pos + 8)?;
        let clen = u32_at(b, pos + 12)? as usize;
        let ulen = u32_at(b, pos + 16)? as usize;
        let crc = u32_at(b, pos + 20)?;
        if clen > BLOCK_MAX_BYTES || ulen > BLOCK_MAX_BYTES {
            return None;
        }
        let data = b.get(pos + BLOCK_HDR..pos + BLOCK_HDR + clen)?;
        let fields = b.get(pos + 4..pos + 20)?;
        if crc32c::crc32c_append(crc32c::crc32c(fields), data) != crc {
            return None;
        }
        let raw = zstd::bulk::decompress(data, ulen).ok()?;
        let mut records = Vec::with_capacity(count as usize);
        let mut bad = 0;
        for line in raw.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
            match serde_json::from_slice::<Record>(line) {
                Ok(r) => records.push(r),
                Err(_) => bad += 1,
            }
        }
        let len = BLOCK_HDR + clen;
        Some((Item::Block { seq, records, bad }, len))
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
