//! Kernel capture against real traffic: `cargo test -p integration-tests --test capture` as root.
//! Each test loads the eBPF programs in-process (`Capture::load`), drives Python/curl traffic over
//! loopback or a veth pair between two namespaces it creates, and checks the decoded events.
use std::{
    collections::HashSet,
    process::Stdio,
    time::Duration,
};

use integration_tests::capture::{NetnsPair, Proc, can_run, collect, free_port, load, load_with, python, wait_listening};
use retry_agent::capture::{ConnEvent, ConnEventKind, DataEvent, Direction, Event, Role, Syscall};

const ECONNREFUSED: i32 = 111;
const ECONNRESET: i32 = 104;
const EINPROGRESS: i32 = 115;

/// Threaded HTTP server; each response names the serving thread (X-Tid) so the test can check
/// the tid the kernel reported.
const SERVER_PY: &str = r#"
import socket, sys, threading, http.server
if ":" in sys.argv[1]:
    http.server.ThreadingHTTPServer.address_family = socket.AF_INET6
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello " + self.path.encode()
        self.send_response(200)
        self.send_header("X-Tid", str(threading.get_native_id()))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), H).serve_forever()
"#;

const CLIENT_PY: &str = r#"
import sys, http.client
c = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=5)
c.request("GET", sys.argv[3])
r = c.getresponse()
assert r.status == 200, r.status
r.read()
"#;

fn data_events(evs: &[Event]) -> Vec<&DataEvent> {
    evs.iter().filter_map(|e| if let Event::Data(d) = e { Some(d) } else { None }).collect()
}

fn conn_events(evs: &[Event]) -> Vec<&ConnEvent> {
    evs.iter().filter_map(|e| if let Event::Conn(c) = e { Some(c) } else { None }).collect()
}

fn starts(d: &DataEvent, prefix: &[u8]) -> bool {
    d.payload.starts_with(prefix)
}

