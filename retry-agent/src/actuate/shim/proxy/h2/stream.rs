//! What both h2c relays (`h2`, `h2/pooled`) follow of a request, and the policy steps they share: the request a
//! decoded block opens, its key's body digest and count, whether a held request's body is
//! here, the local answer to a suppressed retry, and the streams left out.
use std::time::Instant;

use bytes::BytesMut;
use http::StatusCode;

use super::{
    super::{ConnInfo, Ctx, bump, is_grpc, key_of_fields},
    Step,
    fields::Fields,
    frame::{self, DATA, END_STREAM, HEADERS, Head, INTERNAL_ERROR, NO_ERROR, RST_STREAM},
};
use crate::{
    actuate::shim::{
        answer::{self, LocalAnswer},
        policy::{self, BodyDigest, FailureReply, RequestKey, SuppressReason, Verdict},
    },
    l7::{Claim, RETRY_SUPPRESSED_HEADER},
};

/// What the relay follows of one request.
pub(super) struct Stream {
    /// Until the body digest is complete: the key without it.
    pub(super) key: RequestKey,
    pub(super) digest: Option<BodyDigest>,
    pub(super) marked: bool,
    pub(super) grpc: bool,
    /// Whether a failure gets the pushback (the edge was suppressed when the request came).
    pub(super) pushback: bool,
    pub(super) status: Option<StatusCode>,
    pub(super) grpc_status: Option<u32>,
    pub(super) claim: Claim,
    /// The outcome is still to be recorded.
    pub(super) watch: bool,
    /// The tracker has counted the request (held ones when decided, others once keyed).
    pub(super) counted: bool,
}

/// A request whose HEADERS wait (undecided, still in the client buffer) for its body.
pub(super) struct Held {
    pub(super) stream: u32,
    /// Bytes of its HEADERS and CONTINUATION frames at the front of the client buffer.
    pub(super) block_len: usize,
    pub(super) end_stream: bool,
    pub(super) deadline: tokio::time::Instant,
    pub(super) st: Stream,
}

/// The request the decoded block opens, keyed as far as its headers go.
pub(super) fn request_of(ctx: &Ctx, info: &ConnInfo, f: &Fields) -> Option<Stream> {
    let method = http::Method::from_bytes(f.get(b":method")?).ok()?;
    let headers = f.headers();
    let authority = f
        .get(b":authority")
        .or_else(|| f.get(b"host"))
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .unwrap_or_default();
    let target = String::from_utf8_lossy(f.get(b":path").unwrap_or_default()).into_owned();
    let now = Instant::now();
    let grpc = is_grpc(&headers);
    let key = key_of_fields(info, method, authority, target, &headers);
    let suppressed = ctx.view.suppression(&info.orig, now);
    Some(Stream {
        key,
        digest: Some(BodyDigest::default()),
        marked: policy::retry_markers(&headers).says_retry(),
        grpc,
        // As the hyper path: only where retries must stop.
        pushback: grpc && suppressed == Some(crate::decide::Reason::CalleeUnclaimed),
        status: None,
        grpc_status: None,
        claim: Claim::Missing,
        watch: true,
        counted: false,
    })
}

/// The key's body digest is as complete as it will be; the request is counted.
pub(super) fn settle(ctx: &Ctx, info: &ConnInfo, st: &mut Stream) {
    if let Some(d) = st.digest.take() {
        st.key.body = d.finish();
    }
    if st.counted {
        return;
    }
    st.counted = true;
    let now = Instant::now();
    let v = ctx.tracker.on_request(
        &st.key,
        st.marked,
        ctx.view.suppression(&info.orig, now),
        now,
    );
    if matches!(v, Verdict::Forward { retry: true }) {
        bump(&ctx.stats.retries_forwarded);
    }
}

/// Whether the held request's body (the block of `block_len` bytes at the front of `buf` opens
/// `stream`) has its first bytes buffered behind it: (ready, ended, the digest of what is).
pub(super) fn body_ahead(
    buf: &[u8],
    stream: u32,
    block_len: usize,
    end_stream: bool,
) -> Result<(bool, bool, BodyDigest), Step> {
    let mut ready = end_stream;
    let mut ended = end_stream;
    let mut digest = BodyDigest::default();
    let mut at = block_len;
    while !ready {
        let Some(head) = buf.get(at..).and_then(Head::parse) else {
            break;
        };
        let Some(f) = buf.get(at..at + head.total()) else {
            break;
        };
        at += head.total();
        if head.stream != stream {
            continue;
        }
        match head.kind {
            DATA => {
                let payload = &f[frame::HEADER_LEN..];
                let r =
                    frame::content(&head, payload).map_err(|_| Step::Unreadable("DATA padding"))?;
                let more = digest.feed(payload.get(r).unwrap_or_default());
                ended = head.has(END_STREAM);
                ready = !more || ended;
            }
            // Trailers or a reset: the body has ended.
            HEADERS | RST_STREAM => {
                ended = true;
                ready = true;
            }
            _ => {}
        }
    }
    Ok((ready, ended, digest))
}

/// A suppressed retry's answer on the client's stream; its request, if still open, is
/// closed with NO_ERROR (the answer is complete, nothing more is wanted).
pub(super) fn put_answer(
    out: &mut BytesMut,
    stream: u32,
    reason: SuppressReason,
    reply: Option<FailureReply>,
    grpc: bool,
    request_ended: bool,
) {
    let why = reason.as_str().as_bytes();
    let mut b = BytesMut::with_capacity(160);
    match answer::local_answer(reply, grpc) {
        LocalAnswer::Reset => {
            frame::put_rst(out, stream, INTERNAL_ERROR);
            return;
        }
        LocalAnswer::Http(status) => {
            frame::put_literal(&mut b, b":status", status.as_str().as_bytes());
            frame::put_literal(&mut b, b"content-type", b"text/plain");
            frame::put_literal(&mut b, b"content-length", b"0");
            frame::put_literal(&mut b, RETRY_SUPPRESSED_HEADER.as_bytes(), why);
        }
        LocalAnswer::Grpc(code) => {
            // Trailers-only: status and trailers in one block.
            frame::put_literal(&mut b, b":status", b"200");
            frame::put_literal(&mut b, b"content-type", b"application/grpc");
            frame::put_literal(&mut b, b"grpc-status", code.to_string().as_bytes());
            frame::put_literal(
                &mut b,
                b"grpc-message",
                answer::GRPC_SUPPRESSED_MESSAGE.as_bytes(),
            );
            frame::put_literal(&mut b, b"grpc-retry-pushback-ms", b"-1");
            frame::put_literal(&mut b, RETRY_SUPPRESSED_HEADER.as_bytes(), why);
        }
    }
    frame::put_block(out, stream, END_STREAM, &b);
    if !request_ended {
        frame::put_rst(out, stream, NO_ERROR);
    }
}

/// Left-out stream ids remembered, so their late frames never reach the callee.
const MAX_DROPPED: usize = 1024;

/// Client streams left out (suppressed retries), the newest [`MAX_DROPPED`], so their late
/// frames never reach the callee.
#[derive(Default)]
pub(super) struct Dropped(std::collections::VecDeque<u32>);

impl Dropped {
    pub(super) fn has(&self, stream: u32) -> bool {
        self.0.binary_search(&stream).is_ok()
    }

    pub(super) fn add(&mut self, stream: u32) {
        if self.0.len() >= MAX_DROPPED {
            self.0.pop_front();
        }
        // Ids only grow, so the list stays sorted.
        self.0.push_back(stream);
    }
}
