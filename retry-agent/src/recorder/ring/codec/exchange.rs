//! An exchange's bytes in the ring: a word saying which optional fields follow and the flags,
//! then the fields in a fixed order, fixed-width little-endian, strings led by their length.
//! A typical exchange takes ~150 bytes instead of its 440-byte struct (and no string of its own
//! on the heap), so the same bound holds ~1.5× the history of a keep-alive load.
use super::{Reader, put_addr};
use crate::{
    capture::{ConnId, Role},
    l7::{
        Claim, Exchange, ExchangeId, Failure, Method, OutcomeClass, Protocol, RetryMarkers, Text,
    },
};

// Bits of the leading word: one per optional field (set: the field follows), then the flags.
const STREAM_ID: u32 = 1;
const LOCAL: u32 = 1 << 1;
const REMOTE: u32 = 1 << 2;
const RESPONSE_TID: u32 = 1 << 3;
const GOID: u32 = 1 << 4;
const RESPONSE_START: u32 = 1 << 5;
const RESPONSE_END: u32 = 1 << 6;
const METHOD: u32 = 1 << 7;
const AUTHORITY: u32 = 1 << 8;
const PATH: u32 = 1 << 9;
const QUERY_HASH: u32 = 1 << 10;
const ROUTE: u32 = 1 << 11;
const STATUS: u32 = 1 << 12;
const GRPC_STATUS: u32 = 1 << 13;
const FAILURE: u32 = 1 << 14;
const ENVOY_ATTEMPT: u32 = 1 << 15;
const RETRY_ATTEMPT: u32 = 1 << 16;
const GRPC_PREVIOUS: u32 = 1 << 17;
const TRACE_ID: u32 = 1 << 18;
const CLAIM: u32 = 1 << 19;
const BODY_HASH: u32 = 1 << 20;
const HANDLER_START: u32 = 1 << 21;
const HANDLER_END: u32 = 1 << 22;
const ENDED: u32 = 1 << 23;
const IDEMPOTENT: u32 = 1 << 24;
const IDEMPOTENCY_KEY: u32 = 1 << 25;
const RETRY_AFTER: u32 = 1 << 26;
const UNKNOWN: u32 = 1 << 27;
const SOLE_ON_THREAD: u32 = 1 << 28;
const THREADS_MULTIPLEXED: u32 = 1 << 29;
const WEIGHT: u32 = 1 << 30;
const TALLY: u32 = 1 << 31;

/// Appends `x`'s encoding to `buf`.
pub(in crate::recorder::ring) fn put_exchange(buf: &mut Vec<u8>, x: &Exchange) {
    // Every field named, none skipped with `..`: a field added to `Exchange` does not compile
    // here until the ring keeps it too.
    let Exchange {
        id,
        conn,
        role,
        protocol,
        stream_id,
        local,
        remote,
        pid,
        tid,
        response_tid,
        goid,
        request_start_ns,
        request_end_ns,
        response_start_ns,
        response_end_ns,
        method,
        authority,
        path,
        query_hash,
        route,
        status,
        grpc_status,
        outcome,
        failure,
        idempotent,
        idempotency_key,
        retry_markers:
            RetryMarkers {
                envoy_attempt_count,
                retry_attempt,
                grpc_previous_attempts,
            },
        trace_id,
        retry_after,
        claim_header,
        body_hash,
        unknown,
        request_bytes,
        response_bytes,
        sole_on_thread,
        handler_start_ns,
        handler_end_ns,
        threads_multiplexed,
        ended_ns,
        weight,
        tally,
    } = x;
    let word_at = buf.len();
    buf.extend_from_slice(&[0; 4]);
    let mut w = Writer { buf, word: 0 };
    w.u64(id.0);
    w.u32(conn.pid);
    w.u32(conn.fd);
    w.u64(conn.generation);
    w.buf
        .extend_from_slice(&[*role as u8, *protocol as u8, *outcome as u8]);
    w.u32(*pid);
    w.u32(*tid);
    w.u64(*request_start_ns);
    w.u64(*request_end_ns);
    w.u64(*request_bytes);
    w.u64(*response_bytes);
    w.opt(STREAM_ID, *stream_id, Writer::u32);
    w.opt(LOCAL, local.as_ref(), |w, a| put_addr(w.buf, a));
    w.opt(REMOTE, remote.as_ref(), |w, a| put_addr(w.buf, a));
    w.opt(RESPONSE_TID, *response_tid, Writer::u32);
    w.opt(GOID, *goid, Writer::u64);
    w.opt(RESPONSE_START, *response_start_ns, Writer::u64);
    w.opt(RESPONSE_END, *response_end_ns, Writer::u64);
    w.opt(METHOD, method.as_ref(), |w, m| match method_code(m) {
        Ok(code) => w.buf.push(code),
        Err(other) => {
            w.buf.push(METHOD_OTHER);
            w.str(other);
        }
    });
    w.opt(AUTHORITY, authority.as_ref(), |w, s| w.str(s));
    w.opt(PATH, path.as_ref(), |w, s| w.str(s));
    w.opt(QUERY_HASH, *query_hash, Writer::u64);
    w.opt(ROUTE, route.as_ref(), |w, s| w.str(s));
    w.opt(STATUS, *status, |w, s| {
        w.buf.extend_from_slice(&s.to_le_bytes())
    });
    w.opt(GRPC_STATUS, *grpc_status, Writer::u32);
    w.opt(FAILURE, *failure, |w, f| {
        let (code, arg) = failure_code(f);
        w.buf.push(code);
        w.u32(arg);
    });
    w.opt(ENVOY_ATTEMPT, *envoy_attempt_count, Writer::u32);
    w.opt(RETRY_ATTEMPT, *retry_attempt, Writer::u32);
    w.opt(GRPC_PREVIOUS, *grpc_previous_attempts, Writer::u32);
    w.opt(TRACE_ID, *trace_id, Writer::u64);
    w.opt(CLAIM, *claim_header, |w, c| w.buf.push(c as u8));
    w.opt(BODY_HASH, *body_hash, Writer::u64);
    w.opt(HANDLER_START, *handler_start_ns, Writer::u64);
    w.opt(HANDLER_END, *handler_end_ns, Writer::u64);
    w.opt(ENDED, *ended_ns, Writer::u64);
    w.opt(WEIGHT, (*weight != 1).then_some(*weight), Writer::u32);
    for (set, bit) in [
        (*idempotent, IDEMPOTENT),
        (*idempotency_key, IDEMPOTENCY_KEY),
        (*retry_after, RETRY_AFTER),
        (*unknown, UNKNOWN),
        (*sole_on_thread, SOLE_ON_THREAD),
        (*threads_multiplexed, THREADS_MULTIPLEXED),
        (*tally, TALLY),
    ] {
        if set {
            w.word |= bit;
        }
    }
    let word = w.word.to_le_bytes();
    if let Some(at) = buf.get_mut(word_at..word_at + 4) {
        at.copy_from_slice(&word);
    }
}