fn dump(evs: &[Event]) -> String {
    evs.iter().map(|e| serde_json::to_string(e).unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

/// Tid of the server thread that answered, from the response's X-Tid header.
fn x_tid(d: &DataEvent) -> Option<u32> {
    let text = String::from_utf8_lossy(&d.payload);
    text.lines().find_map(|l| l.strip_prefix("X-Tid: ")).and_then(|v| v.trim().parse().ok())
}

/// Checks one HTTP exchange end to end: connect/accept tuples mirror each other; request bytes on
/// the client's write and the server's read; response bytes on the server's write and the
/// client's read; pids, tids, roles and directions.
fn assert_exchange(evs: &[Event], client: u32, server: u32, path: &str) {
    let ctx = || dump(evs);
    let conns = conn_events(evs);
    let req = format!("GET {path} ");
    let data = data_events(evs);

    // The client's request write identifies its connection.
    let c_req = data
        .iter()
        .find(|d| d.pid == client && d.direction == Direction::Egress && starts(d, req.as_bytes()))
        .unwrap_or_else(|| panic!("no client write of {req:?}\n{}", ctx()));
    assert_eq!(c_req.role, Role::Client);
    assert_eq!(c_req.tid, client, "single-threaded client writes from its main thread");
    assert!(c_req.ts_enter_ns <= c_req.ts_exit_ns);
    let c_tuple = c_req.tuple.unwrap_or_else(|| panic!("client write without tuple\n{}", ctx()));

    let connect = conns
        .iter()
        .find(|c| c.conn == c_req.conn)
        .unwrap_or_else(|| panic!("no connect event for {:?}\n{}", c_req.conn, ctx()));
    assert!(matches!(connect.kind, ConnEventKind::Connect { errno: 0 | EINPROGRESS }), "{:?}", connect.kind);
    assert_eq!(connect.role, Role::Client);
    assert_eq!(connect.pid, client);
    assert_eq!(connect.tuple, Some(c_tuple), "connect tuple = data tuple");

    let accept = conns
        .iter()
        .find(|c| c.pid == server && c.kind == ConnEventKind::Accept && c.tuple.map(|t| t.remote) == Some(c_tuple.local))
        .unwrap_or_else(|| panic!("no accept from {}\n{}", c_tuple.local, ctx()));
    let s_tuple = accept.tuple.unwrap_or_else(|| panic!("accept without tuple"));
    assert_eq!((s_tuple.local, s_tuple.remote), (c_tuple.remote, c_tuple.local), "tuples mirror");
    assert_eq!(accept.role, Role::Server);

    let s_req = data
        .iter()
        .find(|d| d.conn == accept.conn && d.direction == Direction::Ingress && starts(d, req.as_bytes()))
        .unwrap_or_else(|| panic!("no server read of {req:?}\n{}", ctx()));
    assert_eq!((s_req.pid, s_req.role, s_req.tuple), (server, Role::Server, Some(s_tuple)));

    let s_resp = data
        .iter()
        .find(|d| d.conn == accept.conn && d.direction == Direction::Egress && starts(d, b"HTTP/1.0 200"))
        .unwrap_or_else(|| panic!("no server write of the response\n{}", ctx()));
    assert_eq!((s_resp.pid, s_resp.role), (server, Role::Server));
    let tid = x_tid(s_resp).unwrap_or_else(|| panic!("no X-Tid in {:?}", s_resp.payload));
    assert_eq!(s_resp.tid, tid, "server write from the handler thread");
    assert_eq!(s_req.tid, tid, "server read from the handler thread");
    assert_ne!(tid, server, "ThreadingHTTPServer handles in a worker thread");

    let c_resp = data
        .iter()
        .find(|d| d.conn == c_req.conn && d.direction == Direction::Ingress && starts(d, b"HTTP/1.0 200"))
        .unwrap_or_else(|| panic!("no client read of the response\n{}", ctx()));
    assert_eq!((c_resp.pid, c_resp.tid, c_resp.role), (client, client, Role::Client));
    assert_eq!(x_tid(c_resp), Some(tid), "client read the bytes the server wrote");

    // Bodies too, wherever they were read.
    let body = format!("hello {path}");
    assert!(
        data.iter().any(|d| d.conn == c_req.conn
            && d.direction == Direction::Ingress
            && String::from_utf8_lossy(&d.payload).contains(&body)),
        "client read the body {body:?}\n{}",
        ctx()
    );
}

fn involving(pids: &[u32]) -> impl FnMut(&Event) -> bool + use<> {
    let pids: HashSet<u32> = pids.iter().copied().collect();
    move |e| pids.contains(&e.pid())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_http_curl_and_python_client() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load() else { return };
    let port = free_port();
    let ps = port.to_string();
    let server = Proc::spawn(python(SERVER_PY, &["127.0.0.1", &ps]).stdout(Stdio::null()));
    wait_listening(&format!("127.0.0.1:{port}"), None);

    let mut curl = Proc::spawn(
        std::process::Command::new("curl")
            .args(["-s", "-o", "/dev/null", &format!("http://127.0.0.1:{port}/via-curl")]),
    );
    let mut py = Proc::spawn(&mut python(CLIENT_PY, &["127.0.0.1", &ps, "/via-python"]));
    assert!(curl.wait(Duration::from_secs(10)).success());
    assert!(py.wait(Duration::from_secs(10)).success());

    let pids = [server.pid(), curl.pid(), py.pid()];
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&pids), |_| false).await;
    assert_exchange(&evs, curl.pid(), server.pid(), "/via-curl");
    assert_exchange(&evs, py.pid(), server.pid(), "/via-python");

    // Process metadata precedes each pid's first event.
    for (pid, comm) in [(curl.pid(), "curl"), (server.pid(), "python3")] {
        let first = evs.iter().position(|e| e.pid() == pid).unwrap_or(usize::MAX);
        match evs.get(first) {
            Some(Event::Process(p)) => assert!(p.comm.starts_with(comm), "{p:?}"),
            other => panic!("first event of {pid} is not Process: {other:?}"),
        }
    }
    let st = cap.stats();
    assert_eq!(st.decode_errors, 0, "{st:?}");
    assert!(st.events as usize >= evs.len(), "{st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_ipv6() {
    if !can_run() {
        return;
    }
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("skip: no IPv6 loopback");
        return;
    }
    let Some(mut cap) = load() else { return };
    let port = free_port();
    let ps = port.to_string();
    let server = Proc::spawn(python(SERVER_PY, &["::1", &ps]).stdout(Stdio::null()));
    wait_listening(&format!("[::1]:{port}"), None);
    let mut curl = Proc::spawn(
        std::process::Command::new("curl").args(["-s", "-o", "/dev/null", &format!("http://[::1]:{port}/v6")]),
    );
    assert!(curl.wait(Duration::from_secs(10)).success());
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&[server.pid(), curl.pid()]), |_| false).await;
    assert_exchange(&evs, curl.pid(), server.pid(), "/v6");
    let t = data_events(&evs).into_iter().find(|d| d.pid == curl.pid()).and_then(|d| d.tuple).expect("tuple");
    assert_eq!(t.remote, format!("[::1]:{port}").parse().unwrap());
    assert!(t.local.is_ipv6());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_capture_unloads_every_program() {
    if !can_run() {
        return;
    }
    let Some(cap) = load() else { return };
    let ours = cap.program_ids();
    assert!(ours.len() >= 30, "every program loaded: {ours:?}");
    let before = retry_agent::capture::loaded_program_ids();
    assert!(ours.iter().all(|id| before.contains(id)));
    // Split like the pipeline does: the receiver alone does not keep anything loaded.
    let (guard, rx, _stats) = cap.into_parts();
    drop(guard);
    drop(rx);
    // The reader task is aborted asynchronously; its ring-buffer fd goes with it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = retry_agent::capture::loaded_program_ids();
    let left: Vec<_> = ours.iter().filter(|id| after.contains(id)).collect();
    assert!(left.is_empty(), "programs still loaded after drop: {left:?}");
}

