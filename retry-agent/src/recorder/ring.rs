//! The flight recorder's ring, and what a record is charged against its byte bound.
//!
//! Data events (nearly every record) are encoded as bytes, header then redacted payload, into
//! blocks of [`BLOCK`] bytes: recording one is two appends to a block, and letting records go
//! is moving a block's start forward or freeing a block whole, unread (per-block counts). Held
//! as structs (a 272-byte ring slot each, payloads in reference-counted buffers), storing and
//! evicting them was 13% of the agent's CPU under a keep-alive load and the buffers' atomic
//! counts another 4%; now ~6%, and a data record takes ~80 bytes before its payload, so the same
//! bound keeps 1.6× the history.
//!
//! Exchanges (one per request) and the rare other records (connection events, verdicts,
//! decisions, ticks) stay structs, in rings of their own in the same order; the byte ring holds
//! a marker for each, so the order of all records is the byte ring's.
use std::{
    collections::{VecDeque, vec_deque},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6},
};

use crate::{
    capture::{ConnId, DataEvent, Direction, Event, Role, Syscall, Tuple},
    l7::Exchange,
    pipeline::Record,
};

/// Size of a byte block (a larger record gets a block of its own size).
const BLOCK: usize = 64 * 1024;
/// Record header: total length (u32), kind (u8), charge (u32), time (u64).
const HEADER: usize = 17;

const KIND_DATA: u8 = 0;
const KIND_EXCHANGE: u8 = 1;
const KIND_OTHER: u8 = 2;

const HAS_TUPLE: u8 = 1;
const HAS_GOID: u8 = 2;

/// Every [`Syscall`], indexed by its discriminant (checked by a test).
const SYSCALLS: [Syscall; 15] = [
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

#[derive(Default)]
struct Block {
    buf: Vec<u8>,
    /// Where the block's first record still in the ring starts.
    start: usize,
    /// The records from `start` on: how many, of which exchanges and others, their charges.
    records: usize,
    exchanges: usize,
    others: usize,
    charge: usize,
    /// The newest record's time: a block older than the horizon goes whole, unread.
    newest_ns: u64,
}

impl Block {
    fn add(&mut self, kind: u8, charge: usize, ts_ns: u64) {
        self.records += 1;
        self.exchanges += usize::from(kind == KIND_EXCHANGE);
        self.others += usize::from(kind == KIND_OTHER);
        self.charge += charge;
        self.newest_ns = self.newest_ns.max(ts_ns);
    }
}

#[derive(Clone, Copy)]
struct Header {
    len: usize,
    kind: u8,
    charge: usize,
    ts_ns: u64,
}

/// The recorder's records, oldest first.
#[derive(Default)]
pub(super) struct Ring {
    blocks: VecDeque<Block>,
    /// The last block let go, reused for the next one (blocks come and go at the record rate).
    spare: Option<Vec<u8>>,
    exchanges: Exchanges,
    others: VecDeque<Record>,
    records: usize,
    bytes: usize,
}

/// What [`Ring::evict`] let go.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Evicted {
    pub(super) aged: u64,
    pub(super) sized: u64,
}

