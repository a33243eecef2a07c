//! Owned, decoded kernel events: what every later stage reads.
//!
//! Produced by `capture::decode` from the raw `retry_common` records (or by the recorder's
//! replay, or by synthetic fixtures in tests). Timestamps are CLOCK_MONOTONIC nanoseconds, the
//! clock `bpf_ktime_get_ns` reads.
use std::net::SocketAddr;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::WorkloadName;

/// Identity of one TCP connection as seen by one process: survives fd reuse because the
/// generation (kernel socket cookie, or a per-fd counter bumped at connect/accept/close) changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ConnId {
    pub pid: u32,
    pub fd: u32,
    pub generation: u64,
}

/// Which side of the connection this process is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The process called connect().
    Client,
    /// The process accepted the connection.
    Server,
    /// Picked up mid-life (e.g. existed before the agent started) and not yet resolved.
    Unknown,
}

/// Direction of the bytes relative to the observed process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// The process wrote/sent these bytes.
    Egress,
    /// The process read/received these bytes.
    Ingress,
}

/// The syscall that moved the bytes (for diagnostics; parsers never depend on it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Syscall {
    Read,
    Write,
    Readv,
    Writev,
    Sendto,
    Recvfrom,
    Sendmsg,
    Recvmsg,
    Sendmmsg,
    Recvmmsg,
    /// Zero-copy: the event carries the byte count only.
    Sendfile,
    Splice,
    /// TLS plaintext from the TLS library (uprobes), not a syscall.
    SslWrite,
    SslRead,
    Other,
}

/// Local and remote address of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Tuple {
    pub local: SocketAddr,
    pub remote: SocketAddr,
}

/// One completed socket I/O syscall on a TCP connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataEvent {
    pub conn: ConnId,
    pub role: Role,
    pub direction: Direction,
    pub syscall: Syscall,
    pub tuple: Option<Tuple>,
    pub pid: u32,
    pub tid: u32,
    /// Go programs: the goroutine context the kernel tagged this I/O with (the request
    /// goroutine it works for; `retry_common::GOROUTINE_ROOTED` set when traced to a request
    /// root by the Go uprobes).
    pub goid: Option<u64>,
    /// A served request the kernel saw its thread read among others it had not answered
    /// (`retry_common::data_flags::INTERLEAVED`): with `--capture-summarize` a held request
    /// reaches userspace late, so the order of reads alone no longer tells.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interleaved: bool,
    pub ts_enter_ns: u64,
    pub ts_exit_ns: u64,
    /// Bytes the syscall actually moved (its positive return value).
    pub len: u64,
    /// The first bytes of those `len` (at most the configured capture size).
    #[serde(with = "bytes_serde")]
    pub payload: Bytes,
}

impl DataEvent {
    /// Whether the payload holds every byte the syscall moved.
    pub fn is_complete(&self) -> bool {
        self.payload.len() as u64 >= self.len
    }
}

/// Lifecycle of a connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ConnEventKind {
    /// connect() finished; `errno` is 0 on success (or EINPROGRESS for non-blocking sockets,
    /// whose outcome arrives later as `Established` or `Failed`).
    Connect {
        errno: i32,
    },
    /// A non-blocking connect or a handshake reached ESTABLISHED.
    Established,
    /// A non-blocking connect failed (ECONNREFUSED, ETIMEDOUT, ...).
    Failed {
        errno: i32,
    },
    Accept,
    /// The process closed its fd.
    Close,
    /// The peer reset the connection (seen as a state change to CLOSE from an open state
    /// without a FIN exchange, or an I/O errno of ECONNRESET/EPIPE).
    Reset {
        errno: i32,
    },
    /// Found in /proc at start-up: existed before the agent.
    Existing,
    /// A Go uprobe bound HTTP/2 stream `id` of this connection to the goroutine context
    /// `context` (as in [`DataEvent::goid`]): gRPC-go writes a stream's frames from the
    /// connection's goroutines, so only this says which request the stream serves.
    Stream {
        id: u32,
        context: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnEvent {
    pub conn: ConnId,
    pub role: Role,
    pub tuple: Option<Tuple>,
    pub pid: u32,
    pub tid: u32,
    pub ts_ns: u64,
    #[serde(flatten)]
    pub kind: ConnEventKind,
}

/// Process metadata, emitted once per process before its first event (and again if it changes),
/// so every later stage, and an offline replay, can name services without reading /proc.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub pid: u32,
    pub comm: String,
    pub exe: Option<String>,
    /// cgroup v2 path (from /proc/PID/cgroup).
    pub cgroup: Option<String>,
    /// Container id parsed from the cgroup path, when it has one.
    pub container_id: Option<String>,
    /// Network namespace inode: addresses are only unique within one.
    pub netns: Option<u64>,
    /// The host's network namespace inode (pid 1's), so a replay can tell a containerized process
    /// from a host one. `None` when unreadable, and in recordings from before it was carried.
    #[serde(default)]
    pub host_netns: Option<u64>,
    /// Its Kubernetes name, once `identity` resolved its container (the process is described
    /// again then). Recorded, so a replay names services as the live run did.
    #[serde(default)]
    pub workload: Option<WorkloadName>,
    /// The process it was forked from, when it was first seen serving a connection that one
    /// accepted (a pre-forking server's child): it is in its parent's container.
    #[serde(default)]
    pub parent: Option<u32>,
}