const DUP_PY: &str = r#"
import os, socket, sys, tempfile
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
fd = s.fileno()
s.sendall(b"BEFORE-CLOSE"); s.recv(64)
# Close the socket's fd behind a dup2 of a regular file onto it: the number now names a file.
f = open(tempfile.mktemp(prefix="racap"), "wb+")
os.dup2(f.fileno(), fd)
os.write(fd, b"FILE-AFTER-DUP2")
os.unlink(f.name)
print(fd, flush=True)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fd_reused_for_a_file_is_not_traced() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load() else { return };
    let port = free_port();
    let echo = Proc::spawn(python(ECHO_PY, &[&port.to_string()]).stdout(Stdio::null()));
    wait_listening(&format!("127.0.0.1:{port}"), None);
    let mut p = Proc::spawn(python(DUP_PY, &[&port.to_string()]).stdout(Stdio::piped()));
    let fd: u32 = p.read_line().trim().parse().expect("fd");
    assert!(p.wait(Duration::from_secs(10)).success());
    let evs = collect(&mut cap, Duration::from_secs(2), involving(&[p.pid(), echo.pid()]), |_| false).await;
    let data = data_events(&evs);
    let before = data.iter().find(|d| d.pid == p.pid() && d.payload.starts_with(b"BEFORE-CLOSE"));
    let conn = before.unwrap_or_else(|| panic!("TCP write captured\n{}", dump(&evs))).conn;
    assert_eq!(conn.fd, fd);
    assert!(
        !data.iter().any(|d| d.payload.starts_with(b"FILE-AFTER-DUP2")),
        "file write through a reused fd number was traced\n{}",
        dump(&evs)
    );
    assert!(
        conn_events(&evs).iter().any(|c| c.conn == conn && c.kind == ConnEventKind::Close),
        "dup2 over the socket ends the connection\n{}",
        dump(&evs)
    );
}

/// A server that accepts like libuv (Node): accept4(fd, NULL, NULL, flags), no peer buffer.
const NULL_ACCEPT_SERVER_PY: &str = r#"
import ctypes, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(4)
print("ready", flush=True)
fd = libc.accept4(s.fileno(), None, None, 0)
assert fd >= 0, ctypes.get_errno()
req = os.read(fd, 64)
os.write(fd, b"NULLACCEPT-REPLY:" + req)
os.close(fd)
"#;

