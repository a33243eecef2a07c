//! Turns fuzzer bytes into a plausible stream of capture events for the L7 reassembler, and
//! checks what must hold whatever the bytes: no panic, bounded buffers, consistent counts.
//!
//! Layout: one flags byte (role, fresh connection, HTTP/2 preface), then records
//! `[op][len][payload; len]`; op picks the connection, the direction, an uncaptured tail (gap),
//! or a close/reset/idle tick.
use bytes::Bytes;
use retry_agent::{
    capture::{ConnEvent, ConnEventKind, ConnId, DataEvent, Direction, Event, Role, Syscall},
    l7::{Exchange, L7Config, Reassembler},
};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
const CAP: usize = 4096;
const CONNS: u32 = 3;

fn conn(fd: u32) -> ConnId {
    ConnId { pid: 1, fd, generation: 1 }
}

fn conn_ev(fd: u32, role: Role, ts: u64, kind: ConnEventKind) -> Event {
    Event::Conn(ConnEvent { conn: conn(fd), role, tuple: None, pid: 1, tid: 1, ts_ns: ts, kind })
}

pub fn run(input: &[u8], h2: bool) {
    let Some((&flags, mut rest)) = input.split_first() else { return };
    let role = match flags & 3 {
        0 => Role::Client,
        1 => Role::Server,
        _ => Role::Unknown,
    };
    let fresh = flags & 4 != 0;
    let preface = h2 && flags & 8 != 0;
    let cfg = L7Config { conn_buffer_bytes: CAP, max_connections: 2, max_inflight: 16, idle_timeout_secs: 1 };
    let mut r = Reassembler::new(cfg);
    let mut out: Vec<Exchange> = Vec::new();
    let mut ts = 1u64;
    if fresh {
        for fd in 0..CONNS {
            let kind = if role == Role::Server { ConnEventKind::Accept } else { ConnEventKind::Connect { errno: 0 } };
            r.push(&conn_ev(fd, role, ts, kind), &mut out);
        }
    }
    let mut prefaced = [!preface; CONNS as usize];
    while let [op, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (payload, next) = tail.split_at(n);
        rest = next;
        ts += 1_000_000;
        let fd = u32::from(*op & 3) % CONNS;
        match op >> 2 {
            0x3f => r.push(&conn_ev(fd, role, ts, ConnEventKind::Close), &mut out),
            0x3e => r.push(&conn_ev(fd, role, ts, ConnEventKind::Reset { errno: -104 }), &mut out),
            0x3d => {
                ts += 2_000_000_000;
                r.tick(ts, &mut out);
            }
            0x3c => r.push(&conn_ev(fd, role, ts, ConnEventKind::Connect { errno: -111 }), &mut out),
            bits => {
                let direction = if bits & 1 == 0 { Direction::Egress } else { Direction::Ingress };
                let mut bytes = Vec::with_capacity(payload.len() + PREFACE.len());
                let client_side = matches!((role, direction), (Role::Client, Direction::Egress) | (Role::Server, Direction::Ingress));
                if let Some(p) = prefaced.get_mut(fd as usize)
                    && !*p
                    && client_side
                {
                    *p = true;
                    bytes.extend_from_slice(PREFACE);
                }
                bytes.extend_from_slice(payload);
                // Bits 1..: an uncaptured tail, from none to past any frame or body size.
                let gap = match (bits >> 1) & 7 {
                    0..=4 => 0,
                    5 => u64::from(bits >> 4),
                    6 => 1000,
                    _ => 100_000,
                };
                let len = bytes.len() as u64 + gap;
                let ev = Event::Data(DataEvent {
                    conn: conn(fd),
                    role,
                    direction,
                    syscall: Syscall::Other,
                    tuple: None,
                    pid: 1,
                    tid: 1,
                    goid: None,
                    // The kernel's word on a read among others (any byte may carry it).
                    interleaved: bits & 0x80 != 0,
                    ts_enter_ns: ts,
                    ts_exit_ns: ts + 1,
                    len,
                    payload: Bytes::from(bytes),
                });
                r.push(&ev, &mut out);
            }
        }
        // Bounded memory: per connection, a head or header block buffer per direction up to
        // the cap, plus frame and detection scratch.
        let buffered = r.buffered_bytes();
        assert!(buffered <= 2 * 2 * 4 * (CAP + 1024), "buffers grew to {buffered}");
        assert!(r.stats().connections <= 2);
    }
    r.tick(u64::MAX, &mut out);
    let s = r.stats();
    assert_eq!(s.exchanges as usize, out.len());
    assert_eq!(s.connections, 0);
    for (i, e) in out.iter().enumerate() {
        assert_eq!(e.id.0 as usize, i, "ids in emission order");
    }
}
