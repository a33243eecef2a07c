//! The callee's side of the HTTP/1 relay: response heads read for the status and claim, a
//! failure's head given the claim, bodies walked to where the response ends, its outcome
//! recorded there.
use std::time::Instant;

use bytes::{BufMut, BytesMut};
use http::StatusCode;

use super::{
    super::{outcome, stamp},
    MAX_FIELDS, MAX_HEAD, Relay, RespState,
    body::{Chunked, Framing},
    ends_with_chunked, settle,
};
use crate::{
    actuate::shim::policy,
    l7::{Claim, ERROR_CLAIM_HEADER},
};

impl Relay {
    pub(super) fn on_server(&mut self, buf: &mut BytesMut) {
        if self.readable()
            && let Err(why) = self.server_bytes(buf)
        {
            self.unreadable(why);
        }
        self.pass_rest(buf, false);
    }

    fn server_bytes(&mut self, buf: &mut BytesMut) -> Result<(), &'static str> {
        loop {
            if buf.is_empty() {
                return Ok(());
            }
            match &mut self.resp {
                RespState::Body(f) => {
                    let step = f.walk(buf, |_| {}).map_err(|_| "malformed response body")?;
                    self.to_client.extend_from_slice(&buf.split_to(step.used));
                    if !step.ended {
                        return Ok(());
                    }
                    self.resp = RespState::Head;
                    self.response_ended(false);
                }
                RespState::Head => {
                    if !self.response_head(buf)? {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// The response head at the front of `buf`. False: wait for more.
    fn response_head(&mut self, buf: &mut BytesMut) -> Result<bool, &'static str> {
        let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
        let mut resp = httparse::Response::new(&mut fields);
        let len = match resp.parse(buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD => return Ok(false),
            _ => return Err("response head"),
        };
        let code = resp.code.ok_or("status line")?;
        let status = StatusCode::from_u16(code).map_err(|_| "status")?;
        let field = |name: &str| {
            resp.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| h.value)
        };
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err("upgrade");
        }
        if status.is_informational() {
            // 100 Continue and friends: the final response follows.
            self.to_client.extend_from_slice(&buf.split_to(len));
            return Ok(true);
        }
        let claim_field = field(ERROR_CLAIM_HEADER);
        let has_claim = claim_field.is_some();
        let claim = claim_field.and_then(Claim::parse);
        let chunked = field("transfer-encoding").is_some_and(ends_with_chunked);
        let length = field("content-length")
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        // The response of the oldest request still waiting for one (local answers are never
        // in front: they go out as soon as they are).
        let Some(x) = self.queue.front_mut() else {
            return Err("a response nobody asked for");
        };
        let framing =
            if x.head || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
                Framing::None
            } else if chunked {
                Framing::Chunked(Chunked::start())
            } else if let Some(n) = length {
                Framing::Length(n)
            } else {
                Framing::UntilClose
            };
        x.status = Some(status);
        if let Some(c) = claim {
            x.claim = c;
        }
        settle(&self.ctx, &self.info, x);
        let head = buf.split_to(len);
        let failed = policy::status_is_failure(status);
        match stamp(&self.ctx, &self.info, failed, has_claim) {
            Some(stamp) => {
                // What the caller is told is what its retry is judged by (an unclaimed failure's
                // retry is answered here even without a decision).
                x.claim = stamp;
                // The claim goes in before the blank line that ends the head.
                let end = head.len().saturating_sub(2);
                self.to_client.extend_from_slice(&head[..end]);
                self.to_client.put_slice(ERROR_CLAIM_HEADER.as_bytes());
                self.to_client.put_slice(b": ");
                self.to_client.put_slice(stamp.as_str().as_bytes());
                self.to_client.put_slice(b"\r\n\r\n");
            }
            None => self.to_client.extend_from_slice(&head),
        }
        if !failed && x.watch {
            // Success: forget any earlier failure of this request.
            x.watch = false;
            self.ctx.tracker.on_outcome(&x.key, None, Instant::now());
        }
        if framing == Framing::None {
            self.response_ended(false);
        } else {
            self.resp = RespState::Body(framing);
        }
        Ok(true)
    }

    /// The front request's response ended (or was cut): its outcome is recorded.
    fn response_ended(&mut self, reset: bool) {
        let Some(mut x) = self.queue.pop_front() else {
            return;
        };
        settle(&self.ctx, &self.info, &mut x);
        if x.watch {
            let failed = x.status.is_none_or(policy::status_is_failure);
            let outcome = outcome(x.status, None, failed, reset, x.claim);
            self.ctx.tracker.on_outcome(&x.key, outcome, Instant::now());
        }
        self.flush_local();
    }

    /// The callee closed: a body that runs to the close has ended; what still waits was reset.
    pub(super) fn upstream_ended(&mut self) {
        if matches!(self.resp, RespState::Body(Framing::UntilClose)) {
            self.resp = RespState::Head;
            self.response_ended(false);
        }
        while self.queue.front().is_some_and(|x| x.local.is_none()) {
            self.response_ended(true);
        }
        self.flush_local();
    }
}