const ONE_SHOT_CLIENT_PY: &str = r#"
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(sys.argv[2].encode())
assert s.recv(128).startswith(b"NULLACCEPT-REPLY:")
s.close()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_without_peer_buffer_is_tracked() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load() else { return };
    let port = free_port();
    let mut server = Proc::spawn(python(NULL_ACCEPT_SERVER_PY, &[&port.to_string()]).stdout(Stdio::piped()));
    assert_eq!(server.read_line().trim(), "ready");
    let mut client = Proc::spawn(&mut python(ONE_SHOT_CLIENT_PY, &[&port.to_string(), "NULLACCEPT-REQ"]));
    assert!(client.wait(Duration::from_secs(10)).success());
    let _ = server.wait(Duration::from_secs(10));
    let evs = collect(&mut cap, Duration::from_secs(2), involving(&[server.pid(), client.pid()]), |_| false).await;
    let ctx = || dump(&evs);
    let accept = conn_events(&evs)
        .into_iter()
        .find(|c| c.pid == server.pid() && c.kind == ConnEventKind::Accept)
        .unwrap_or_else(|| panic!("accept(NULL) not seen\n{}", ctx()));
    let t = accept.tuple.expect("tuple from the socket");
    assert_eq!(t.local.port(), port);
    let c_local = data_events(&evs)
        .into_iter()
        .find(|d| d.pid == client.pid() && d.direction == Direction::Egress)
        .and_then(|d| d.tuple)
        .map(|t| t.local);
    assert_eq!(Some(t.remote), c_local, "server's remote is the client's local address");
    let data = data_events(&evs);
    let read = data
        .iter()
        .find(|d| d.conn == accept.conn && d.syscall == Syscall::Read)
        .unwrap_or_else(|| panic!("server read not captured\n{}", ctx()));
    assert_eq!((&read.payload[..], read.role, read.direction), (&b"NULLACCEPT-REQ"[..], Role::Server, Direction::Ingress));
    assert!(data.iter().any(|d| d.conn == accept.conn && d.syscall == Syscall::Write && d.payload.starts_with(b"NULLACCEPT-REPLY:")));
}

const BIG_WRITE_PY: &str = r#"
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
body = bytes(i % 251 for i in range(10000))
s.sendall(body)
got = b""
while len(got) < len(body) + 5:
    got += s.recv(65536)
s.close()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_prefix_size_is_configurable_up_to_4k() {
    if !can_run() {
        return;
    }
    let cfg = retry_agent::capture::CaptureConfig { payload_bytes: 4096, ..Default::default() };
    let Some(mut cap) = load_with(&cfg) else { return };
    let port = free_port();
    let echo = Proc::spawn(python(ECHO_PY, &[&port.to_string()]).stdout(Stdio::null()));
    wait_listening(&format!("127.0.0.1:{port}"), None);
    let mut client = Proc::spawn(&mut python(BIG_WRITE_PY, &[&port.to_string()]));
    assert!(client.wait(Duration::from_secs(10)).success());
    let evs = collect(&mut cap, Duration::from_secs(2), involving(&[client.pid(), echo.pid()]), |_| false).await;
    let w = data_events(&evs)
        .into_iter()
        .find(|d| d.pid == client.pid() && d.direction == Direction::Egress)
        .unwrap_or_else(|| panic!("big write not captured\n{}", dump(&evs)));
    assert_eq!(w.len, 10000);
    assert_eq!(w.payload.len(), 4096, "prefix is the configured size");
    assert!(w.payload.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8), "prefix bytes are the first bytes");
    assert!(!w.is_complete());
}