/// An exchange from its encoding (`None` if it is not one).
pub(in crate::recorder::ring) fn decode_exchange(b: &[u8]) -> Option<Exchange> {
    let mut r = Reader(b);
    let word = r.u32()?;
    let has = |bit: u32| word & bit != 0;
    let id = ExchangeId(r.u64()?);
    let conn = ConnId {
        pid: r.u32()?,
        fd: r.u32()?,
        generation: r.u64()?,
    };
    let role = *ROLES.get(usize::from(r.u8()?))?;
    let protocol = *PROTOCOLS.get(usize::from(r.u8()?))?;
    let outcome = *OutcomeClass::ALL.get(usize::from(r.u8()?))?;
    let (pid, tid) = (r.u32()?, r.u32()?);
    let (request_start_ns, request_end_ns) = (r.u64()?, r.u64()?);
    let (request_bytes, response_bytes) = (r.u64()?, r.u64()?);
    // `Some(read)` when the field is present, `None` when not; `?` on a short record.
    macro_rules! opt {
        ($bit:expr, $read:expr) => {
            if has($bit) { Some($read?) } else { None }
        };
    }
    let stream_id = opt!(STREAM_ID, r.u32());
    let local = opt!(LOCAL, r.addr());
    let remote = opt!(REMOTE, r.addr());
    let response_tid = opt!(RESPONSE_TID, r.u32());
    let goid = opt!(GOID, r.u64());
    let response_start_ns = opt!(RESPONSE_START, r.u64());
    let response_end_ns = opt!(RESPONSE_END, r.u64());
    let method = opt!(METHOD, read_method(&mut r));
    let authority = opt!(AUTHORITY, r.text());
    let path = opt!(PATH, r.text());
    let query_hash = opt!(QUERY_HASH, r.u64());
    let route = opt!(ROUTE, r.text());
    let status = opt!(STATUS, r.u16());
    let grpc_status = opt!(GRPC_STATUS, r.u32());
    let failure = opt!(FAILURE, read_failure(&mut r));
    let retry_markers = RetryMarkers {
        envoy_attempt_count: opt!(ENVOY_ATTEMPT, r.u32()),
        retry_attempt: opt!(RETRY_ATTEMPT, r.u32()),
        grpc_previous_attempts: opt!(GRPC_PREVIOUS, r.u32()),
    };
    let trace_id = opt!(TRACE_ID, r.u64());
    let claim_header = opt!(CLAIM, CLAIMS.get(usize::from(r.u8()?)).copied());
    let body_hash = opt!(BODY_HASH, r.u64());
    let handler_start_ns = opt!(HANDLER_START, r.u64());
    let handler_end_ns = opt!(HANDLER_END, r.u64());
    let ended_ns = opt!(ENDED, r.u64());
    let weight = opt!(WEIGHT, r.u32()).unwrap_or(1);
    // A record is exactly its fields: anything left over says it was not an exchange.
    r.0.is_empty().then_some(Exchange {
        id,
        conn,
        role,
        protocol,
        stream_id,
        local,
        remote,
        pid,
        tid,
        response_tid,
        goid,
        request_start_ns,
        request_end_ns,
        response_start_ns,
        response_end_ns,
        method,
        authority,
        path,
        query_hash,
        route,
        status,
        grpc_status,
        outcome,
        failure,
        idempotent: has(IDEMPOTENT),
        idempotency_key: has(IDEMPOTENCY_KEY),
        retry_markers,
        trace_id,
        retry_after: has(RETRY_AFTER),
        claim_header,
        body_hash,
        unknown: has(UNKNOWN),
        request_bytes,
        response_bytes,
        sole_on_thread: has(SOLE_ON_THREAD),
        handler_start_ns,
        handler_end_ns,
        threads_multiplexed: has(THREADS_MULTIPLEXED),
        ended_ns,
        weight,
        tally: has(TALLY),
    })
}

