//! The response body on its way back: passed through untouched, except that a gRPC failure's
//! trailers get the claim and the pushback, and the outcome is recorded once the body ends
//! (or is dropped, which is often where its end is seen).
use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Instant,
};

use bytes::Bytes;
use http::StatusCode;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use super::{Ctx, annotate_failure};
use crate::{
    actuate::shim::policy::{self, FailureReply, RequestKey},
    l7::Claim,
};

/// What a response's outcome is recorded from.
pub(super) struct Watch {
    pub(super) ctx: Arc<Ctx>,
    pub(super) key: RequestKey,
    pub(super) status: StatusCode,
    pub(super) grpc: bool,
    pub(super) grpc_status: Option<u32>,
    pub(super) claim: Claim,
    pub(super) stamp: Option<Claim>,
    pub(super) pushback: bool,
}

impl Watch {
    fn commit(self, reset: bool) {
        let failed = if self.grpc {
            self.grpc_status.is_none_or(|s| s != 0)
        } else {
            policy::status_is_failure(self.status)
        };
        let now = Instant::now();
        let outcome = if reset {
            Some((FailureReply::Reset, self.claim))
        } else if failed {
            // Only the status: a suppressed retry gets a synthetic answer, never this body.
            Some((
                FailureReply::Response {
                    status: self.status,
                    grpc_status: self.grpc_status,
                },
                self.claim,
            ))
        } else {
            None
        };
        self.ctx.tracker.on_outcome(&self.key, outcome, now);
    }
}

/// Passes the response body through untouched, except that on a failure it edits the gRPC
/// trailers (claim, pushback); at the end it records the outcome.
pub(super) struct Tee {
    pub(super) inner: Incoming,
    pub(super) watch: Option<Watch>,
    pub(super) done: bool,
}

impl Body for Tee {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let r = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(r) => r,
        };
        match r {
            Some(Ok(frame)) => {
                let frame = match frame.into_trailers() {
                    Ok(mut t) => {
                        if let Some(w) = this.watch.as_mut()
                            && w.grpc
                        {
                            w.grpc_status = policy::grpc_status(&t).or(w.grpc_status);
                            if let Some(c) = policy::claim_of(&t) {
                                w.claim = c;
                            }
                            if w.grpc_status.is_some_and(|s| s != 0) {
                                annotate_failure(&mut t, w.stamp, w.pushback);
                            }
                        }
                        Frame::trailers(t)
                    }
                    Err(frame) => frame,
                };
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(e)) => {
                if let Some(w) = this.watch.take() {
                    w.commit(true);
                }
                this.done = true;
                Poll::Ready(Some(Err(e)))
            }
            None => {
                if let Some(w) = this.watch.take() {
                    w.commit(false);
                }
                this.done = true;
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Tee {
    /// hyper stops polling a body once it has written the announced length (or sees
    /// `is_end_stream`), so the end is often observed only here: record the outcome then. This runs
    /// before the client can read the last bytes, so its retry always finds the failure.
    fn drop(&mut self) {
        if let Some(w) = self.watch.take() {
            w.commit(false);
        }
    }
}