const EXEC_PY: &str = r#"
import os, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"BEFORE-EXEC"); s.recv(64)
fd = s.fileno()
os.set_inheritable(fd, True)
os.execv("/bin/sh", ["sh", "-c", f"printf AFTER-EXEC >&{fd}; sleep 1"])
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_re_describes_the_process() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load() else { return };
    let port = free_port();
    let _echo = Proc::spawn(python(ECHO_PY, &[&port.to_string()]).stdout(Stdio::null()));
    wait_listening(&format!("127.0.0.1:{port}"), None);
    let mut p = Proc::spawn(&mut python(EXEC_PY, &[&port.to_string()]));
    assert!(p.wait(Duration::from_secs(10)).success());
    let pid = p.pid();
    let evs = collect(&mut cap, Duration::from_secs(2), involving(&[pid]), |_| false).await;
    let ctx = || dump(&evs);
    let pos = |f: &dyn Fn(&Event) -> bool| evs.iter().position(|e| f(e));
    let before = pos(&|e| matches!(e, Event::Data(d) if d.payload.starts_with(b"BEFORE-EXEC")));
    let after = pos(&|e| matches!(e, Event::Data(d) if d.payload.starts_with(b"AFTER-EXEC")));
    let first_info = pos(&|e| matches!(e, Event::Process(_)));
    // The metadata after the exec: a Process event between the last pre-exec and the first
    // post-exec bytes. (The first one is read from /proc when the reader meets the pid, which
    // under load can already be after the exec, so its comm is not checked.)
    let sh_info = evs.iter().enumerate().position(|(i, e)| {
        matches!(e, Event::Process(p) if p.comm == "sh") && before.is_some_and(|b| i > b)
    });
    let (Some(before), Some(after), Some(first_info), Some(sh_info)) = (before, after, first_info, sh_info) else {
        panic!("missing events\n{}", ctx());
    };
    assert!(first_info < before && before < sh_info && sh_info < after, "order\n{}", ctx());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn veth_between_namespaces() {
    if !can_run() {
        return;
    }
    let Some(ns) = NetnsPair::create("h", 71) else { return };
    let Some(mut cap) = load() else { return };
    let port = 8080u16.to_string();
    let server = Proc::spawn(NetnsPair::exec(&ns.a, "python3").args(["-u", "-c", SERVER_PY, &ns.ip_a, &port]).stdout(Stdio::null()));
    wait_listening(&format!("{}:{port}", ns.ip_a), Some(&ns.b));
    let url = format!("http://{}:{port}/over-veth", ns.ip_a);
    let mut curl = Proc::spawn(NetnsPair::exec(&ns.b, "curl").args(["-s", "-o", "/dev/null", &url]));
    let mut py = Proc::spawn(NetnsPair::exec(&ns.b, "python3").args(["-c", CLIENT_PY, &ns.ip_a, &port, "/py-veth"]));
    assert!(curl.wait(Duration::from_secs(10)).success());
    assert!(py.wait(Duration::from_secs(10)).success());
    let pids = [server.pid(), curl.pid(), py.pid()];
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&pids), |_| false).await;
    assert_exchange(&evs, curl.pid(), server.pid(), "/over-veth");
    assert_exchange(&evs, py.pid(), server.pid(), "/py-veth");
    let c = data_events(&evs).into_iter().find(|d| d.pid == curl.pid()).map(|d| d.tuple);
    let want_remote = format!("{}:{port}", ns.ip_a).parse().ok();
    assert_eq!(c.flatten().map(|t| t.remote), want_remote, "curl talks to the other namespace");
    // Namespaces differ: the metadata says so.
    let netns = |pid: u32| {
        evs.iter().find_map(|e| match e {
            Event::Process(p) if p.pid == pid => p.netns,
            _ => None,
        })
    };
    assert!(netns(server.pid()).is_some());
    assert_ne!(netns(server.pid()), netns(curl.pid()));
}

/// Replies "ECHO:" + what it got, per recv, until the peer closes; serves connections one by one.
const ECHO_PY: &str = r#"
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(16)
while True:
    c, _ = s.accept()
    try:
        while True:
            b = c.recv(4096)
            if not b: break
            c.sendall(b"ECHO:" + b)
    except OSError:
        pass  # a client that exits with unread data resets the connection
    c.close()
"#;

const VECTORED_PY: &str = r#"
import os, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
os.writev(s.fileno(), [b"WRITEV-", b"PART2"])
a, b = bytearray(64), bytearray(64)
n = os.readv(s.fileno(), [a, b])
assert a.startswith(b"ECHO:WRITEV-"), a
s.sendmsg([b"SENDMSG-", b"X"])
data, _, _, _ = s.recvmsg(128)
assert data == b"ECHO:SENDMSG-X", data
# sendmmsg/recvmmsg through libc (Python has no wrapper): two messages out, one in.
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
class msghdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32), ("iov", ctypes.POINTER(iovec)),
                ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]
class mmsghdr(ctypes.Structure):
    _fields_ = [("hdr", msghdr), ("len", ctypes.c_uint)]
bufs = [ctypes.create_string_buffer(b"MMSG-ONE", 8), ctypes.create_string_buffer(b"MMSG-TWO!", 9)]
iovs = [iovec(ctypes.cast(b, ctypes.c_void_p), len(b.raw)) for b in bufs]
msgs = (mmsghdr * 2)()
for m, v in zip(msgs, iovs):
    m.hdr.iov = ctypes.pointer(v); m.hdr.iovlen = 1
assert libc.sendmmsg(s.fileno(), msgs, 2, 0) == 2, ctypes.get_errno()
want = b"ECHO:MMSG-ONEMMSG-TWO!"
got = b""
while len(got) < len(want):
    rb = ctypes.create_string_buffer(64)
    riov = iovec(ctypes.cast(rb, ctypes.c_void_p), 64)
    r = (mmsghdr * 1)()
    r[0].hdr.iov = ctypes.pointer(riov); r[0].hdr.iovlen = 1
    assert libc.recvmmsg(s.fileno(), r, 1, 0, None) == 1, ctypes.get_errno()
    # The echo may come as one reply or one per message: read until both are in.
    got += rb.raw[:r[0].len]