struct Writer<'a> {
    buf: &'a mut Vec<u8>,
    word: u32,
}

impl Writer<'_> {
    fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// A string of at most `u16::MAX` bytes (l7 bounds every one far below), cut at a
    /// character boundary if ever longer.
    fn str(&mut self, s: &str) {
        let mut n = s.len().min(usize::from(u16::MAX));
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        let s = s.get(..n).unwrap_or_default();
        self.buf.extend_from_slice(&(n as u16).to_le_bytes());
        self.buf.extend_from_slice(s.as_bytes());
    }

    /// An optional field: its bit set and its value written when present.
    fn opt<T>(&mut self, bit: u32, v: Option<T>, put: impl FnOnce(&mut Self, T)) {
        if let Some(v) = v {
            self.word |= bit;
            put(self, v);
        }
    }
}

impl Reader<'_> {
    fn text(&mut self) -> Option<Text> {
        let n = usize::from(self.u16()?);
        let (s, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        std::str::from_utf8(s).ok().map(Text::new)
    }
}

// Fieldless enums are written as their discriminants and read back through these tables, in
// declaration order (the round-trip test covers every value).
const ROLES: [Role; 3] = [Role::Client, Role::Server, Role::Unknown];
const PROTOCOLS: [Protocol; 3] = [Protocol::Http1, Protocol::Http2, Protocol::Opaque];
const CLAIMS: [Claim; 3] = [Claim::Claimed, Claim::Unclaimed, Claim::Missing];
const METHODS: [Method; 9] = [
    Method::Get,
    Method::Head,
    Method::Post,
    Method::Put,
    Method::Delete,
    Method::Patch,
    Method::Options,
    Method::Connect,
    Method::Trace,
];
const METHOD_OTHER: u8 = METHODS.len() as u8;

/// A method's code, or the text of one outside the closed set.
fn method_code(m: &Method) -> Result<u8, &str> {
    Ok(match m {
        Method::Get => 0,
        Method::Head => 1,
        Method::Post => 2,
        Method::Put => 3,
        Method::Delete => 4,
        Method::Patch => 5,
        Method::Options => 6,
        Method::Connect => 7,
        Method::Trace => 8,
        Method::Other(t) => return Err(t),
    })
}

fn read_method(r: &mut Reader<'_>) -> Option<Method> {
    match r.u8()? {
        METHOD_OTHER => r.text().map(Method::Other),
        code => METHODS.get(usize::from(code)).cloned(),
    }
}

fn failure_code(f: Failure) -> (u8, u32) {
    match f {
        Failure::ConnectRefused => (0, 0),
        Failure::ConnectTimeout => (1, 0),
        Failure::Reset => (2, 0),
        Failure::ResetMidResponse => (3, 0),
        Failure::ClosedNoResponse => (4, 0),
        Failure::RstStream(code) => (5, code),
        Failure::GoAway(code) => (6, code),
        Failure::Abandoned => (7, 0),
    }
}

fn read_failure(r: &mut Reader<'_>) -> Option<Failure> {
    let (code, arg) = (r.u8()?, r.u32()?);
    Some(match code {
        0 => Failure::ConnectRefused,
        1 => Failure::ConnectTimeout,
        2 => Failure::Reset,
        3 => Failure::ResetMidResponse,
        4 => Failure::ClosedNoResponse,
        5 => Failure::RstStream(arg),
        6 => Failure::GoAway(arg),
        7 => Failure::Abandoned,
        _ => return None,
    })
}
