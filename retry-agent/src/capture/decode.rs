//! Raw ring-buffer records → owned [`Event`]s. Pure: no IO, never panics on a malformed record
//! (it returns a [`DecodeError`], which the reader counts).
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::{Bytes, BytesMut};
use retry_common::{
    AF_INET, AF_INET6, ConnRecord, DataHeader, HELD_BYTES, KIND_CONN, KIND_DATA, KIND_PROCESS_EXIT,
    KIND_SUMMARY, KIND_TALLY, ProcessExitRecord, SUMMARY_HEAD, SockTuple, SummaryRecord, conn_kind,
    data_flags, direction, role, syscall,
};

use super::event::{
    ConnEvent, ConnEventKind, ConnId, DataEvent, Direction, Event, Role, SummaryEvent, Syscall,
    Tuple,
};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("record of {len} bytes is shorter than its {what} ({need} bytes)")]
    Short {
        what: &'static str,
        len: usize,
        need: usize,
    },
    #[error("unknown record kind {0}")]
    UnknownKind(u32),
    #[error("unknown {what} value {value}")]
    UnknownValue { what: &'static str, value: u32 },
}

/// Reads a `T` from the start of `raw` after checking the length (records in the ring buffer are
/// only 8-byte aligned, hence `read_unaligned`).
fn read<T: aya::Pod>(raw: &[u8], what: &'static str) -> Result<T, DecodeError> {
    let need = size_of::<T>();
    if raw.len() < need {
        return Err(DecodeError::Short {
            what,
            len: raw.len(),
            need,
        });
    }
    // SAFETY: length checked above; T is Pod (every bit pattern valid, no padding).
    Ok(unsafe { std::ptr::read_unaligned(raw.as_ptr().cast::<T>()) })
}

/// The pid of a process-exec record (`None` for any other record): not an [`Event`] itself,
/// it tells the reader to describe that process again.
pub fn exec_pid(raw: &[u8]) -> Option<u32> {
    let r: ProcessExitRecord = read(raw, "process exec record").ok()?;
    (r.kind == retry_common::KIND_PROCESS_EXEC).then_some(r.pid)
}

/// For a connection record that adopts a connection across fork, (child pid, parent pid): the
/// reader describes a child gone before /proc was read as its parent (same image, cgroup and
/// network namespace until an exec).
pub fn inherited_from(raw: &[u8]) -> Option<(u32, u32)> {
    let r: ConnRecord = read(raw, "connection record").ok()?;
    (r.kind == retry_common::KIND_CONN && r.conn_kind == conn_kind::ACCEPT && r.parent != 0)
        .then_some((r.pid, r.parent))
}

/// The comm a process-exit record carries (`None` for any other record, or an empty name): the
/// reader names a process by it when the process was gone before /proc could describe it.
pub fn exit_comm(raw: &[u8]) -> Option<String> {
    let r: ProcessExitRecord = read(raw, "process exit record").ok()?;
    if r.kind != KIND_PROCESS_EXIT {
        return None;
    }
    let end = r.comm.iter().position(|&b| b == 0).unwrap_or(r.comm.len());
    let comm = String::from_utf8_lossy(r.comm.get(..end)?).into_owned();
    (!comm.is_empty()).then_some(comm)
}

/// Decodes one ring-buffer record.
pub fn decode(raw: &[u8]) -> Result<Event, DecodeError> {
    decode_in(raw, None)
}

/// Where decoded payloads are copied to: shared chunks, one allocation per [`Self::CHUNK`]
/// bytes instead of one per event (malloc and free were ~5% of the agent's CPU under a
/// keep-alive load). Events live one pipeline push (every stage copies what it keeps), so a
/// chunk goes soon after its last event.
#[derive(Debug, Default)]
pub struct PayloadArena(BytesMut);

impl PayloadArena {
    const CHUNK: usize = 64 * 1024;

    fn copy(&mut self, b: &[u8]) -> Bytes {
        if self.0.capacity() - self.0.len() < b.len() {
            self.0 = BytesMut::with_capacity(Self::CHUNK.max(b.len()));
        }
        self.0.extend_from_slice(b);
        self.0.split().freeze()
    }
}