assert got.replace(b"ECHO:", b"").startswith(b"MMSG-ONE"), got
s.close()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vectored_and_msg_syscalls() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load() else { return };
    let port = free_port();
    let echo = Proc::spawn(python(ECHO_PY, &[&port.to_string()]).stdout(Stdio::null()));
    wait_listening(&format!("127.0.0.1:{port}"), None);
    let mut client = Proc::spawn(&mut python(VECTORED_PY, &[&port.to_string()]));
    assert!(client.wait(Duration::from_secs(10)).success(), "client script failed");
    let pids = [echo.pid(), client.pid()];
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&pids), |_| false).await;
    let data = data_events(&evs);
    let ctx = || dump(&evs);
    let find = |sc: Syscall| {
        data.iter()
            .find(|d| d.pid == client.pid() && d.syscall == sc)
            .unwrap_or_else(|| panic!("no {sc:?} from the client\n{}", ctx()))
    };
    let w = find(Syscall::Writev);
    assert_eq!((w.direction, w.len), (Direction::Egress, 12));
    // Every iovec up to the capture size: both parts, in order.
    assert_eq!(&w.payload[..], b"WRITEV-PART2");
    let r = find(Syscall::Readv);
    assert_eq!(r.direction, Direction::Ingress);
    assert!(r.payload.starts_with(b"ECHO:WRITEV-"), "{:?}", r.payload);
    let sm = find(Syscall::Sendmsg);
    assert_eq!((sm.direction, sm.len, &sm.payload[..]), (Direction::Egress, 9, &b"SENDMSG-X"[..]));
    let rm = find(Syscall::Recvmsg);
    assert_eq!((rm.direction, &rm.payload[..]), (Direction::Ingress, &b"ECHO:SENDMSG-X"[..]));
    let smm = find(Syscall::Sendmmsg);
    // First message only: its length and bytes.
    assert_eq!((smm.direction, smm.len, &smm.payload[..]), (Direction::Egress, 8, &b"MMSG-ONE"[..]));
    let rmm = find(Syscall::Recvmmsg);
    assert_eq!(rmm.direction, Direction::Ingress);
    assert!(rmm.payload.starts_with(b"ECHO:MMSG-ONE"), "{:?}", rmm.payload);
    assert_eq!(rmm.len as usize, rmm.payload.len());
    for d in [w, r, sm, rm, smm, rmm] {
        assert_eq!(d.role, Role::Client);
        assert_eq!(d.conn, w.conn, "all on one connection");
    }
    // The echo server saw the bytes with recvfrom (socket.recv).
    assert!(
        data.iter().any(|d| d.pid == echo.pid() && d.direction == Direction::Ingress && d.payload.starts_with(b"WRITEV-PART2")),
        "server read the whole writev\n{}",
        ctx()
    );
}