/// One record of the ring, as [`Ring::iter`] yields it.
pub(super) enum Entry<'a> {
    /// An encoded data event (decoded by [`Entry::to_record`]).
    Data(&'a [u8]),
    Exchange(&'a Exchange),
    Other(&'a Record),
}

impl Entry<'_> {
    /// The record again (`None` only for a data record that does not decode, which the ring
    /// never writes).
    pub(super) fn to_record(&self) -> Option<Record> {
        Some(match self {
            Entry::Data(b) => Record::Event(Event::Data(decode_data(b)?)),
            Entry::Exchange(x) => Record::Exchange(Box::new((*x).clone())),
            Entry::Other(r) => (*r).clone(),
        })
    }
}

impl Ring {
    pub(super) fn len(&self) -> usize {
        self.records
    }

    /// The sum of the records' charges.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Time of the oldest record.
    pub(super) fn front_ts(&self) -> Option<u64> {
        let b = self.blocks.front()?;
        Some(read_header(b.buf.get(b.start..)?)?.ts_ns)
    }

    /// Append a data event whose payload `redact` masks in place once copied; `redact` returns
    /// how many of the payload's bytes to keep. The rest, a masked body's dots, are left out as
    /// a capture leaves out what is past its prefix: the event's `len` still counts them, so the
    /// reassembler frames the record as it framed the live one (bodies are skipped by counting),
    /// and the same bound holds that much more history (a masked body is most of a response's
    /// captured bytes).
    pub(super) fn push_data(&mut self, d: &DataEvent, redact: impl FnOnce(&mut [u8]) -> usize) {
        let most = HEADER + meta_len(d) + d.payload.len();
        let block = self.block_for(most);
        let buf = &mut block.buf;
        let start = buf.len();
        put_header(buf, most, KIND_DATA, most, d.ts_exit_ns);
        put_meta(buf, d);
        let at = buf.len();
        buf.extend_from_slice(&d.payload);
        let keep = buf.get_mut(at..).map_or(0, redact);
        buf.truncate(at + keep);
        let len = buf.len() - start;
        if let Some(h) = buf.get_mut(start..start + HEADER) {
            set_len(h, len);
        }
        block.add(KIND_DATA, len, d.ts_exit_ns);
        self.records += 1;
        self.bytes += len;
    }

    pub(super) fn push_exchange(&mut self, x: Exchange) {
        self.push_marker(KIND_EXCHANGE, exchange_size(&x), x.end_ns());
        self.exchanges.push_back(x);
    }

    /// Any record but a data event or an exchange (those have their own pushes).
    pub(super) fn push_other(&mut self, rec: Record) {
        self.push_marker(KIND_OTHER, approx_size(&rec), rec.ts_ns());
        self.others.push_back(rec);
    }

    /// Let go of the oldest records while they are older than `horizon` or the charges exceed
    /// `target`: stops at the first record that is neither (records are in arrival order). Over
    /// `target`, whole blocks go (the bound is met within a block's worth of bytes): evicting
    /// does not read the records it lets go, which sit in memory long out of the caches.
    pub(super) fn evict(&mut self, horizon: u64, target: usize) -> Evicted {
        let mut ev = Evicted::default();
        let (mut exchanges, mut others) = (0, 0);
        while let Some(b) = self.blocks.front_mut() {
            let aged = b.newest_ns < horizon;
            if !aged && self.bytes <= target {
                // Only its oldest records may have aged: read them one by one.
                while let Some(h) = b.buf.get(b.start..).and_then(read_header) {
                    if h.ts_ns >= horizon {
                        break;
                    }
                    ev.aged += 1;
                    b.records -= 1;
                    b.charge = b.charge.saturating_sub(h.charge);
                    self.bytes = self.bytes.saturating_sub(h.charge);
                    self.records = self.records.saturating_sub(1);
                    if h.kind == KIND_EXCHANGE {
                        b.exchanges -= 1;
                        exchanges += 1;
                    } else if h.kind == KIND_OTHER {
                        b.others -= 1;
                        others += 1;
                    }
                    b.start += h.len;
                }
                if b.records > 0 {
                    break;
                }
            } else if aged {
                ev.aged += b.records as u64;
            } else {
                ev.sized += b.records as u64;
            }
            self.bytes = self.bytes.saturating_sub(b.charge);
            self.records = self.records.saturating_sub(b.records);
            exchanges += b.exchanges;
            others += b.others;
            if let Some(mut done) = self.blocks.pop_front().map(|b| b.buf)
                && done.capacity() == BLOCK
            {
                done.clear();
                self.spare = Some(done);
            }
        }
        self.exchanges.drop_front(exchanges);
        self.others.drain(..others.min(self.others.len()));
        ev
    }

    /// Every record, oldest first, with its time.
    pub(super) fn iter(&self) -> Iter<'_> {
        Iter {
            blocks: self.blocks.iter(),
            cur: &[],
            exchanges: self.exchanges.iter(),
            others: self.others.iter(),
        }
    }

    /// A record held outside the byte blocks (`size`: its own charge): its header alone marks
    /// its place.
    fn push_marker(&mut self, kind: u8, size: usize, ts_ns: u64) {
        let charge = HEADER + size;
        let block = self.block_for(HEADER);
        block.add(kind, charge, ts_ns);
        put_header(&mut block.buf, HEADER, kind, charge, ts_ns);
        self.records += 1;
        self.bytes += charge;
    }

    /// The block the next `len` bytes go into.
    fn block_for(&mut self, len: usize) -> &mut Block {
        let fits = self
            .blocks
            .back()
            .is_some_and(|b| b.buf.capacity() - b.buf.len() >= len);
        if !fits {
            let buf = match self.spare.take() {
                Some(s) if len <= BLOCK => s,
                _ => Vec::with_capacity(BLOCK.max(len)),
            };
            self.blocks.push_back(Block {
                buf,
                ..Block::default()
            });
        }
        // Not empty: it had a last block with room, or one was just pushed.
        let last = self.blocks.len() - 1;
        &mut self.blocks[last]
    }
}

