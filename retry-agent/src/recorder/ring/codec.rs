//! The byte layout of the ring's records: a header (length, kind, charge, time), then, for a
//! data event, its fields and its payload; for a kernel summary, its status, both messages'
//! fields and its request line; for an exchange, its fields (`exchange`). Other records are
//! held as structs; their header alone marks their place among the bytes.
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

pub(super) use self::exchange::{decode_exchange, put_exchange};
use crate::capture::{ConnId, DataEvent, Direction, Role, SummaryEvent, Syscall, Tuple};

mod exchange;

/// Record header: total length (u32), kind (u8), charge (u32), time (u64).
pub(super) const HEADER: usize = 17;

pub(super) const KIND_DATA: u8 = 0;
pub(super) const KIND_EXCHANGE: u8 = 1;
pub(super) const KIND_OTHER: u8 = 2;
pub(super) const KIND_SUMMARY: u8 = 3;

const HAS_TUPLE: u8 = 1;
const HAS_GOID: u8 = 2;
/// The entry time differs from the exit time (TLS records; a syscall's are the same clock read).
const HAS_ENTER: u8 = 4;
/// The thread's process is not the connection's.
const HAS_PID: u8 = 8;
/// `DataEvent::interleaved`.
const INTERLEAVED: u8 = 16;

/// Every [`Syscall`], indexed by its discriminant (checked by a test).
pub(super) const SYSCALLS: [Syscall; 15] = [
    Syscall::Read,
    Syscall::Write,
    Syscall::Readv,
    Syscall::Writev,
    Syscall::Sendto,
    Syscall::Recvfrom,
    Syscall::Sendmsg,
    Syscall::Recvmsg,
    Syscall::Sendmmsg,
    Syscall::Recvmmsg,
    Syscall::Sendfile,
    Syscall::Splice,
    Syscall::SslWrite,
    Syscall::SslRead,
    Syscall::Other,
];

#[derive(Clone, Copy)]
pub(super) struct Header {
    pub(super) len: usize,
    pub(super) kind: u8,
    pub(super) charge: usize,
    pub(super) ts_ns: u64,
}

impl Header {
    fn bytes(self) -> [u8; HEADER] {
        let mut h = [0u8; HEADER];
        // Records are far below 4 GiB (a block, or one capture's payload).
        h[..4].copy_from_slice(&(self.len as u32).to_le_bytes());
        h[4] = self.kind;
        h[5..9].copy_from_slice(&(self.charge as u32).to_le_bytes());
        h[9..].copy_from_slice(&self.ts_ns.to_le_bytes());
        h
    }

    pub(super) fn put(self, buf: &mut Vec<u8>) {
        buf.extend_from_slice(&self.bytes());
    }

    /// Writes over the header at the start of `at` (a data record learns its length once
    /// redacted).
    pub(super) fn overwrite(self, at: &mut [u8]) {
        if let Some(h) = at.get_mut(..HEADER) {
            h.copy_from_slice(&self.bytes());
        }
    }

    pub(super) fn read(b: &[u8]) -> Option<Header> {
        let mut r = Reader(b);
        let len = r.u32()? as usize;
        let kind = r.u8()?;
        let charge = r.u32()? as usize;
        let ts_ns = r.u64()?;
        // A record is at least its header: a shorter length could not move the walk forward.
        (len >= HEADER).then_some(Header {
            len,
            kind,
            charge,
            ts_ns,
        })
    }
}

fn addr_len(a: &SocketAddr) -> usize {
    match a {
        SocketAddr::V4(_) => 1 + 4 + 2,
        SocketAddr::V6(_) => 1 + 16 + 2 + 4 + 4,
    }
}

/// Encoded size of a data event's fields before its payload. Its exit time is the header's.
pub(super) fn meta_len(d: &DataEvent) -> usize {
    let fixed = 16 + 4 + 4 + 8;
    fixed
        + if d.ts_enter_ns != d.ts_exit_ns { 8 } else { 0 }
        + if d.pid != d.conn.pid { 4 } else { 0 }
        + d.goid.map_or(0, |_| 8)
        + d.tuple
            .as_ref()
            .map_or(0, |t| addr_len(&t.local) + addr_len(&t.remote))
}