/// [`decode`], with payloads copied into `arena` when given.
pub fn decode_in(raw: &[u8], arena: Option<&mut PayloadArena>) -> Result<Event, DecodeError> {
    let kind: u32 = read(raw, "kind tag")?;
    match kind {
        KIND_DATA => decode_data(raw, arena).map(Event::Data),
        KIND_CONN => decode_conn(raw).map(Event::Conn),
        KIND_SUMMARY | KIND_TALLY => decode_summary(raw, arena).map(Event::Summary),
        KIND_PROCESS_EXIT => {
            let r: ProcessExitRecord = read(raw, "process exit record")?;
            Ok(Event::ProcessExit {
                pid: r.pid,
                ts_ns: r.ts_ns,
            })
        }
        other => Err(DecodeError::UnknownKind(other)),
    }
}

fn decode_data(raw: &[u8], arena: Option<&mut PayloadArena>) -> Result<DataEvent, DecodeError> {
    let h: DataHeader = read(raw, "data header")?;
    let start = size_of::<DataHeader>();
    let end = start + h.captured as usize;
    let payload = raw.get(start..end).ok_or(DecodeError::Short {
        what: "payload",
        len: raw.len(),
        need: end,
    })?;
    data_event(&h, copied(payload, arena))
}

/// `b` as an event's own bytes: cut from `arena` when given.
fn copied(b: &[u8], arena: Option<&mut PayloadArena>) -> Bytes {
    match arena {
        Some(a) => a.copy(b),
        None => Bytes::copy_from_slice(b),
    }
}

/// The event of data header `h`, carrying `payload`.
fn data_event(h: &DataHeader, payload: Bytes) -> Result<DataEvent, DecodeError> {
    Ok(DataEvent {
        conn: ConnId {
            pid: h.pid,
            fd: h.fd,
            generation: h.generation,
        },
        role: role_of(h.role)?,
        direction: match h.direction {
            direction::EGRESS => Direction::Egress,
            direction::INGRESS => Direction::Ingress,
            v => {
                return Err(DecodeError::UnknownValue {
                    what: "direction",
                    value: u32::from(v),
                });
            }
        },
        syscall: syscall_of(h.syscall),
        tuple: tuple_of(&h.tuple),
        pid: h.pid,
        tid: h.tid,
        goid: (h.goroutine != 0).then_some(h.goroutine),
        interleaved: h.flags & data_flags::INTERLEAVED != 0,
        ts_enter_ns: h.ts_enter_ns,
        ts_exit_ns: h.ts_exit_ns,
        len: h.len,
        payload,
    })
}

/// A summary record: its two headers are data headers (checked to be), each read as a data
/// record's, the request's with the bytes that follow the headers. The record ends after the request's captured bytes (the kernel sends
/// `SUMMARY_HEAD` and those), so a short request makes a short record; one cut shorter than
/// that is refused.
fn decode_summary(
    raw: &[u8],
    arena: Option<&mut PayloadArena>,
) -> Result<SummaryEvent, DecodeError> {
    let head = raw.get(..SUMMARY_HEAD).ok_or(DecodeError::Short {
        what: "summary record",
        len: raw.len(),
        need: SUMMARY_HEAD,
    })?;
    let kind: u32 = read(head, "summary kind")?;
    let status: u16 = read(&head[4..], "summary status")?;
    let weight: u16 = read(&head[6..], "summary weight")?;
    // A tally is status 0 (what `SummaryEvent::is_tally` reads); a summary's is a status line's.
    let status = if kind == KIND_TALLY { 0 } else { status };
    if status == 0 && kind != KIND_TALLY {
        return Err(DecodeError::UnknownValue {
            what: "summary status",
            value: 0,
        });
    }
    let resp: DataHeader = read(
        &head[std::mem::offset_of!(SummaryRecord, response)..],
        "summary's response header",
    )?;
    let req: DataHeader = read(
        &head[std::mem::offset_of!(SummaryRecord, request)..],
        "summary's request header",
    )?;
    if req.kind != KIND_DATA || resp.kind != KIND_DATA {
        return Err(DecodeError::UnknownValue {
            what: "summary's data header kind",
            value: if req.kind != KIND_DATA {
                req.kind
            } else {
                resp.kind
            },
        });
    }
    // The request's bytes follow the headers, as a data record's follow its header.
    let sent = usize::try_from(req.captured)
        .unwrap_or(usize::MAX)
        .min(HELD_BYTES);
    let end = SUMMARY_HEAD + sent;
    let bytes = raw.get(SUMMARY_HEAD..end).ok_or(DecodeError::Short {
        what: "summary record's request bytes",
        len: raw.len(),
        need: end,
    })?;
    Ok(SummaryEvent {
        request: data_event(&req, copied(bytes, arena))?,
        response: data_event(&resp, Bytes::new())?,
        status,
        // Records of kernels before weights said 0: one.
        weight: u32::from(weight).max(1),
    })
}