pub(super) struct Iter<'a> {
    blocks: vec_deque::Iter<'a, Block>,
    cur: &'a [u8],
    exchanges: std::iter::Flatten<vec_deque::Iter<'a, VecDeque<Exchange>>>,
    others: vec_deque::Iter<'a, Record>,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (u64, Entry<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        while self.cur.is_empty() {
            let b = self.blocks.next()?;
            self.cur = b.buf.get(b.start..)?;
        }
        let h = read_header(self.cur)?;
        let (rec, rest) = self.cur.split_at_checked(h.len)?;
        self.cur = rest;
        let e = match h.kind {
            KIND_DATA => Entry::Data(rec.get(HEADER..)?),
            KIND_EXCHANGE => Entry::Exchange(self.exchanges.next()?),
            _ => Entry::Other(self.others.next()?),
        };
        Some((h.ts_ns, e))
    }
}

/// The ring's exchanges, oldest first. Held in blocks of [`Exchanges::BLOCK`], not one deque: a
/// deque doubles its buffer as it grows, so at the ring's steady size up to half of a large
/// allocation sat unused (+10 MiB of peak RSS under a keep-alive load), while a block is
/// allocated and freed whole, once per `BLOCK` exchanges.
#[derive(Default)]
struct Exchanges {
    blocks: VecDeque<VecDeque<Exchange>>,
}

impl Exchanges {
    const BLOCK: usize = 64;

    fn push_back(&mut self, x: Exchange) {
        match self.blocks.back_mut() {
            Some(b) if b.len() < Self::BLOCK => b.push_back(x),
            _ => {
                let mut b = VecDeque::with_capacity(Self::BLOCK);
                b.push_back(x);
                self.blocks.push_back(b);
            }
        }
    }

    /// Drop the `n` oldest exchanges in place (whole blocks where it can).
    fn drop_front(&mut self, mut n: usize) {
        while n > 0 {
            let Some(first) = self.blocks.front_mut() else {
                return;
            };
            if first.len() <= n {
                n -= first.len();
                self.blocks.pop_front();
            } else {
                first.drain(..n);
                return;
            }
        }
    }

    fn iter(&self) -> std::iter::Flatten<vec_deque::Iter<'_, VecDeque<Exchange>>> {
        self.blocks.iter().flatten()
    }
}

/// Rough heap + inline size of a record held as a struct, for the ring's byte bound (cheap: no
/// serialisation).
fn approx_size(rec: &Record) -> usize {
    use std::mem::size_of;
    // Its slot in the ring of other records.
    const BASE: usize = size_of::<Record>();
    match rec {
        Record::Event(Event::Data(d)) => BASE + d.payload.len(),
        Record::Event(Event::Process(p)) => {
            BASE + p.comm.len()
                + p.exe.as_ref().map_or(0, String::len)
                + p.cgroup.as_ref().map_or(0, String::len)
                + p.container_id.as_ref().map_or(0, String::len)
        }
        Record::Exchange(x) => exchange_size(x),
        Record::Verdict(v) => {
            BASE + size_of::<crate::correlate::Verdict>() + v.caused_by.len() * 48
        }
        Record::Decision(d) => BASE + 256 + d.callee_addrs.len() * 32,
        Record::Edges(e) => BASE + e.edges.len() * 512 + e.paths.depths.len() * 128,
        Record::Event(Event::Conn(_) | Event::ProcessExit { .. }) | Record::Tick { .. } => BASE,
    }
}