/// A data event's fields; its exit time goes in the record's header, whose time it is.
pub(super) fn put_meta(buf: &mut Vec<u8>, d: &DataEvent) {
    buf.extend_from_slice(&d.conn.pid.to_le_bytes());
    buf.extend_from_slice(&d.conn.fd.to_le_bytes());
    buf.extend_from_slice(&d.conn.generation.to_le_bytes());
    put_fields(buf, d, true);
}

/// A data event's fields after its connection: with its tuple or (`tuple` false: a summary's
/// answer, whose connection and tuple are its request's) without.
fn put_fields(buf: &mut Vec<u8>, d: &DataEvent, tuple: bool) {
    let (enter, pid) = (d.ts_enter_ns != d.ts_exit_ns, d.pid != d.conn.pid);
    let tuple = d.tuple.as_ref().filter(|_| tuple);
    let flags = if tuple.is_some() { HAS_TUPLE } else { 0 }
        | if d.goid.is_some() { HAS_GOID } else { 0 }
        | if enter { HAS_ENTER } else { 0 }
        | if pid { HAS_PID } else { 0 }
        | if d.interleaved { INTERLEAVED } else { 0 };
    buf.extend_from_slice(&[d.role as u8, d.direction as u8, d.syscall as u8, flags]);
    buf.extend_from_slice(&d.tid.to_le_bytes());
    buf.extend_from_slice(&d.len.to_le_bytes());
    if pid {
        buf.extend_from_slice(&d.pid.to_le_bytes());
    }
    if enter {
        buf.extend_from_slice(&d.ts_enter_ns.to_le_bytes());
    }
    if let Some(g) = d.goid {
        buf.extend_from_slice(&g.to_le_bytes());
    }
    if let Some(t) = tuple {
        put_addr(buf, &t.local);
        put_addr(buf, &t.remote);
    }
}

fn put_addr(buf: &mut Vec<u8>, a: &SocketAddr) {
    match a {
        SocketAddr::V4(a) => {
            buf.push(4);
            buf.extend_from_slice(&a.ip().octets());
            buf.extend_from_slice(&a.port().to_le_bytes());
        }
        SocketAddr::V6(a) => {
            buf.push(6);
            buf.extend_from_slice(&a.ip().octets());
            buf.extend_from_slice(&a.port().to_le_bytes());
            buf.extend_from_slice(&a.flowinfo().to_le_bytes());
            buf.extend_from_slice(&a.scope_id().to_le_bytes());
        }
    }
}

/// Most a summary's encoding takes (header excluded): status, request exit time, both
/// messages' fields whole, the request's bytes. `put_summary` writes fewer when the answer
/// shares its request's connection; the ring reads the length it wrote, so a bound is enough
/// and the two are not compared twice per summary.
pub(super) fn summary_len(s: &SummaryEvent) -> usize {
    2 + 8 + meta_len(&s.request) + 1 + 4 + meta_len(&s.response) + s.request.payload.len()
}

/// The marker byte after a summary's request: its answer shares the request's connection
/// (`same_conn`), and a weight other than 1 follows (4 bytes).
const SAME_CONN: u8 = 1;
const WEIGHTED: u8 = 2;

/// Whether a summary's answer has its request's connection and tuple (always, but for a
/// connection whose tuple the kernel learnt between the two): then they are kept once, the
/// commonest record under load 16 bytes and two addresses shorter.
fn same_conn(s: &SummaryEvent) -> bool {
    s.request.conn == s.response.conn && s.request.tuple == s.response.tuple
}

/// A summary's fields (the response's exit time is the header's), then its request's bytes.
pub(super) fn put_summary(buf: &mut Vec<u8>, s: &SummaryEvent) {
    buf.extend_from_slice(&s.status.to_le_bytes());
    buf.extend_from_slice(&s.request.ts_exit_ns.to_le_bytes());
    put_meta(buf, &s.request);
    let same = same_conn(s);
    let weighted = s.weight != 1;
    buf.push(if same { SAME_CONN } else { 0 } | if weighted { WEIGHTED } else { 0 });
    if weighted {
        buf.extend_from_slice(&s.weight.to_le_bytes());
    }
    if same {
        put_fields(buf, &s.response, false);
    } else {
        put_meta(buf, &s.response);
    }
    buf.extend_from_slice(&s.request.payload);
}

