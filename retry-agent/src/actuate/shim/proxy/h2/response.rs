//! The callee's side of the h2c relay: response header blocks read for the status, gRPC
//! status and claim, a failure's block given the claim and pushback, outcomes recorded where
//! streams end.
use std::time::Instant;

use bytes::BytesMut;
use http::StatusCode;

use super::{
    super::{ConnInfo, Ctx, outcome, stamp},
    Relay, Side, Step, Stream, block_extent,
    fields::Fields,
    frame::{
        self, CONTINUATION, DATA, END_HEADERS, END_STREAM, HEADERS, Head, PUSH_PROMISE, RST_STREAM,
    },
    settle,
};
use crate::{
    actuate::shim::policy,
    l7::{Claim, ERROR_CLAIM_HEADER},
};

impl Relay {
    /// Server bytes: relay every complete frame, reading response blocks and ends.
    pub(super) fn on_server(&mut self, buf: &mut BytesMut) {
        if !self.blind
            && let Err(Step::Unreadable(why)) = self.server_frames(buf)
        {
            tracing::debug!(orig = %self.info.orig, why, "h2c relay: passing the callee's bytes through");
            self.blind = true;
        }
        if self.blind {
            self.to_client.extend_from_slice(buf);
            buf.clear();
        }
    }

    fn server_frames(&mut self, buf: &mut BytesMut) -> Result<(), Step> {
        loop {
            let Some(head) = Head::parse(buf) else {
                return Ok(());
            };
            if matches!(head.kind, HEADERS | PUSH_PROMISE) {
                let Some(len) = block_extent(buf, &head)? else {
                    return Ok(());
                };
                self.decode_block(buf, len, Side::Response)?;
                let frames = buf.split_to(len);
                if head.kind == HEADERS {
                    self.server_block(&head, frames);
                } else {
                    self.to_client.extend_from_slice(&frames);
                }
                continue;
            }
            if head.kind == CONTINUATION {
                return Err(Step::Unreadable("CONTINUATION outside a header block"));
            }
            if buf.len() < head.total() {
                return Ok(());
            }
            let f = buf.split_to(head.total());
            self.to_client.extend_from_slice(&f);
            match head.kind {
                DATA if head.has(END_STREAM) => self.commit(head.stream, false),
                RST_STREAM => self.commit(head.stream, true),
                _ => {}
            }
        }
    }

    /// A decoded response block: headers (the status, a trailers-only gRPC status) or
    /// trailers; a failure's block gets the claim and the pushback.
    fn server_block(&mut self, head: &Head, mut frames: BytesMut) {
        let Some(st) = self.streams.get_mut(&head.stream) else {
            self.to_client.extend_from_slice(&frames);
            return;
        };
        match read_response(&self.ctx, &self.info, st, &self.resp_fields) {
            Read::Annotate(b) => {
                clear_last_end_headers(&mut frames);
                self.to_client.extend_from_slice(&frames);
                frame::put_head(
                    &mut self.to_client,
                    b.len(),
                    CONTINUATION,
                    END_HEADERS,
                    head.stream,
                );
                self.to_client.extend_from_slice(&b);
            }
            Read::Informational => {
                self.to_client.extend_from_slice(&frames);
                return;
            }
            Read::Pass => self.to_client.extend_from_slice(&frames),
        }
        if head.has(END_STREAM) {
            self.commit(head.stream, false);
        }
    }

    /// The response ended (or was reset): its outcome is recorded and the stream forgotten.
    fn commit(&mut self, stream: u32, reset: bool) {
        if let Some(st) = self.streams.remove(&stream) {
            record_outcome(&self.ctx, &self.info, st, reset);
        }
    }

    /// The callee closed: every request still waiting for it was reset.
    pub(super) fn upstream_ended(&mut self) {
        let open: Vec<u32> = self.streams.keys().copied().collect();
        for s in open {
            self.commit(s, true);
        }
    }
}

/// What a response block came to.
pub(super) enum Read {
    /// A 1xx: on as it is; the final status is still to come.
    Informational,
    /// On as it is.
    Pass,
    /// A failure's block: these fields (literals) go after it.
    Annotate(BytesMut),
}

/// Reads a decoded response block (headers, a trailers-only gRPC status, or trailers) into the
/// stream's state: the status, gRPC status and claim; a success forgets the request's earlier
/// failure; a failure's block is to get the claim and the pushback.
pub(super) fn read_response(ctx: &Ctx, info: &ConnInfo, st: &mut Stream, fields: &Fields) -> Read {
    if st.status.is_none() {
        let status = fields
            .get(b":status")
            .and_then(|s| StatusCode::from_bytes(s).ok());
        if status.is_some_and(|s| s.is_informational()) {
            return Read::Informational;
        }
        st.status = status;
        settle(ctx, info, st);
    }
    let grpc_status = fields
        .get(b"grpc-status")
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|s| s.trim().parse().ok());
    let claim_field = fields.get(ERROR_CLAIM_HEADER.as_bytes());
    if let Some(c) = claim_field.and_then(Claim::parse) {
        st.claim = c;
    }
    let mut annotate = false;
    if st.grpc {
        st.grpc_status = grpc_status.or(st.grpc_status);
        if st.grpc_status.is_none() && fields.get(b"grpc-status").is_some() {
            st.grpc_status = Some(2); // unparseable status: UNKNOWN, a failure
        }
        annotate = grpc_status.is_some_and(|s| s != 0);
    } else if st.status.is_some_and(policy::status_is_failure) {
        annotate = true;
    } else if st.watch {
        // Success: forget any earlier failure of this request.
        st.watch = false;
        ctx.tracker.on_outcome(&st.key, None, Instant::now());
    }
    let stamp = stamp(ctx, info, annotate, claim_field.is_some());
    let pushback = st.pushback && fields.get(b"grpc-retry-pushback-ms").is_none();
    if !(annotate && (stamp.is_some() || pushback)) {
        return Read::Pass;
    }
    let mut b = BytesMut::with_capacity(64);
    if let Some(c) = stamp {
        // What the caller is told is what its retry is judged by.
        st.claim = c;
        frame::put_literal(&mut b, ERROR_CLAIM_HEADER.as_bytes(), c.as_str().as_bytes());
    }
    if pushback {
        frame::put_literal(&mut b, b"grpc-retry-pushback-ms", b"-1");
    }
    Read::Annotate(b)
}

/// A response ended (or was reset): its outcome goes to the tracker.
pub(super) fn record_outcome(ctx: &Ctx, info: &ConnInfo, mut st: Stream, reset: bool) {
    settle(ctx, info, &mut st);
    if !st.watch {
        return;
    }
    let failed = if st.grpc {
        st.grpc_status.is_none_or(|s| s != 0)
    } else {
        st.status.is_none_or(policy::status_is_failure)
    };
    let outcome = outcome(st.status, st.grpc_status, failed, reset, st.claim);
    ctx.tracker.on_outcome(&st.key, outcome, Instant::now());
}

/// Clears END_HEADERS on the last frame of a block, so a CONTINUATION of ours can follow.
fn clear_last_end_headers(frames: &mut BytesMut) {
    let mut at = 0;
    let mut last = None;
    while let Some(h) = frames.get(at..).and_then(Head::parse) {
        last = Some(at);
        at += h.total();
    }
    if let Some(flags) = last.and_then(|l| frames.get_mut(l + 4)) {
        *flags &= !END_HEADERS;
    }
}
