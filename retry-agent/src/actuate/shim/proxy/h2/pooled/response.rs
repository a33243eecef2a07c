//! The callee's side of a caller's relay: what its pooled connections hand it (response
//! blocks read by the policy and re-encoded for the caller, DATA within the caller's windows,
//! resets, the caller's window given back), in the order the callee sent it.
use super::{
    super::{
        super::bump,
        fields::Fields,
        frame::{self, REFUSED_STREAM},
        response::{Read, read_response, record_outcome},
    },
    Client, Event, Queued, flush_queue,
};

impl Client {
    /// What the pooled connections handed this client.
    pub(super) fn on_events(&mut self) {
        // Swapped with the last batch's emptied vector: no allocation per batch.
        let mut events = std::mem::take(&mut self.events);
        std::mem::swap(&mut events, &mut *self.inbox.events.lock());
        for e in events.drain(..) {
            match e {
                Event::Head {
                    stream,
                    fields,
                    end,
                } => self.response_block(stream, &fields, end),
                Event::Data {
                    stream,
                    data,
                    end,
                    flow,
                } => {
                    let Some(s) = self.streams.get_mut(&stream) else {
                        continue;
                    };
                    s.pending.push_back(Queued::Data { data, end, flow });
                    if end {
                        s.resp_ended = true;
                        if let Some(st) = s.policy.take() {
                            record_outcome(&self.ctx, &self.info, st, false);
                        }
                    }
                    self.flush(stream);
                }
                Event::Reset { stream, code } => {
                    let Some(s) = self.streams.remove(&stream) else {
                        continue;
                    };
                    frame::put_rst(&mut self.out, stream, code);
                    if code == REFUSED_STREAM {
                        bump(&self.ctx.stats.h2_refused);
                    }
                    if !s.resp_ended
                        && let Some(st) = s.policy
                    {
                        record_outcome(&self.ctx, &self.info, st, true);
                    }
                }
                Event::Credit { stream, n } => {
                    if self.streams.get(&stream).is_some_and(|s| !s.req_ended) {
                        frame::put_window_update(&mut self.out, stream, n);
                    }
                }
            }
        }
        self.events = events;
    }

    /// A response block for `stream`: read by the policy, re-encoded for the client.
    fn response_block(&mut self, stream: u32, fields: &Fields, end: bool) {
        let Some(s) = self.streams.get_mut(&stream) else {
            return;
        };
        let mut block = fields.encode();
        let mut informational = false;
        if let Some(st) = s.policy.as_mut() {
            match read_response(&self.ctx, &self.info, st, fields) {
                Read::Annotate(extra) => block.extend_from_slice(&extra),
                Read::Informational => informational = true,
                Read::Pass => {}
            }
        }
        s.pending.push_back(Queued::Block(block, end));
        if end && !informational {
            s.resp_ended = true;
            if let Some(st) = s.policy.take() {
                record_outcome(&self.ctx, &self.info, st, false);
            }
        }
        self.flush(stream);
    }

    /// Sends what `stream` has waiting, within the client's windows; gives the callee its
    /// window back for what went.
    pub(super) fn flush(&mut self, stream: u32) {
        let Some(s) = self.streams.get_mut(&stream) else {
            return;
        };
        let credit = flush_queue(
            &mut self.out,
            stream,
            &mut s.pending,
            &mut s.window,
            &mut self.conn_window,
        );
        if !s.pending.is_empty() && !self.blocked.contains(&stream) {
            self.blocked.push_back(stream);
        }
        s.mux.credit(s.id, credit);
        self.close_if_done(stream);
    }

    pub(super) fn flush_blocked(&mut self) {
        for _ in 0..self.blocked.len() {
            if let Some(s) = self.blocked.pop_front() {
                self.flush(s);
            }
        }
    }
}