/// A summary from its encoding (header excluded) and its header's time.
pub(super) fn decode_summary(ts_exit_ns: u64, b: &[u8]) -> Option<SummaryEvent> {
    let mut r = Reader(b);
    let status = r.u16()?;
    let request_exit = r.u64()?;
    let request = read_meta(&mut r, request_exit)?;
    let marker = r.u8()?;
    if marker & !(SAME_CONN | WEIGHTED) != 0 {
        return None;
    }
    let weight = if marker & WEIGHTED != 0 { r.u32()? } else { 1 };
    let response = if marker & SAME_CONN != 0 {
        DataEvent {
            tuple: request.tuple,
            ..read_fields(&mut r, request.conn, ts_exit_ns)?
        }
    } else {
        read_meta(&mut r, ts_exit_ns)?
    };
    Some(SummaryEvent {
        request: DataEvent {
            payload: bytes::Bytes::copy_from_slice(r.0),
            ..request
        },
        response,
        status,
        weight,
    })
}

/// A data event from its encoding (header excluded) and its header's time.
pub(super) fn decode_data(ts_exit_ns: u64, b: &[u8]) -> Option<DataEvent> {
    let mut r = Reader(b);
    let d = read_meta(&mut r, ts_exit_ns)?;
    Some(DataEvent {
        payload: bytes::Bytes::copy_from_slice(r.0),
        ..d
    })
}

/// A data event's fields (payload empty), read from `r`.
fn read_meta(r: &mut Reader<'_>, ts_exit_ns: u64) -> Option<DataEvent> {
    let conn = ConnId {
        pid: r.u32()?,
        fd: r.u32()?,
        generation: r.u64()?,
    };
    read_fields(r, conn, ts_exit_ns)
}

/// What `put_fields` wrote, of a data event on `conn` (no tuple unless it wrote one).
fn read_fields(r: &mut Reader<'_>, conn: ConnId, ts_exit_ns: u64) -> Option<DataEvent> {
    let role = match r.u8()? {
        0 => Role::Client,
        1 => Role::Server,
        _ => Role::Unknown,
    };
    let direction = match r.u8()? {
        0 => Direction::Egress,
        _ => Direction::Ingress,
    };
    let syscall = *SYSCALLS.get(usize::from(r.u8()?))?;
    let flags = r.u8()?;
    let (tid, len) = (r.u32()?, r.u64()?);
    let pid = if flags & HAS_PID != 0 {
        r.u32()?
    } else {
        conn.pid
    };
    let ts_enter_ns = if flags & HAS_ENTER != 0 {
        r.u64()?
    } else {
        ts_exit_ns
    };
    let interleaved = flags & INTERLEAVED != 0;
    let goid = if flags & HAS_GOID != 0 {
        Some(r.u64()?)
    } else {
        None
    };
    let tuple = if flags & HAS_TUPLE != 0 {
        Some(Tuple {
            local: r.addr()?,
            remote: r.addr()?,
        })
    } else {
        None
    };
    Some(DataEvent {
        conn,
        role,
        direction,
        syscall,
        tuple,
        pid,
        tid,
        goid,
        interleaved,
        ts_enter_ns,
        ts_exit_ns,
        len,
        payload: bytes::Bytes::new(),
    })
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (a, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*a)
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.take::<1>()?[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }

    fn addr(&mut self) -> Option<SocketAddr> {
        match self.u8()? {
            4 => {
                let ip = Ipv4Addr::from(self.take::<4>()?);
                Some(SocketAddr::V4(SocketAddrV4::new(ip, self.u16()?)))
            }
            6 => {
                let ip = Ipv6Addr::from(self.take::<16>()?);
                let port = self.u16()?;
                let (flow, scope) = (self.u32()?, self.u32()?);
                Some(SocketAddr::V6(SocketAddrV6::new(ip, port, flow, scope)))
            }
            _ => None,
        }
    }
}