fn decode_conn(raw: &[u8]) -> Result<ConnEvent, DecodeError> {
    let r: ConnRecord = read(raw, "connection record")?;
    let kind = match r.conn_kind {
        conn_kind::CONNECT => ConnEventKind::Connect { errno: r.errno },
        conn_kind::ESTABLISHED => ConnEventKind::Established,
        conn_kind::FAILED => ConnEventKind::Failed { errno: r.errno },
        conn_kind::ACCEPT => ConnEventKind::Accept,
        conn_kind::CLOSE => ConnEventKind::Close,
        conn_kind::RESET => ConnEventKind::Reset { errno: r.errno },
        conn_kind::STREAM => ConnEventKind::Stream {
            id: r.stream_id,
            context: r.context,
        },
        v => {
            return Err(DecodeError::UnknownValue {
                what: "connection event kind",
                value: v,
            });
        }
    };
    Ok(ConnEvent {
        conn: ConnId {
            pid: r.pid,
            fd: r.fd,
            generation: r.generation,
        },
        role: role_of(r.role)?,
        tuple: tuple_of(&r.tuple),
        pid: r.pid,
        tid: r.tid,
        ts_ns: r.ts_ns,
        kind,
    })
}

fn role_of(v: u32) -> Result<Role, DecodeError> {
    match v {
        role::CLIENT => Ok(Role::Client),
        role::SERVER => Ok(Role::Server),
        role::UNKNOWN => Ok(Role::Unknown),
        v => Err(DecodeError::UnknownValue {
            what: "role",
            value: v,
        }),
    }
}

fn syscall_of(v: u32) -> Syscall {
    match v {
        syscall::READ => Syscall::Read,
        syscall::WRITE => Syscall::Write,
        syscall::READV => Syscall::Readv,
        syscall::WRITEV => Syscall::Writev,
        syscall::SENDTO => Syscall::Sendto,
        syscall::RECVFROM => Syscall::Recvfrom,
        syscall::SENDMSG => Syscall::Sendmsg,
        syscall::RECVMSG => Syscall::Recvmsg,
        syscall::SENDMMSG => Syscall::Sendmmsg,
        syscall::RECVMMSG => Syscall::Recvmmsg,
        syscall::SENDFILE => Syscall::Sendfile,
        syscall::SPLICE_OUT | syscall::SPLICE_IN => Syscall::Splice,
        syscall::SSL_WRITE => Syscall::SslWrite,
        syscall::SSL_READ => Syscall::SslRead,
        _ => Syscall::Other,
    }
}

/// Kernel tuple → addresses. IPv4-mapped IPv6 addresses (dual-stack sockets) become IPv4 so the
/// two ends of one loopback connection compare equal whatever family each socket has. An unknown
/// family gives `None`; a not-yet-known local side is `0.0.0.0:0` / `[::]:0`.
pub fn tuple_of(t: &SockTuple) -> Option<Tuple> {
    let (local, remote) = match t.family {
        AF_INET => {
            let l = Ipv4Addr::new(t.laddr[0], t.laddr[1], t.laddr[2], t.laddr[3]);
            let r = Ipv4Addr::new(t.raddr[0], t.raddr[1], t.raddr[2], t.raddr[3]);
            (IpAddr::V4(l), IpAddr::V4(r))
        }
        AF_INET6 => (
            Ipv6Addr::from(t.laddr).to_canonical(),
            Ipv6Addr::from(t.raddr).to_canonical(),
        ),
        _ => return None,
    };
    Some(Tuple {
        local: SocketAddr::new(local, t.lport),
        remote: SocketAddr::new(remote, t.rport),
    })
}

/// Addresses → kernel tuple (for connections the agent inserts itself, e.g. from /proc).
pub fn sock_tuple(t: &Tuple) -> SockTuple {
    fn bytes(ip: IpAddr) -> (u16, [u8; 16]) {
        match ip {
            IpAddr::V4(v4) => {
                let mut b = [0u8; 16];
                b[..4].copy_from_slice(&v4.octets());
                (AF_INET, b)
            }
            IpAddr::V6(v6) => (AF_INET6, v6.octets()),
        }
    }
    let (family, laddr) = bytes(t.local.ip());
    let (_, raddr) = bytes(t.remote.ip());
    SockTuple {
        family,
        lport: t.local.port(),
        rport: t.remote.port(),
        _pad: 0,
        laddr,
        raddr,
    }
}

#[cfg(test)]
mod tests;
