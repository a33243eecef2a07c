//! A direction's header blocks read as a request's or an answer's fields: its HPACK decoder,
//! the memory of blocks that repeat (`repeats`), and what a block read in part may vouch for.
//!
//! HPACK state is cumulative: once a header block is missed or cut short (capture started
//! mid-connection, block larger than the captured prefix) the dynamic table is unknowable for
//! the rest of the connection. Later blocks are then read in part (`hpack::Decoder::forget`):
//! static fields, literals and entries added since are read, references into the unknown part
//! are not, and a block with any such field is unknown (`unknown`), with what it cannot vouch
//! for left out: a request's method (without its whole head, two calls cannot be told to be the
//! same), the status of an answer's last block unless it says a failure (a 200 may carry a gRPC
//! error in a field that did not resolve; a head that leaves its stream open cannot, its
//! trailers do). An HTTP/2 connection older than the agent (a DaemonSet rollout among
//! long-lived ones) so still shows its proxies' and servers' statuses and its new paths, even
//! when the server refers to fields it indexed before (Go's, nghttp2's `content-type`).
use super::{
    super::{
        hpack,
        http1::Side,
        msg::{
            ReqInfo, RespInfo, apply_request_header, apply_response_header, parse_method,
            path_string, request_header_read, response_header_read,
        },
        util::{MAX_AUTHORITY, bounded_string, path_of_target, query_hash_of_target},
    },
    Block,
    repeats::{Repeats, table_preserving},
};

/// Largest HPACK dynamic table a peer may ask for that we honour (bounded memory per
/// direction); a larger size update makes the decoder unknowable, not unbounded.
const MAX_HPACK_TABLE: usize = 64 * 1024;

/// How one header block came.
#[derive(Clone, Copy)]
pub(super) struct Shape {
    /// Whose fields it holds (a promised request's are a request's).
    pub side: Side,
    /// Only its captured prefix is here: an error at its end is expected, what decoded is
    /// unknown (incomplete), and the table is unknowable after it.
    pub cut: bool,
    /// It ends its stream (an answer's trailers, or a trailers-only answer).
    pub ends_stream: bool,
    /// It may be answered from, and kept in, the memory of repeats (not a promise's).
    pub remembered: bool,
}

/// One direction's header-block reader.
pub(super) struct Blocks {
    /// Partial (`hpack::Decoder::partial`) once the sender's table is unknowable.
    decoder: hpack::Decoder,
    repeats: Repeats,
}

impl Blocks {
    /// `known`: the sender's table is known from its start (false: capture started
    /// mid-connection).
    pub(super) fn new(known: bool) -> Blocks {
        let mut b = Blocks {
            decoder: hpack::Decoder::new(MAX_HPACK_TABLE),
            repeats: Repeats::default(),
        };
        if !known {
            b.forget();
        }
        b
    }

    /// The sender's dynamic table is unknowable from here: blocks are read in part.
    pub(super) fn forget(&mut self) {
        self.decoder.forget();
        self.repeats.clear();
    }

    /// The fields of header block `bytes`, come as `shape` says.
    pub(super) fn read(&mut self, bytes: &[u8], shape: Shape) -> Block {
        let repeatable = !shape.cut && shape.remembered && table_preserving(bytes);
        let mut block = if repeatable {
            match self.repeats.get(bytes) {
                Some(b) => b.clone(),
                None => {
                    let b = self.decode(bytes, shape);
                    if !matches!(b, Block::Unknown) {
                        self.repeats.put(bytes, &b);
                    }
                    b
                }
            }
        } else {
            self.repeats.clear();
            self.decode(bytes, shape)
        };
        if shape.cut {
            // The rest of the block may have added entries.
            self.forget();
        }
        // Only an answer's last block can hide a gRPC status (trailers, or a trailers-only
        // answer): a head that leaves its stream open keeps its status, which its trailers,
        // read on their own, may still take back (`conn::h2`). Applied to what the memory of
        // repeats gives too: the same bytes come as a head and as a trailers-only answer.
        if shape.ends_stream
            && let Block::Response(r) = &mut block
            && r.unknown
        {
            vouch_for_what_resolved(r);
        }
        block
    }

    fn decode(&mut self, bytes: &[u8], shape: Shape) -> Block {
        let mut req = ReqInfo::default();
        let mut resp = RespInfo::default();
        // Values of fields nothing here reads are not decoded (Huffman costs most of HPACK).
        let res = match shape.side {
            Side::Request => self.decoder.decode_some(
                bytes,
                |n| n.first() == Some(&b':') || request_header_read(n),
                |n, v| {
                    if let Some(v) = v {
                        apply_h2_request_header(&mut req, n, v)
                    }
                },
            ),
            Side::Response => self
                .decoder
                .decode_some(bytes, response_header_read, |n, v| {
                    if let Some(v) = v {
                        apply_response_header(&mut resp, n, v)
                    }
                }),
        };
        let unresolved = self.decoder.unresolved() > 0;
        if shape.cut || unresolved {
            req.unknown = true;
            resp.unknown = true;
        }
        if unresolved {
            req.method = None;
        }
        match res {
            Err(e) if !shape.cut => {
                tracing::debug!(error = %e, "HPACK block did not decode; decoder state unknowable");
                self.forget();
                Block::Unknown
            }
            _ => match shape.side {
                Side::Request => Block::Request(req),
                Side::Response => Block::Response(resp),
            },
        }
    }
}

/// An answer's last header block not all read (fields that did not resolve in a table partly
/// unknown, or the end of a block cut short) keeps only what the rest cannot contradict: its
/// status goes unless it is a failure, since the fields not read may have been the gRPC status
/// a 200 carries, and a failed call must not read as a success. (`x-envoy-ratelimited` on a
/// 200 is not guarded against: Envoy sends it with a 429.) (A request's method goes in
/// the same case: with its head partly unknown, two calls are not known to be the same one.)
fn vouch_for_what_resolved(resp: &mut RespInfo) {
    let sig = &mut resp.signals;
    if sig.grpc_status.is_none() && sig.status.is_some_and(|st| st < 400) {
        sig.status = None;
    }
}

fn apply_h2_request_header(req: &mut ReqInfo, n: &[u8], v: &[u8]) {
    match n {
        b":method" => req.method = Some(parse_method(v)),
        b":path" => {
            req.path = Some(path_string(path_of_target(v)));
            req.query_hash = query_hash_of_target(v);
        }
        b":authority" => req.authority = Some(bounded_string(v, MAX_AUTHORITY)),
        _ => apply_request_header(req, n, v),
    }
}