const MIXED_IO_PY: &str = r#"
import os, socket, sys, tempfile
path = tempfile.mktemp(prefix="racap")
with open(path, "wb") as f: f.write(b"FILEDATA-MARKER")
with open(path, "rb") as f: assert f.read() == b"FILEDATA-MARKER"
os.unlink(path)
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
a.send(b"UNIXDATA-MARKER"); assert b.recv(64) == b"UNIXDATA-MARKER"
os.writev(a.fileno(), [b"UNIXDATA-MARKER"]); b.recv(64)
r, w = os.pipe()
os.write(w, b"PIPEDATA-MARKER"); assert os.read(r, 64) == b"PIPEDATA-MARKER"
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.sendto(b"UDPDATA-MARKER", ("127.0.0.1", 9))
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print(s.fileno(), flush=True)
s.sendall(b"TCPDATA-MARKER"); s.recv(64)
s.close()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_unix_pipe_and_udp_io_are_filtered() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load() else { return };
    let port = free_port();
    let echo = Proc::spawn(python(ECHO_PY, &[&port.to_string()]).stdout(Stdio::null()));
    wait_listening(&format!("127.0.0.1:{port}"), None);
    let out = python(MIXED_IO_PY, &[&port.to_string()]).output().expect("running the mixed-I/O script");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let tcp_fd: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("fd printed");
    drop(echo);
    let evs = collect(&mut cap, Duration::from_secs(3), |e| matches!(e, Event::Data(_)), |_| false).await;
    let data = data_events(&evs);
    let marker = |d: &&&DataEvent, m: &str| String::from_utf8_lossy(&d.payload).contains(m);
    let tcp: Vec<_> = data.iter().filter(|d| marker(d, "TCPDATA-MARKER")).collect();
    assert!(!tcp.is_empty(), "the TCP write is captured (so the process was traced)");
    let client_pid = tcp.iter().find(|d| d.direction == Direction::Egress && d.role == Role::Client).map(|d| d.pid);
    let client_pid = client_pid.expect("client-side TCP write");
    for m in ["FILEDATA-MARKER", "UNIXDATA-MARKER", "PIPEDATA-MARKER", "UDPDATA-MARKER"] {
        let leaked: Vec<_> = data.iter().filter(|d| marker(d, m)).collect();
        assert!(leaked.is_empty(), "{m} leaked into data events: {leaked:?}");
    }
    for d in data.iter().filter(|d| d.pid == client_pid) {
        assert_eq!(d.conn.fd, tcp_fd, "only the TCP fd produces data events: {d:?}");
    }
}

const REFUSED_PY: &str = r#"
import errno, select, socket, sys
port = int(sys.argv[1])
s = socket.socket()
try:
    s.connect(("127.0.0.1", port)); sys.exit("connected?")
except ConnectionRefusedError:
    pass
s.close()
n = socket.socket(); n.setblocking(False)
rc = n.connect_ex(("127.0.0.1", port))
if rc == errno.EINPROGRESS:
    select.select([], [n], [], 5)
    rc = n.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
assert rc == errno.ECONNREFUSED, rc
n.close()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connect_reports_errno() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load() else { return };
    let port = free_port();
    let mut p = Proc::spawn(&mut python(REFUSED_PY, &[&port.to_string()]));
    assert!(p.wait(Duration::from_secs(10)).success(), "refused script failed");
    let evs = collect(&mut cap, Duration::from_secs(2), involving(&[p.pid()]), |_| false).await;
    let conns = conn_events(&evs);
    let to_port = |c: &&&ConnEvent| c.tuple.map(|t| t.remote.port()) == Some(port);
    let refused: Vec<_> = conns
        .iter()
        .filter(to_port)
        .filter(|c| {
            matches!(c.kind, ConnEventKind::Connect { errno: ECONNREFUSED } | ConnEventKind::Failed { errno: ECONNREFUSED })
        })
        .collect();
    // Blocking: connect() returns the errno. Non-blocking: either connect() already knows it or
    // the SYN_SENT -> CLOSE transition reports it (errno read from sk_err via BTF).
    assert!(refused.len() >= 2, "both connects report ECONNREFUSED\n{}", dump(&evs));
    assert!(refused.iter().all(|c| c.role == Role::Client && c.pid == p.pid()));
    assert!(data_events(&evs).is_empty(), "a refused connection moves no data");
}

const RESET_SERVER_PY: &str = r#"
import socket, struct, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(4)
print("ready", flush=True)
c, _ = s.accept()
c.recv(64)
c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
c.close()
"#;

const RESET_CLIENT_PY: &str = r#"
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"PLEASE-RESET")
try:
    s.recv(64); sys.exit("no reset")
except ConnectionResetError:
    pass
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_connection_reports_errno() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load() else { return };
    let port = free_port();
    // The server accepts once: it says when it listens instead of being probed.
    let mut server = Proc::spawn(python(RESET_SERVER_PY, &[&port.to_string()]).stdout(Stdio::piped()));
    assert_eq!(server.read_line().trim(), "ready");
    let mut client = Proc::spawn(&mut python(RESET_CLIENT_PY, &[&port.to_string()]));
    assert!(client.wait(Duration::from_secs(10)).success(), "client saw no reset");
    let _ = server.wait(Duration::from_secs(10));
    let evs = collect(&mut cap, Duration::from_secs(2), involving(&[client.pid(), server.pid()]), |_| false).await;
    let conns = conn_events(&evs);
    let client_conn = data_events(&evs)
        .into_iter()
        .find(|d| d.pid == client.pid() && d.payload.starts_with(b"PLEASE-RESET"))
        .map(|d| d.conn)
        .unwrap_or_else(|| panic!("client write not captured\n{}", dump(&evs)));
    let resets: Vec<_> = conns
        .iter()
        .filter(|c| c.conn == client_conn && c.kind == ConnEventKind::Reset { errno: ECONNRESET })
        .collect();
    assert!(!resets.is_empty(), "client connection reset with ECONNRESET\n{}", dump(&evs));
    assert!(resets.iter().all(|c| c.role == Role::Client && c.pid == client.pid()));
    // The server aborted its side (SO_LINGER 0): its connection ends in a reset too.
    assert!(
        conns.iter().any(|c| c.pid == server.pid() && matches!(c.kind, ConnEventKind::Reset { .. })),
        "server-side abort seen\n{}",
        dump(&evs)
    );
}