impl ProcessInfo {
    /// A process that was gone before /proc could describe it, named by its exit record.
    pub fn named_at_exit(pid: u32, comm: String) -> Self {
        ProcessInfo {
            pid,
            comm,
            exe: None,
            cgroup: None,
            container_id: None,
            netns: None,
            host_netns: None,
            workload: None,
            parent: None,
        }
    }

    /// Some of what /proc describes could not be read (a zombie, a process exiting).
    pub fn is_partial(&self) -> bool {
        self.exe.is_none() || self.cgroup.is_none() || self.netns.is_none()
    }

    /// Fills what this description could not read (exe, cgroup, container, namespaces) from
    /// another description of the same program, e.g. the parent a child was forked from.
    pub fn fill_from(&mut self, other: &ProcessInfo) {
        self.exe = self.exe.take().or_else(|| other.exe.clone());
        self.cgroup = self.cgroup.take().or_else(|| other.cgroup.clone());
        self.container_id = self
            .container_id
            .take()
            .or_else(|| other.container_id.clone());
        self.netns = self.netns.or(other.netns);
        self.host_netns = self.host_netns.or(other.host_netns);
        self.workload = self.workload.take().or_else(|| other.workload.clone());
    }
}

/// A quiet HTTP/1 exchange the kernel sent as one record (`--capture-summarize`): its answer's
/// status was a 2xx or 3xx and nothing around it had failed, so neither message's bytes came.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SummaryEvent {
    /// The request's record as the kernel held it, its bytes as held (up to
    /// `retry_common::HELD_BYTES`) in `payload`.
    pub request: DataEvent,
    /// The response's first record, without its bytes.
    pub response: DataEvent,
    /// The response's status code; 0 in a tally (`is_tally`).
    pub status: u16,
    /// How many quiet exchanges of its connection it stands for (`--capture-summary-every`):
    /// itself and those the kernel counted since the connection's last record. A tally stands
    /// for `weight` counted ones only: its request is the connection's last held one, for its
    /// identity, and its response's times are when the kernel sent it.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub weight: u32,
}

impl SummaryEvent {
    /// Quiet exchanges counted and not sent, none of which this is.
    pub fn is_tally(&self) -> bool {
        self.status == 0
    }
}

/// Serde's default of a weight (`SummaryEvent::weight`, l7's `Exchange::weight`).
pub(crate) fn one() -> u32 {
    1
}

/// A weight serde leaves out.
pub(crate) fn is_one(w: &u32) -> bool {
    *w == 1
}

/// Everything the capture layer emits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    Data(DataEvent),
    Conn(ConnEvent),
    Process(ProcessInfo),
    ProcessExit {
        pid: u32,
        ts_ns: u64,
    },
    /// Inline, though twice a data event: with the kernel summarising quiet requests it is the
    /// commonest event, and a box made by the reader thread and freed by the pipeline's was
    /// ~4% of the agent's CPU (glibc's cross-thread frees).
    Summary(SummaryEvent),
}

impl Event {
    pub fn ts_ns(&self) -> u64 {
        match self {
            Event::Data(d) => d.ts_exit_ns,
            Event::Summary(s) => s.response.ts_exit_ns,
            Event::Conn(c) => c.ts_ns,
            Event::ProcessExit { ts_ns, .. } => *ts_ns,
            Event::Process(_) => 0,
        }
    }

    pub fn pid(&self) -> u32 {
        match self {
            Event::Data(d) => d.pid,
            Event::Summary(s) => s.request.pid,
            Event::Conn(c) => c.pid,
            Event::ProcessExit { pid, .. } => *pid,
            Event::Process(p) => p.pid,
        }
    }

