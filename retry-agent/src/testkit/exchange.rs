//! [`ExchangeBuilder`]: hand-made [`Exchange`]s for the engine's tests, the simulator and the
//! correlate benchmark.
use std::net::SocketAddr;

use crate::{
    capture::{ConnId, Role},
    l7::{Claim, Exchange, ExchangeId, Failure, Method, OutcomeClass, Protocol, RetryMarkers},
};

/// Builds [`Exchange`]s for tests and simulations.
#[derive(Clone, Debug)]
pub struct ExchangeBuilder(Exchange);

/// Outcome class the l7 classifier gives an HTTP status.
pub fn class_of_status(status: u16) -> OutcomeClass {
    match status {
        100..=399 => OutcomeClass::Success,
        429 => OutcomeClass::Overload,
        400..=499 => OutcomeClass::Semantic,
        _ => OutcomeClass::Transient,
    }
}

impl ExchangeBuilder {
    #[expect(
        clippy::too_many_arguments,
        reason = "private; `server` and `client` name the roles"
    )]
    fn new(
        role: Role,
        id: u64,
        pid: u32,
        tid: u32,
        local: SocketAddr,
        remote: SocketAddr,
        start: u64,
        end: u64,
    ) -> Self {
        ExchangeBuilder(Exchange {
            id: ExchangeId(id),
            conn: ConnId {
                pid,
                fd: 3,
                generation: id,
            },
            role,
            protocol: Protocol::Http1,
            stream_id: None,
            local: Some(local),
            remote: Some(remote),
            pid,
            tid,
            response_tid: None,
            goid: None,
            request_start_ns: start,
            request_end_ns: start + (end.saturating_sub(start)) / 4,
            response_start_ns: Some(end.saturating_sub((end.saturating_sub(start)) / 4)),
            response_end_ns: Some(end),
            method: Some(Method::Get),
            authority: Some(remote.to_string().into()),
            path: Some("/work".into()),
            route: Some("/work".into()),
            status: Some(200),
            grpc_status: None,
            outcome: OutcomeClass::Success,
            failure: None,
            idempotent: true,
            idempotency_key: false,
            retry_markers: RetryMarkers::default(),
            trace_id: None,
            retry_after: false,
            claim_header: None,
            body_hash: None,
            query_hash: None,
            unknown: false,
            request_bytes: 100,
            response_bytes: 100,
            sole_on_thread: false,
            handler_start_ns: None,
            handler_end_ns: None,
            threads_multiplexed: false,
            ended_ns: None,
            weight: 1,
            tally: false,
        })
    }

    /// A summary standing for `w` quiet exchanges of its connection.
    pub fn weight(mut self, w: u32) -> Self {
        self.0.weight = w;
        self
    }

    /// A tally of `n` quiet exchanges counted on its connection.
    pub fn tally(mut self, n: u32) -> Self {
        self.0.weight = n;
        self.0.tally = true;
        self
    }

    /// An inbound exchange: `pid` read a request on `tid` at `local` from `remote`.
    pub fn server(
        id: u64,
        pid: u32,
        tid: u32,
        local: SocketAddr,
        remote: SocketAddr,
        start: u64,
        end: u64,
    ) -> Self {
        Self::new(Role::Server, id, pid, tid, local, remote, start, end)
    }

    /// An outbound exchange: `pid` wrote a request on `tid` from `local` to `remote`.
    pub fn client(
        id: u64,
        pid: u32,
        tid: u32,
        local: SocketAddr,
        remote: SocketAddr,
        start: u64,
        end: u64,
    ) -> Self {
        Self::new(Role::Client, id, pid, tid, local, remote, start, end)
    }

    pub fn status(mut self, status: u16) -> Self {
        self.0.status = Some(status);
        self.0.outcome = class_of_status(status);
        self
    }

    /// No response: the connection failed this way.
    pub fn failure(mut self, f: Failure) -> Self {
        self.0.failure = Some(f);
        self.0.status = None;
        self.0.response_start_ns = None;
        self.0.response_end_ns = None;
        self.0.outcome = match f {
            Failure::ConnectRefused | Failure::ConnectTimeout | Failure::Reset => {
                OutcomeClass::Transient
            }
            _ => OutcomeClass::Unknown,
        };
        self
    }

    /// The caller gave it up at `t` (its close or cancel), before any response.
    pub fn given_up_at(self, t: u64) -> Self {
        let mut b = self.failure(Failure::Abandoned);
        b.0.ended_ns = Some(t);
        b
    }

    /// The request was fully read (server) or written (client) at `t`.
    pub fn request_done(mut self, t: u64) -> Self {
        self.0.request_end_ns = t;
        self
    }

    /// The first response byte was written (server) or read (client) at `t`.
    pub fn response_from(mut self, t: u64) -> Self {
        self.0.response_start_ns = Some(t);
        self
    }

    /// Ends at `end` (for failures, which have no response end).
    pub fn request_end(mut self, end: u64) -> Self {
        self.0.request_end_ns = end;
        self
    }

    pub fn method(mut self, m: Method) -> Self {
        self.0.idempotent = m.is_idempotent() || self.0.idempotency_key;
        self.0.method = Some(m);
        self
    }

    pub fn route(mut self, r: &str) -> Self {
        self.0.route = Some(r.into());
        self.0.path = Some(r.into());
        self
    }

    pub fn idempotency_key(mut self) -> Self {
        self.0.idempotency_key = true;
        self.0.idempotent = true;
        self
    }

    pub fn claim_header(mut self, c: Claim) -> Self {
        self.0.claim_header = Some(c);
        self
    }

    pub fn markers(mut self, m: RetryMarkers) -> Self {
        self.0.retry_markers = m;
        self
    }

    /// The server's thread had no other request in flight when it answered (see
    /// `Exchange::sole_on_thread`).
    pub fn sole_on_thread(mut self) -> Self {
        self.0.sole_on_thread = true;
        self
    }

    pub fn goid(mut self, g: u64) -> Self {
        self.0.goid = Some(g);
        self
    }

    /// HTTP/2, on a connection whose streams several threads wrote at once.
    pub fn threads_multiplexed(mut self) -> Self {
        self.0.protocol = crate::l7::Protocol::Http2;
        self.0.threads_multiplexed = true;
        self
    }

    pub fn response_tid(mut self, t: u32) -> Self {
        self.0.response_tid = Some(t);
        self
    }

    pub fn query_hash(mut self, h: u64) -> Self {
        self.0.query_hash = Some(h);
        self
    }

    /// The propagated trace id (its hash, as l7 keeps it).
    pub fn trace_id(mut self, h: u64) -> Self {
        self.0.trace_id = Some(h);
        self
    }

    pub fn body_hash(mut self, h: u64) -> Self {
        self.0.body_hash = Some(h);
        self
    }

    pub fn build(self) -> Exchange {
        self.0
    }
}