/// An exchange's charge: its place inline in the exchange ring and its strings' heap (none
/// when short).
fn exchange_size(x: &Exchange) -> usize {
    size_of::<Exchange>()
        + x.authority.as_ref().map_or(0, heap_len)
        + x.path.as_ref().map_or(0, heap_len)
        + x.route.as_ref().map_or(0, heap_len)
}

/// Heap bytes of an exchange's string: none when it is held inline.
fn heap_len(t: &crate::l7::Text) -> usize {
    if t.is_heap_allocated() { t.len() } else { 0 }
}

fn put_header(buf: &mut Vec<u8>, len: usize, kind: u8, charge: usize, ts_ns: u64) {
    // Records are far below 4 GiB (a block, or one capture's payload).
    buf.extend_from_slice(&(len as u32).to_le_bytes());
    buf.push(kind);
    buf.extend_from_slice(&(charge as u32).to_le_bytes());
    buf.extend_from_slice(&ts_ns.to_le_bytes());
}

/// Sets a header's length and charge (a data record learns its own once redacted).
fn set_len(h: &mut [u8], len: usize) {
    let l = (len as u32).to_le_bytes();
    if let Some(f) = h.get_mut(0..4) {
        f.copy_from_slice(&l);
    }
    if let Some(f) = h.get_mut(5..9) {
        f.copy_from_slice(&l);
    }
}