const LATE_SERVER_PY: &str = r#"
import os, socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(4)
print("ready", flush=True)
c, _ = s.accept()
# Not blocked in recv() while the agent attaches: a syscall entered before attach is not seen.
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
assert c.recv(64) == b"LATE-PING"
c.sendall(b"LATE-PONG")
c.recv(64)
"#;

const LATE_CLIENT_PY: &str = r#"
import os, socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print(s.fileno(), flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
s.sendall(b"LATE-PING")
assert s.recv(64) == b"LATE-PONG"
s.close()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_opened_before_start_is_attributed() {
    if !can_run() {
        return;
    }
    let port = free_port();
    let trigger = std::env::temp_dir().join(format!("racap-go-{port}"));
    let _ = std::fs::remove_file(&trigger);
    // The server says when it listens (a probe connection would be its one accept).
    let mut server = Proc::spawn(python(LATE_SERVER_PY, &[&port.to_string(), &trigger.to_string_lossy()]).stdout(Stdio::piped()));
    assert_eq!(server.read_line().trim(), "ready");
    let mut client = Proc::spawn(python(LATE_CLIENT_PY, &[&port.to_string(), &trigger.to_string_lossy()]).stdout(Stdio::piped()));
    // The client prints its fd once connected.
    let client_fd: u32 = client.read_line().trim().parse().expect("fd");

    let Some(mut cap) = load() else { return };
    std::fs::write(&trigger, b"go").expect("trigger");
    let status = client.wait(Duration::from_secs(10));
    let _ = std::fs::remove_file(&trigger);
    assert!(status.success());
    let evs = collect(&mut cap, Duration::from_secs(2), involving(&[client.pid(), server.pid()]), |_| false).await;
    let ctx = || dump(&evs);
    let conns = conn_events(&evs);
    let existing_client = conns
        .iter()
        .find(|c| c.pid == client.pid() && c.kind == ConnEventKind::Existing)
        .unwrap_or_else(|| panic!("client connection not picked up\n{}", ctx()));
    assert_eq!(existing_client.conn.fd, client_fd);
    assert_eq!(existing_client.role, Role::Client);
    let ct = existing_client.tuple.expect("tuple");
    assert_eq!(ct.remote.port(), port);
    let existing_server = conns
        .iter()
        .find(|c| c.pid == server.pid() && c.kind == ConnEventKind::Existing)
        .unwrap_or_else(|| panic!("server connection not picked up\n{}", ctx()));
    assert_eq!(existing_server.role, Role::Server, "local port is a listening port");
    let st = existing_server.tuple.expect("tuple");
    assert_eq!((st.local, st.remote), (ct.remote, ct.local));

    let data = data_events(&evs);
    let ping = data
        .iter()
        .find(|d| d.pid == client.pid() && d.payload.starts_with(b"LATE-PING"))
        .unwrap_or_else(|| panic!("client ping not captured\n{}", ctx()));
    assert_eq!((ping.conn, ping.role, ping.direction, ping.tuple), (existing_client.conn, Role::Client, Direction::Egress, Some(ct)));
    let got = data
        .iter()
        .find(|d| d.pid == server.pid() && d.payload.starts_with(b"LATE-PING"))
        .unwrap_or_else(|| panic!("server read not captured\n{}", ctx()));
    assert_eq!((got.conn, got.role, got.direction), (existing_server.conn, Role::Server, Direction::Ingress));
    assert!(data.iter().any(|d| d.pid == client.pid() && d.direction == Direction::Ingress && d.payload.starts_with(b"LATE-PONG")));
}
