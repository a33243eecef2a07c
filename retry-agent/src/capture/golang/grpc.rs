//! gRPC-go: what the stream probes (retry-ebpf's go.rs) need to read in a program's memory.
//!
//! gRPC-go's frames are read and written by per-connection goroutines, so each stream is bound
//! to its request context when it starts: at `(*Server).handleStream` and at the returns of
//! `(*http2Client).NewStream`. Both follow the transport's `net.Conn` to the socket's fd, which
//! needs the offsets of a few fields of gRPC's own structs: those move between gRPC releases,
//! so they are read from the program's DWARF. A stripped program (`-ldflags=-s -w`) gets them
//! from a table of the gRPC releases whose layout was read here, found by the release its
//! user-agent string names; any other stripped release keeps the syscall-level linking.
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
use retry_common::GoGrpcOffsets;

use super::{GoError, dwarf};

/// Entry probe: a server stream's handler goroutine starts.
pub const SERVER: &str = "google.golang.org/grpc.(*Server).handleStream";
/// Return probes: a client stream was created (and given its id) on the caller's goroutine.
pub const CLIENT: &str = "google.golang.org/grpc/internal/transport.(*http2Client).NewStream";

const STREAM: &str = "google.golang.org/grpc/internal/transport.Stream";
const H2_SERVER: &str = "google.golang.org/grpc/internal/transport.http2Server";
const H2_CLIENT: &str = "google.golang.org/grpc/internal/transport.http2Client";

/// The fields the probes read, in `GoGrpcOffsets` order.
const FIELDS: [(&str, &str); 4] = [
    (STREAM, "id"),
    (STREAM, "ct"),
    (H2_SERVER, "conn"),
    (H2_CLIENT, "conn"),
];

/// Layouts read from the DWARF of these gRPC-go releases (major, minor): Stream.id,
/// Stream.ct, http2Server.conn, http2Client.conn. 1.33 is Debian bookworm's
/// golang-google-grpc-dev (1.33.3).
const KNOWN_LAYOUTS: &[((u32, u32), [u32; 4])] = &[((1, 33), [0, 24, 32, 72])];

/// The offsets for one program: from its DWARF, or for a stripped one from [`KNOWN_LAYOUTS`]
/// (`GoError::NoDwarf` when its release is not there: its gRPC streams keep the
/// syscall-level linking).
pub(super) fn offsets<'d, R: object::ReadRef<'d>>(
    file: &object::File<'d, R>,
) -> Result<GoGrpcOffsets, GoError> {
    let fields = match from_dwarf(file) {
        Err(GoError::NoDwarf) => {
            let release = release(file).ok_or(GoError::NoDwarf)?;
            KNOWN_LAYOUTS
                .iter()
                .find(|(r, _)| *r == release)
                .map(|(_, o)| *o)
                .ok_or(GoError::UnknownLayout(release.0, release.1))?
        }
        other => other?,
    };
    let [stream_id, stream_client, server_conn, client_conn] = fields;
    Ok(GoGrpcOffsets {
        stream_id,
        stream_client,
        server_conn,
        client_conn,
        tcp_conn_itab: tcp_conn_itab(file),
    })
}

/// The gRPC-go release (major, minor) named by the user-agent string the library builds from
/// its version constant (`grpc-go/1.33.3`), which the compiler folds into one literal.
fn release<'d, R: object::ReadRef<'d>>(file: &object::File<'d, R>) -> Option<(u32, u32)> {
    let data = file.section_by_name(".rodata")?.data().ok()?;
    let at = memchr::memmem::find(data, b"grpc-go/")? + b"grpc-go/".len();
    parse_release(data.get(at..)?)
}

/// "1.33.3…" → (1, 33). Only major and minor: the literal runs on into the next string's
/// bytes, which may be digits, and layouts do not change in patch releases.
pub(super) fn parse_release(b: &[u8]) -> Option<(u32, u32)> {
    let num = |b: &[u8]| -> Option<(u32, usize)> {
        let n = b.iter().take_while(|c| c.is_ascii_digit()).count();
        let v = std::str::from_utf8(b.get(..n)?).ok()?.parse().ok()?;
        (n > 0 && n <= 4).then_some((v, n))
    };
    let (major, n) = num(b)?;
    let rest = b.get(n..)?.strip_prefix(b".")?;
    let (minor, m) = num(rest)?;
    // The minor must end at a dot (a patch follows): "1.33" running into digits is ambiguous.
    (rest.get(m) == Some(&b'.')).then_some((major, minor))
}

/// [`FIELDS`]' offsets, in their order, from the program's DWARF.
fn from_dwarf<'d, R: object::ReadRef<'d>>(file: &object::File<'d, R>) -> Result<[u32; 4], GoError> {
    let found = dwarf::field_offsets(file, &FIELDS)?;
    let mut out = [0u32; 4];
    for (o, f) in out.iter_mut().zip(FIELDS) {
        *o = found
            .get(&f)
            .and_then(|&v| u32::try_from(v).ok())
            .ok_or(GoError::MissingField(f.0, f.1))?;
    }
    Ok(out)
}

/// The `*net.TCPConn` implementation of `net.Conn`'s itab (named `go.itab.…` before go1.20,
/// `go:itab.…` since), or 0.
fn tcp_conn_itab<'d, R: object::ReadRef<'d>>(file: &object::File<'d, R>) -> u64 {
    file.symbols()
        .find(|s| {
            s.name().is_ok_and(|n| {
                n.strip_prefix("go:itab.")
                    .or_else(|| n.strip_prefix("go.itab."))
                    == Some("*net.TCPConn,net.Conn")
            })
        })
        .map_or(0, |s| s.address())
}