fn read_header(b: &[u8]) -> Option<Header> {
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

fn addr_len(a: &SocketAddr) -> usize {
    match a {
        SocketAddr::V4(_) => 1 + 4 + 2,
        SocketAddr::V6(_) => 1 + 16 + 2 + 4 + 4,
    }
}

/// Encoded size of a data event's fields before its payload.
fn meta_len(d: &DataEvent) -> usize {
    let fixed = 16 + 4 + 8 + 24;
    fixed
        + d.goid.map_or(0, |_| 8)
        + d.tuple
            .as_ref()
            .map_or(0, |t| addr_len(&t.local) + addr_len(&t.remote))
}

fn put_meta(buf: &mut Vec<u8>, d: &DataEvent) {
    let flags =
        if d.tuple.is_some() { HAS_TUPLE } else { 0 } | if d.goid.is_some() { HAS_GOID } else { 0 };
    buf.extend_from_slice(&d.conn.pid.to_le_bytes());
    buf.extend_from_slice(&d.conn.fd.to_le_bytes());
    buf.extend_from_slice(&d.conn.generation.to_le_bytes());
    buf.extend_from_slice(&[d.role as u8, d.direction as u8, d.syscall as u8, flags]);
    buf.extend_from_slice(&d.pid.to_le_bytes());
    buf.extend_from_slice(&d.tid.to_le_bytes());
    buf.extend_from_slice(&d.ts_enter_ns.to_le_bytes());
    buf.extend_from_slice(&d.ts_exit_ns.to_le_bytes());
    buf.extend_from_slice(&d.len.to_le_bytes());
    if let Some(g) = d.goid {
        buf.extend_from_slice(&g.to_le_bytes());
    }
    if let Some(t) = &d.tuple {
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

/// A data event from its encoding (header excluded).
fn decode_data(b: &[u8]) -> Option<DataEvent> {
    let mut r = Reader(b);
    let conn = ConnId {
        pid: r.u32()?,
        fd: r.u32()?,
        generation: r.u64()?,
    };
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
    let (pid, tid) = (r.u32()?, r.u32()?);
    let (ts_enter_ns, ts_exit_ns, len) = (r.u64()?, r.u64()?, r.u64()?);
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
        ts_enter_ns,
        ts_exit_ns,
        len,
        payload: bytes::Bytes::copy_from_slice(r.0),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_syscall_decodes_to_itself() {
        for (i, s) in SYSCALLS.iter().enumerate() {
            assert_eq!(*s as usize, i, "{s:?}");
        }
        // A variant added to Syscall must be added to SYSCALLS too.
        assert_eq!(Syscall::Other as usize, SYSCALLS.len() - 1);
    }

    fn event(tuple: Option<Tuple>, goid: Option<u64>, payload: &[u8]) -> DataEvent {
        DataEvent {
            conn: ConnId {
                pid: 7,
                fd: 9,
                generation: u64::MAX - 3,
            },
            role: Role::Unknown,
            direction: Direction::Ingress,
            syscall: Syscall::SslRead,
            tuple,
            pid: 7,
            tid: 8,
            goid,
            ts_enter_ns: 100,
            ts_exit_ns: 200,
            len: 1 << 40,
            payload: bytes::Bytes::copy_from_slice(payload),
        }
    }

    #[test]
    fn data_events_come_back_as_they_went_in() {
        let v6 = "[fe80::1%3]:8080".parse::<SocketAddrV6>().map(|mut a| {
            a.set_flowinfo(0x12345);
            SocketAddr::V6(a)
        });
        let tuples = [
            None,
            Some(Tuple {
                local: "10.0.0.1:1".parse().unwrap(),
                remote: v6.unwrap(),
            }),
        ];
        let mut ring = Ring::default();
        let mut want = Vec::new();
        for t in tuples {
            for g in [None, Some(42)] {
                for p in [&b""[..], b"GET / HTTP/1.1\r\n\r\n"] {
                    let d = event(t, g, p);
                    ring.push_data(&d, |b| b.len());
                    want.push(d);
                }
            }
        }
        let got: Vec<DataEvent> = ring
            .iter()
            .map(|(ts, e)| {
                assert_eq!(ts, 200);
                match e.to_record() {
                    Some(Record::Event(Event::Data(d))) => d,
                    _ => panic!("not a data event"),
                }
            })
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn redaction_writes_into_the_ring() {
        let mut ring = Ring::default();
        ring.push_data(&event(None, None, b"secret"), |b| {
            b.fill(b'*');
            b.len()
        });
        let Some((_, e)) = ring.iter().next() else {
            panic!("empty ring")
        };
        let Some(Record::Event(Event::Data(d))) = e.to_record() else {
            panic!("not a data event")
        };
        assert_eq!(&d.payload[..], b"******");
    }

    /// What the redaction says to keep is stored, the rest left out as uncaptured (the
    /// event's `len` unchanged); the record is charged what it stores.
    #[test]
    fn only_the_kept_prefix_is_stored() {
        let mut ring = Ring::default();
        let head = b"HTTP/1.1 200 OK\r\n\r\n";
        let mut p = head.to_vec();
        p.extend_from_slice(&[b'x'; 3000]);
        let d = event(None, None, &p);
        for keep in [head.len(), 0, p.len()] {
            ring.push_data(&d, |b| {
                b[keep..].fill(b'.');
                keep
            });
        }
        let full = HEADER + meta_len(&d);
        assert_eq!(ring.bytes(), 3 * full + head.len() + p.len());
        let got: Vec<DataEvent> = ring
            .iter()
            .filter_map(|(_, e)| match e.to_record() {
                Some(Record::Event(Event::Data(d))) => Some(d),
                _ => None,
            })
            .collect();
        let payloads: Vec<&[u8]> = got.iter().map(|g| &g.payload[..]).collect();
        assert_eq!(payloads, [&head[..], b"", &p[..]]);
        assert!(
            got.iter().all(|g| g.len == d.len),
            "lengths are the syscall's"
        );
    }

    #[test]
    fn blocks_are_let_go_as_records_leave() {
        let mut ring = Ring::default();
        let body = vec![b'x'; 1000];
        for i in 0..1000u64 {
            let mut d = event(None, None, &body);
            d.ts_exit_ns = i;
            ring.push_data(&d, |b| b.len());
        }
        assert!(ring.blocks.len() > 10);
        let ev = ring.evict(990, usize::MAX);
        assert_eq!(ev.aged, 990);
        assert_eq!(ring.len(), 10);
        assert_eq!(ring.front_ts(), Some(990));
        assert_eq!(ring.blocks.len(), 1, "passed blocks are freed");
        let ev = ring.evict(0, 0);
        assert_eq!((ev.aged, ev.sized), (0, 10));
        assert_eq!((ring.len(), ring.bytes()), (0, 0));
        assert!(ring.blocks.is_empty() && ring.iter().next().is_none());
    }
}