    /// The connection's ends, for events about a connection that knows them.
    pub fn tuple(&self) -> Option<Tuple> {
        match self {
            Event::Data(d) => d.tuple,
            Event::Summary(s) => s.request.tuple,
            Event::Conn(c) => c.tuple,
            Event::Process(_) | Event::ProcessExit { .. } => None,
        }
    }
}

/// Payload bytes as a lossless JSON string: printable ASCII kept, everything else `\xNN`,
/// so `trace` output reads like the wire and round-trips.
mod bytes_serde {
    use bytes::Bytes;
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(b: &Bytes, s: S) -> Result<S::Ok, S::Error> {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        // Printable runs are copied whole and escapes written by hand: a dump writes every
        // payload through here, and a `format!` per `\r` and `\n` of every head took a fifth
        // of a dump's writing time (`retry-bench recorder`: 1.21–1.28 → 0.97–0.98 s).
        let mut out = Vec::with_capacity(b.len() + 16);
        let mut rest: &[u8] = b;
        while !rest.is_empty() {
            let run = rest
                .iter()
                .position(|&c| c == b'\\' || !(0x20..=0x7e).contains(&c))
                .unwrap_or(rest.len());
            let (printable, tail) = rest.split_at(run);
            out.extend_from_slice(printable);
            let Some((&c, tail)) = tail.split_first() else {
                break;
            };
            if c == b'\\' {
                out.extend_from_slice(b"\\\\");
            } else {
                out.extend_from_slice(&[
                    b'\\',
                    b'x',
                    HEX[usize::from(c >> 4)],
                    HEX[usize::from(c & 0xf)],
                ]);
            }
            rest = tail;
        }
        // Only printable ASCII was written.
        s.serialize_str(std::str::from_utf8(&out).unwrap_or_default())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        let s = String::deserialize(d)?;
        let mut out = Vec::with_capacity(s.len());
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'\\' {
                match b.get(i + 1) {
                    Some(b'\\') => {
                        out.push(b'\\');
                        i += 2;
                    }
                    Some(b'x') => {
                        let hex = s
                            .get(i + 2..i + 4)
                            .ok_or_else(|| D::Error::custom("short \\x escape"))?;
                        out.push(u8::from_str_radix(hex, 16).map_err(D::Error::custom)?);
                        i += 4;
                    }
                    _ => return Err(D::Error::custom("bad escape in payload")),
                }
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        Ok(Bytes::from(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_round_trips_through_json() {
        let ev = Event::Data(DataEvent {
            conn: ConnId {
                pid: 1,
                fd: 3,
                generation: 7,
            },
            role: Role::Client,
            direction: Direction::Egress,
            syscall: Syscall::Write,
            tuple: None,
            pid: 1,
            tid: 2,
            goid: None,
            interleaved: false,
            ts_enter_ns: 10,
            ts_exit_ns: 11,
            len: 6,
            payload: Bytes::from_static(b"GET \\\x00\xff"),
        });
        let s = serde_json::to_string(&ev).unwrap();
        assert!(s.contains(r#"GET \\\\\\x00\\xff"#), "{s}");
        let back: Event = serde_json::from_str(&s).unwrap();
        assert_eq!(back, ev);
    }

    /// Every octet, in runs and alone, at the ends and between printable runs, comes back;
    /// the encoding is the one dumps have always had (`\\`, `\xNN`, the rest as is).
    #[test]
    fn every_octet_round_trips_in_the_dump_encoding() {
        let mut all: Vec<u8> = (0..=255u8).collect();
        all.extend_from_slice(b"GET / HTTP/1.1\r\n");
        all.extend((0..=255u8).rev().flat_map(|c| [c, b'a', c, c]));
        let b = Bytes::from(all);
        let text = bytes_serde::serialize(&b, serde_json::value::Serializer).unwrap();
        let text = text.as_str().unwrap();
        assert!(text.bytes().all(|c| (0x20..=0x7e).contains(&c)), "{text}");
        assert!(text.starts_with(r"\x00\x01"), "{text}");
        assert!(
            text.contains(r"HTTP/1.1\x0d\x0a") && text.contains(r" !"),
            "{text}"
        );
        assert!(
            text.contains(r"\\a\\\\") && text.ends_with(r"\x00a\x00\x00"),
            "{text}"
        );
        let back = bytes_serde::deserialize(serde_json::Value::from(text)).unwrap();
        assert_eq!(back, b);
    }
}
