//! Kernel capture against real traffic: `cargo test -p integration-tests --test capture` as root.
//! Each test loads the eBPF programs in-process (`Capture::load`), drives Python/curl traffic over
//! loopback or a veth pair between two namespaces it creates, and checks the decoded events.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use std::{process::Stdio, time::Duration};

use integration_tests::{
    altered,
    fixture::{
        NetnsPair, Proc, Ready, can_run, collect, conn_events, data_events, dump, free_port,
        involving, load, load_counting, load_summarizing, load_whole, load_with, python,
        python_server, serve, wait_listening,
    },
};
use retry_agent::capture::{
    Capture, CaptureConfig, CaptureError, ConnEvent, ConnEventKind, DataEvent, Direction, Event,
    GapReason, GoMode, Role, Syscall,
};

const ECONNREFUSED: i32 = 111;
const ECONNRESET: i32 = 104;
const EINPROGRESS: i32 = 115;

fn starts(d: &DataEvent, prefix: &[u8]) -> bool {
    d.payload.starts_with(prefix)
}

/// Tid of the server thread that answered, from the response's X-Tid header.
fn x_tid(d: &DataEvent) -> Option<u32> {
    let text = String::from_utf8_lossy(&d.payload);
    text.lines()
        .find_map(|l| l.strip_prefix("X-Tid: "))
        .and_then(|v| v.trim().parse().ok())
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
    assert_eq!(
        c_req.tid, client,
        "single-threaded client writes from its main thread"
    );
    assert!(c_req.ts_enter_ns <= c_req.ts_exit_ns);
    let c_tuple = c_req
        .tuple
        .unwrap_or_else(|| panic!("client write without tuple\n{}", ctx()));

    let connect = conns
        .iter()
        .find(|c| c.conn == c_req.conn)
        .unwrap_or_else(|| panic!("no connect event for {:?}\n{}", c_req.conn, ctx()));
    assert!(
        matches!(
            connect.kind,
            ConnEventKind::Connect {
                errno: 0 | EINPROGRESS
            }
        ),
        "{:?}",
        connect.kind
    );
    assert_eq!(connect.role, Role::Client);
    assert_eq!(connect.pid, client);
    assert_eq!(connect.tuple, Some(c_tuple), "connect tuple = data tuple");

    let accept = conns
        .iter()
        .find(|c| {
            c.pid == server
                && c.kind == ConnEventKind::Accept
                && c.tuple.map(|t| t.remote) == Some(c_tuple.local)
        })
        .unwrap_or_else(|| panic!("no accept from {}\n{}", c_tuple.local, ctx()));
    let s_tuple = accept
        .tuple
        .unwrap_or_else(|| panic!("accept without tuple"));
    assert_eq!(
        (s_tuple.local, s_tuple.remote),
        (c_tuple.remote, c_tuple.local),
        "tuples mirror"
    );
    assert_eq!(accept.role, Role::Server);

    let s_req = data
        .iter()
        .find(|d| {
            d.conn == accept.conn && d.direction == Direction::Ingress && starts(d, req.as_bytes())
        })
        .unwrap_or_else(|| panic!("no server read of {req:?}\n{}", ctx()));
    assert_eq!(
        (s_req.pid, s_req.role, s_req.tuple),
        (server, Role::Server, Some(s_tuple))
    );

    let s_resp = data
        .iter()
        .find(|d| {
            d.conn == accept.conn && d.direction == Direction::Egress && starts(d, b"HTTP/1.0 200")
        })
        .unwrap_or_else(|| panic!("no server write of the response\n{}", ctx()));
    assert_eq!((s_resp.pid, s_resp.role), (server, Role::Server));
    let tid = x_tid(s_resp).unwrap_or_else(|| panic!("no X-Tid in {:?}", s_resp.payload));
    assert_eq!(s_resp.tid, tid, "server write from the handler thread");
    assert_eq!(s_req.tid, tid, "server read from the handler thread");
    assert_ne!(
        tid, server,
        "ThreadingHTTPServer handles in a worker thread"
    );

    let c_resp = data
        .iter()
        .find(|d| {
            d.conn == c_req.conn && d.direction == Direction::Ingress && starts(d, b"HTTP/1.0 200")
        })
        .unwrap_or_else(|| panic!("no client read of the response\n{}", ctx()));
    assert_eq!(
        (c_resp.pid, c_resp.tid, c_resp.role),
        (client, client, Role::Client)
    );
    assert_eq!(
        x_tid(c_resp),
        Some(tid),
        "client read the bytes the server wrote"
    );

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_http_curl_and_python_client() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load_whole() else { return };
    let (server, port) = python_server("http_tid_server.py", &[]);
    let ps = port.to_string();

    let mut curl = Proc::spawn(std::process::Command::new("curl").args([
        "-s",
        "-o",
        "/dev/null",
        &format!("http://127.0.0.1:{port}/via-curl"),
    ]));
    let mut py = Proc::spawn(&mut python(
        "http_get_client.py",
        &["127.0.0.1", &ps, "/via-python"],
    ));
    assert!(curl.wait(Duration::from_secs(10)).success());
    assert!(py.wait(Duration::from_secs(10)).success());

    let pids = [server.pid(), curl.pid(), py.pid()];
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&pids), |_| {
        false
    })
    .await;
    assert_exchange(&evs, curl.pid(), server.pid(), "/via-curl");
    assert_exchange(&evs, py.pid(), server.pid(), "/via-python");

    // Process metadata precedes each pid's first event. A process reaped before the reader
    // reached its records (curl is short-lived; CI is busy) is described without a name first,
    // then named by its exit record: either way some description names it.
    for (pid, comm) in [(curl.pid(), "curl"), (server.pid(), "python3")] {
        let first = evs
            .iter()
            .position(|e| e.pid() == pid)
            .unwrap_or(usize::MAX);
        match evs.get(first) {
            Some(Event::Process(p)) => assert!(
                p.comm.starts_with(comm) || (p.comm.is_empty() && pid == curl.pid()),
                "{p:?}"
            ),
            other => panic!("first event of {pid} is not Process: {other:?}"),
        }
        assert!(
            evs.iter().any(
                |e| matches!(e, Event::Process(p) if p.pid == pid && p.comm.starts_with(comm))
            ),
            "no description of {pid} names it {comm:?}"
        );
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
    let Some(mut cap) = load_whole() else { return };
    let port = free_port();
    let ps = port.to_string();
    let server = Proc::spawn(python("http_tid_server.py", &[&ps, "::1"]).stdout(Stdio::null()));
    wait_listening(&format!("[::1]:{port}"), None);
    let mut curl = Proc::spawn(std::process::Command::new("curl").args([
        "-s",
        "-o",
        "/dev/null",
        &format!("http://[::1]:{port}/v6"),
    ]));
    assert!(curl.wait(Duration::from_secs(10)).success());
    let evs = collect(
        &mut cap,
        Duration::from_secs(3),
        involving(&[server.pid(), curl.pid()]),
        |_| false,
    )
    .await;
    assert_exchange(&evs, curl.pid(), server.pid(), "/v6");
    let t = data_events(&evs)
        .into_iter()
        .find(|d| d.pid == curl.pid())
        .and_then(|d| d.tuple)
        .expect("tuple");
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
    assert!(
        left.is_empty(),
        "programs still loaded after drop: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fd_reused_for_a_file_is_not_traced() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load() else { return };
    let (echo, port) = python_server("echo_server.py", &[]);
    let mut p =
        Proc::spawn(python("dup2_over_socket.py", &[&port.to_string()]).stdout(Stdio::piped()));
    let fd: u32 = p.read_line().trim().parse().expect("fd");
    assert!(p.wait(Duration::from_secs(10)).success());
    let evs = collect(
        &mut cap,
        Duration::from_secs(2),
        involving(&[p.pid(), echo.pid()]),
        |_| false,
    )
    .await;
    let data = data_events(&evs);
    let before = data
        .iter()
        .find(|d| d.pid == p.pid() && d.payload.starts_with(b"BEFORE-CLOSE"));
    let conn = before
        .unwrap_or_else(|| panic!("TCP write captured\n{}", dump(&evs)))
        .conn;
    assert_eq!(conn.fd, fd);
    assert!(
        !data
            .iter()
            .any(|d| d.payload.starts_with(b"FILE-AFTER-DUP2")),
        "file write through a reused fd number was traced\n{}",
        dump(&evs)
    );
    assert!(
        conn_events(&evs)
            .iter()
            .any(|c| c.conn == conn && c.kind == ConnEventKind::Close),
        "dup2 over the socket ends the connection\n{}",
        dump(&evs)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_without_peer_buffer_is_tracked() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load() else { return };
    let (mut server, port) = serve(python, "null_accept_server.py", &[], Ready::SaysReady);
    let mut client = Proc::spawn(&mut python(
        "one_shot_client.py",
        &[&port.to_string(), "NULLACCEPT-REQ"],
    ));
    assert!(client.wait(Duration::from_secs(10)).success());
    let _ = server.wait(Duration::from_secs(10));
    let evs = collect(
        &mut cap,
        Duration::from_secs(2),
        involving(&[server.pid(), client.pid()]),
        |_| false,
    )
    .await;
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
    assert_eq!(
        Some(t.remote),
        c_local,
        "server's remote is the client's local address"
    );
    let data = data_events(&evs);
    let read = data
        .iter()
        .find(|d| d.conn == accept.conn && d.syscall == Syscall::Read)
        .unwrap_or_else(|| panic!("server read not captured\n{}", ctx()));
    assert_eq!(
        (&read.payload[..], read.role, read.direction),
        (&b"NULLACCEPT-REQ"[..], Role::Server, Direction::Ingress)
    );
    assert!(data.iter().any(|d| d.conn == accept.conn
        && d.syscall == Syscall::Write
        && d.payload.starts_with(b"NULLACCEPT-REPLY:")));
}

/// A Python client writes 10,000 patterned bytes in one call to an echo server and reads them
/// back, under a capture loaded with `cfg`: the events of both, and (client, server) pids. None
/// where the test cannot run.
async fn big_write_echoed(
    cfg: &retry_agent::capture::CaptureConfig,
) -> Option<(Vec<Event>, u32, u32)> {
    if !can_run() {
        return None;
    }
    let mut cap = load_with(cfg)?;
    let (echo, port) = python_server("echo_server.py", &[]);
    let mut client = Proc::spawn(&mut python("big_write_client.py", &[&port.to_string()]));
    assert!(client.wait(Duration::from_secs(10)).success());
    let evs = collect(
        &mut cap,
        Duration::from_secs(2),
        involving(&[client.pid(), echo.pid()]),
        |_| false,
    )
    .await;
    Some((evs, client.pid(), echo.pid()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_prefix_size_is_configurable_up_to_4k() {
    let cfg = retry_agent::capture::CaptureConfig {
        payload_bytes: 4096,
        ..Default::default()
    };
    let Some((evs, client, _)) = big_write_echoed(&cfg).await else {
        return;
    };
    let w = data_events(&evs)
        .into_iter()
        .find(|d| d.pid == client && d.direction == Direction::Egress)
        .unwrap_or_else(|| panic!("big write not captured\n{}", dump(&evs)));
    assert_eq!(w.len, 10000);
    assert_eq!(w.payload.len(), 4096, "prefix is the configured size");
    assert!(
        w.payload
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i % 251) as u8),
        "prefix bytes are the first bytes"
    );
    assert!(!w.is_complete());
}

/// `--capture-response-bytes`: a server's writes and a client's reads take the response prefix,
/// the requests keep the payload prefix, on both ends of the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_prefix_is_configured_apart_from_requests() {
    let cfg = retry_agent::capture::CaptureConfig {
        payload_bytes: 4096,
        response_bytes: Some(512),
        ..Default::default()
    };
    let Some((evs, client, echo)) = big_write_echoed(&cfg).await else {
        return;
    };
    let data = data_events(&evs);
    let of = |pid: u32, dir: Direction| -> Vec<_> {
        data.iter()
            .filter(|d| d.pid == pid && d.direction == dir)
            .collect()
    };
    let request = of(client, Direction::Egress);
    let request = request
        .first()
        .unwrap_or_else(|| panic!("request not captured\n{}", dump(&evs)));
    assert_eq!(
        request.payload.len(),
        4096,
        "a request takes the payload prefix"
    );
    let read = of(echo, Direction::Ingress);
    assert!(
        read.iter().any(|d| d.payload.len() > 512),
        "the server's reads are requests: {:?}",
        read.iter()
            .map(|d| (d.len, d.payload.len()))
            .collect::<Vec<_>>()
    );
    for (side, pid, dir) in [
        ("the server's writes", echo, Direction::Egress),
        ("the client's reads", client, Direction::Ingress),
    ] {
        let recs = of(pid, dir);
        assert!(!recs.is_empty(), "{side} not captured\n{}", dump(&evs));
        for d in recs {
            let want = usize::try_from(d.len).unwrap_or(usize::MAX).min(512);
            assert_eq!(d.payload.len(), want, "{side} take the response prefix");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_re_describes_the_process() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load() else { return };
    let (_echo, port) = python_server("echo_server.py", &[]);
    let mut p = Proc::spawn(&mut python("exec_with_socket.py", &[&port.to_string()]));
    assert!(p.wait(Duration::from_secs(10)).success());
    let pid = p.pid();
    let evs = collect(&mut cap, Duration::from_secs(2), involving(&[pid]), |_| {
        false
    })
    .await;
    let ctx = || dump(&evs);
    let pos = |f: &dyn Fn(&Event) -> bool| evs.iter().position(f);
    let before = pos(&|e| matches!(e, Event::Data(d) if d.payload.starts_with(b"BEFORE-EXEC")));
    let after = pos(&|e| matches!(e, Event::Data(d) if d.payload.starts_with(b"AFTER-EXEC")));
    let first_info = pos(&|e| matches!(e, Event::Process(_)));
    // The metadata after the exec: a Process event between the last pre-exec and the first
    // post-exec bytes. (The first one is read from /proc when the reader meets the pid, which
    // under load can already be after the exec, so its comm is not checked.)
    let sh_info = evs.iter().enumerate().position(|(i, e)| {
        matches!(e, Event::Process(p) if p.comm == "sh") && before.is_some_and(|b| i > b)
    });
    let (Some(before), Some(after), Some(first_info), Some(sh_info)) =
        (before, after, first_info, sh_info)
    else {
        panic!("missing events\n{}", ctx());
    };
    assert!(
        first_info < before && before < sh_info && sh_info < after,
        "order\n{}",
        ctx()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn veth_between_namespaces() {
    if !can_run() {
        return;
    }
    let Some(ns) = NetnsPair::create("h", 71) else {
        return;
    };
    let Some(mut cap) = load_whole() else { return };
    let port = 8080u16.to_string();
    let server = Proc::spawn(
        NetnsPair::python(&ns.a, "http_tid_server.py", &[&port, &ns.ip_a]).stdout(Stdio::null()),
    );
    wait_listening(&format!("{}:{port}", ns.ip_a), Some(&ns.b));
    let url = format!("http://{}:{port}/over-veth", ns.ip_a);
    let mut curl =
        Proc::spawn(NetnsPair::exec(&ns.b, "curl").args(["-s", "-o", "/dev/null", &url]));
    let mut py = Proc::spawn(&mut NetnsPair::python(
        &ns.b,
        "http_get_client.py",
        &[&ns.ip_a, &port, "/py-veth"],
    ));
    assert!(curl.wait(Duration::from_secs(10)).success());
    assert!(py.wait(Duration::from_secs(10)).success());
    let pids = [server.pid(), curl.pid(), py.pid()];
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&pids), |_| {
        false
    })
    .await;
    assert_exchange(&evs, curl.pid(), server.pid(), "/over-veth");
    assert_exchange(&evs, py.pid(), server.pid(), "/py-veth");
    let c = data_events(&evs)
        .into_iter()
        .find(|d| d.pid == curl.pid())
        .map(|d| d.tuple);
    let want_remote = format!("{}:{port}", ns.ip_a).parse().ok();
    assert_eq!(
        c.flatten().map(|t| t.remote),
        want_remote,
        "curl talks to the other namespace"
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vectored_and_msg_syscalls() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load() else { return };
    let (echo, port) = python_server("echo_server.py", &[]);
    let mut client = Proc::spawn(&mut python("vectored_client.py", &[&port.to_string()]));
    assert!(
        client.wait(Duration::from_secs(10)).success(),
        "client script failed"
    );
    let pids = [echo.pid(), client.pid()];
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&pids), |_| {
        false
    })
    .await;
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
    assert_eq!(
        (sm.direction, sm.len, &sm.payload[..]),
        (Direction::Egress, 9, &b"SENDMSG-X"[..])
    );
    let rm = find(Syscall::Recvmsg);
    assert_eq!(
        (rm.direction, &rm.payload[..]),
        (Direction::Ingress, &b"ECHO:SENDMSG-X"[..])
    );
    let smm = find(Syscall::Sendmmsg);
    // First message only: its length and bytes.
    assert_eq!(
        (smm.direction, smm.len, &smm.payload[..]),
        (Direction::Egress, 8, &b"MMSG-ONE"[..])
    );
    let rmm = find(Syscall::Recvmmsg);
    assert_eq!(rmm.direction, Direction::Ingress);
    assert!(
        rmm.payload.starts_with(b"ECHO:MMSG-ONE"),
        "{:?}",
        rmm.payload
    );
    assert_eq!(rmm.len as usize, rmm.payload.len());
    for d in [w, r, sm, rm, smm, rmm] {
        assert_eq!(d.role, Role::Client);
        assert_eq!(d.conn, w.conn, "all on one connection");
    }
    // The echo server saw the bytes with recvfrom (socket.recv).
    assert!(
        data.iter().any(|d| d.pid == echo.pid()
            && d.direction == Direction::Ingress
            && d.payload.starts_with(b"WRITEV-PART2")),
        "server read the whole writev\n{}",
        ctx()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_unix_pipe_and_udp_io_are_filtered() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load() else { return };
    let (echo, port) = python_server("echo_server.py", &[]);
    let out = python("mixed_io_client.py", &[&port.to_string()])
        .output()
        .expect("running the mixed-I/O script");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tcp_fd: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("fd printed");
    drop(echo);
    let evs = collect(
        &mut cap,
        Duration::from_secs(3),
        |e| matches!(e, Event::Data(_)),
        |_| false,
    )
    .await;
    let data = data_events(&evs);
    let marker = |d: &&&DataEvent, m: &str| String::from_utf8_lossy(&d.payload).contains(m);
    let tcp: Vec<_> = data
        .iter()
        .filter(|d| marker(d, "TCPDATA-MARKER"))
        .collect();
    assert!(
        !tcp.is_empty(),
        "the TCP write is captured (so the process was traced)"
    );
    let client_pid = tcp
        .iter()
        .find(|d| d.direction == Direction::Egress && d.role == Role::Client)
        .map(|d| d.pid);
    let client_pid = client_pid.expect("client-side TCP write");
    for m in [
        "FILEDATA-MARKER",
        "UNIXDATA-MARKER",
        "PIPEDATA-MARKER",
        "UDPDATA-MARKER",
    ] {
        let leaked: Vec<_> = data.iter().filter(|d| marker(d, m)).collect();
        assert!(leaked.is_empty(), "{m} leaked into data events: {leaked:?}");
    }
    for d in data.iter().filter(|d| d.pid == client_pid) {
        assert_eq!(
            d.conn.fd, tcp_fd,
            "only the TCP fd produces data events: {d:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connect_reports_errno() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load() else { return };
    let port = free_port();
    let mut p = Proc::spawn(&mut python("refused_connect.py", &[&port.to_string()]));
    assert!(
        p.wait(Duration::from_secs(10)).success(),
        "refused script failed"
    );
    let evs = collect(
        &mut cap,
        Duration::from_secs(2),
        involving(&[p.pid()]),
        |_| false,
    )
    .await;
    let conns = conn_events(&evs);
    let to_port = |c: &&&ConnEvent| c.tuple.map(|t| t.remote.port()) == Some(port);
    let refused: Vec<_> = conns
        .iter()
        .filter(to_port)
        .filter(|c| {
            matches!(
                c.kind,
                ConnEventKind::Connect {
                    errno: ECONNREFUSED
                } | ConnEventKind::Failed {
                    errno: ECONNREFUSED
                }
            )
        })
        .collect();
    // Blocking: connect() returns the errno. Non-blocking: either connect() already knows it or
    // the SYN_SENT -> CLOSE transition reports it (errno read from sk_err via BTF).
    assert!(
        refused.len() >= 2,
        "both connects report ECONNREFUSED\n{}",
        dump(&evs)
    );
    assert!(
        refused
            .iter()
            .all(|c| c.role == Role::Client && c.pid == p.pid())
    );
    assert!(
        data_events(&evs).is_empty(),
        "a refused connection moves no data"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_connection_reports_errno() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load() else { return };
    // The server accepts once: it says when it listens instead of being probed.
    let (mut server, port) = serve(python, "reset_server.py", &[], Ready::SaysReady);
    let mut client = Proc::spawn(&mut python("reset_client.py", &[&port.to_string()]));
    assert!(
        client.wait(Duration::from_secs(10)).success(),
        "client saw no reset"
    );
    let _ = server.wait(Duration::from_secs(10));
    let evs = collect(
        &mut cap,
        Duration::from_secs(2),
        involving(&[client.pid(), server.pid()]),
        |_| false,
    )
    .await;
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
    assert!(
        !resets.is_empty(),
        "client connection reset with ECONNRESET\n{}",
        dump(&evs)
    );
    assert!(
        resets
            .iter()
            .all(|c| c.role == Role::Client && c.pid == client.pid())
    );
    // The server aborted its side (SO_LINGER 0): its connection ends in a reset too.
    assert!(
        conns
            .iter()
            .any(|c| c.pid == server.pid() && matches!(c.kind, ConnEventKind::Reset { .. })),
        "server-side abort seen\n{}",
        dump(&evs)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_opened_before_start_is_attributed() {
    if !can_run() {
        return;
    }
    let trigger = std::env::temp_dir().join(format!("racap-go-{}", std::process::id()));
    let _ = std::fs::remove_file(&trigger);
    // The server says when it listens (a probe connection would be its one accept).
    let (server, port) = serve(
        python,
        "late_server.py",
        &[&trigger.to_string_lossy()],
        Ready::SaysReady,
    );
    let mut client = Proc::spawn(
        python(
            "late_client.py",
            &[&port.to_string(), &trigger.to_string_lossy()],
        )
        .stdout(Stdio::piped()),
    );
    // The client prints its fd once connected.
    let client_fd: u32 = client.read_line().trim().parse().expect("fd");

    let Some(mut cap) = load() else { return };
    std::fs::write(&trigger, b"go").expect("trigger");
    let status = client.wait(Duration::from_secs(10));
    let _ = std::fs::remove_file(&trigger);
    assert!(status.success());
    let evs = collect(
        &mut cap,
        Duration::from_secs(2),
        involving(&[client.pid(), server.pid()]),
        |_| false,
    )
    .await;
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
    assert_eq!(
        existing_server.role,
        Role::Server,
        "local port is a listening port"
    );
    let st = existing_server.tuple.expect("tuple");
    assert_eq!((st.local, st.remote), (ct.remote, ct.local));

    let data = data_events(&evs);
    let ping = data
        .iter()
        .find(|d| d.pid == client.pid() && d.payload.starts_with(b"LATE-PING"))
        .unwrap_or_else(|| panic!("client ping not captured\n{}", ctx()));
    assert_eq!(
        (ping.conn, ping.role, ping.direction, ping.tuple),
        (
            existing_client.conn,
            Role::Client,
            Direction::Egress,
            Some(ct)
        )
    );
    let got = data
        .iter()
        .find(|d| d.pid == server.pid() && d.payload.starts_with(b"LATE-PING"))
        .unwrap_or_else(|| panic!("server read not captured\n{}", ctx()));
    assert_eq!(
        (got.conn, got.role, got.direction),
        (existing_server.conn, Role::Server, Direction::Ingress)
    );
    assert!(data.iter().any(|d| d.pid == client.pid()
        && d.direction == Direction::Ingress
        && d.payload.starts_with(b"LATE-PONG")));
}

/// `--capture-go auto` measures what a uprobe hit costs here (a real uprobe on the agent's own
/// function, in its own process) and keeps the Go uprobes only under the limit: a limit of 0 µs
/// turns them off, a limit of a second keeps them; `true` and `false` measure nothing (TLS off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_uprobes_auto_follow_the_measured_uprobe_cost() {
    if !can_run() {
        return;
    }
    use retry_agent::capture::{CaptureConfig, GoMode};
    for (mode, max_us, want_on) in [
        (GoMode::Auto, 0, false),
        (GoMode::Auto, 1_000_000, true),
        (GoMode::On, 0, true),
        (GoMode::Off, 1_000_000, false),
    ] {
        let cfg = CaptureConfig {
            go: mode,
            go_max_uprobe_us: max_us,
            ..CaptureConfig::default()
        };
        let Some(cap) = load_with(&cfg) else { return };
        let cost = cap.uprobe_cost();
        eprintln!("{mode:?} max {max_us} µs: one uprobe hit costs {cost:?}");
        assert_eq!(
            cap.go_enabled(),
            want_on,
            "{mode:?} max {max_us} µs, cost {cost:?}"
        );
        match mode {
            GoMode::Auto => {
                let c = cost.expect("auto measures the cost");
                assert!(
                    c > Duration::ZERO && c < Duration::from_millis(10),
                    "a uprobe hit costs {c:?}?"
                );
            }
            _ => assert_eq!(cost, None, "{mode:?} measures nothing"),
        }
        drop(cap);
    }
}

/// `--capture-summarize` loses nothing: a quiet exchange arrives as one summary, and a request
/// the kernel held when its server died (no answer, no close syscall: the process exited) is
/// reported before the exit, so the crash is an exchange without an answer on both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_request_is_reported_when_its_server_dies() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load_summarizing() else {
        return;
    };
    let (mut server, port) = python_server("dying_server.py", &[]);
    // One connection: /ok is answered, /die kills the server mid-request.
    let mut curl = Proc::spawn(
        std::process::Command::new("curl")
            .args(["-s", "-o", "/dev/null", "--max-time", "5"])
            .arg(format!("http://127.0.0.1:{port}/ok"))
            .arg(format!("http://127.0.0.1:{port}/die"))
            .stdout(Stdio::null()),
    );
    let _ = curl.wait(Duration::from_secs(10));
    assert!(
        !server.wait(Duration::from_secs(5)).success(),
        "the server died"
    );
    let evs = collect(
        &mut cap,
        Duration::from_secs(2),
        involving(&[curl.pid(), server.pid()]),
        |_| false,
    )
    .await;
    let summarised: Vec<_> = evs
        .iter()
        .filter_map(|e| match e {
            Event::Summary(s) => Some((s.request.pid, s.request.payload.clone())),
            _ => None,
        })
        .collect();
    for pid in [curl.pid(), server.pid()] {
        assert_eq!(
            summarised
                .iter()
                .filter(|(p, line)| *p == pid && line.starts_with(b"GET /ok "))
                .count(),
            1,
            "{summarised:?}\n{}",
            dump(&evs)
        );
    }
    let d = integration_tests::correlate::derive(&evs, Default::default());
    for (pid, role) in [(curl.pid(), Role::Client), (server.pid(), Role::Server)] {
        let died: Vec<_> = d
            .exchanges
            .values()
            .filter(|x| x.pid == pid && x.role == role && x.path.as_deref() == Some("/die"))
            .collect();
        // curl tries a request that met a dead reused connection once more on a new one,
        // which may still be accepted by the dying server's backlog: one or two on its side.
        let expected = match role {
            Role::Client => 1..=2,
            _ => 1..=1,
        };
        assert!(
            expected.contains(&died.len()),
            "{role:?} /die: {died:?}\n{}",
            dump(&evs)
        );
        assert!(
            died.iter()
                .all(|x| x.failure.is_some() && x.status.is_none()),
            "{died:?}"
        );
    }
}

/// After a summarised exchange the rest of its answer is left out, but not an answer that
/// starts anew: a server's unsolicited 408 on the idle keep-alive connection is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_after_a_summarised_one_is_reported() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load_summarizing() else {
        return;
    };
    let (evs, server, client) =
        server_and_client(&mut cap, "idle_408.py", "HTTP/1.1 408 Request Timeout").await;
    let summaries = evs
        .iter()
        .filter(|e| matches!(e, Event::Summary(_)))
        .count();
    assert_eq!(summaries, 2, "the GET, from each end\n{}", dump(&evs));
    for pid in [client, server] {
        assert!(
            data_events(&evs)
                .iter()
                .any(|d| d.pid == pid && d.payload.starts_with(b"HTTP/1.1 408")),
            "the 408 at {pid}\n{}",
            dump(&evs)
        );
    }
}

/// An event loop that reads ahead (a request on each of two connections, then the answers,
/// the second first) has both requests held and summarised, flagged as read among others its
/// thread had not answered: their summaries reach userspace at their answers, so the order of
/// reads no longer says they overlapped. A request it then serves alone is not flagged.
#[tokio::test(flavor = "multi_thread")]
async fn requests_an_event_loop_reads_ahead_are_summarised_and_flagged() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load_summarizing() else {
        return;
    };
    let (evs, server, _) = server_and_client(&mut cap, "reading_ahead.py", "done").await;
    let served: Vec<(String, bool)> = evs
        .iter()
        .filter_map(|e| match e {
            Event::Summary(s) if s.request.pid == server => Some((
                String::from_utf8_lossy(&s.request.payload)
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_owned(),
                s.request.interleaved,
            )),
            _ => None,
        })
        .collect();
    let want = [
        ("GET /y HTTP/1.1".to_owned(), true),
        ("GET /x HTTP/1.1".to_owned(), true),
        ("GET /z HTTP/1.1".to_owned(), false),
    ];
    assert_eq!(served, want, "\n{}", dump(&evs));
}

/// A connection's entry in the kernel's `HELD` map (reused by each request it holds) goes when
/// the connection closes. A client opens 4,200 connections, a summarised request on each,
/// closes them, then opens 4,200 more on fds the first round never had: with the first round's
/// entries left behind, the map (8192 entries) fills and the second round's last requests are
/// sent whole; with them gone, every request at the client is summarised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_connection_leaves_nothing_held_behind() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load_summarizing() else {
        return;
    };
    const ROUND: usize = 4_200;
    const N: usize = 2 * ROUND;
    let n = ROUND.to_string();
    let (server, port) = serve(
        python,
        "many_connections.py",
        &["server", &n],
        Ready::SaysReady,
    );
    let client = Proc::spawn(
        python("many_connections.py", &[&port.to_string(), "client", &n]).stdout(Stdio::piped()),
    );
    let pids = [server.pid(), client.pid()];
    let last = format!("GET /{} ", N - 1);
    let last_seen = |e: &Event| match e {
        Event::Summary(s) => {
            s.request.pid == pids[1] && s.request.payload.starts_with(last.as_bytes())
        }
        Event::Data(d) => d.pid == pids[1] && d.payload.starts_with(last.as_bytes()),
        _ => false,
    };
    // Only the client's requests are kept (summaries, and requests sent whole), collected while
    // it runs: the whole run's events would not fit the ring.
    let evs = collect(
        &mut cap,
        Duration::from_secs(60),
        |e| match e {
            Event::Summary(s) => s.request.pid == pids[1],
            Event::Data(d) => d.pid == pids[1] && d.payload.starts_with(b"GET /"),
            _ => false,
        },
        |evs| evs.last().is_some_and(last_seen),
    )
    .await;
    let summarised = evs
        .iter()
        .filter(|e| matches!(e, Event::Summary(_)))
        .count();
    let whole: Vec<String> = data_events(&evs)
        .iter()
        .map(|d| {
            String::from_utf8_lossy(&d.payload)
                .lines()
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert!(
        evs.last().is_some_and(last_seen),
        "the last request was not seen: {} events",
        evs.len()
    );
    assert_eq!(
        (summarised, whole.len()),
        (N, 0),
        "the client's requests summarised, and sent whole (first: {:?})",
        whole.get(..5.min(whole.len()))
    );
}

/// `--capture-summary-every`: a keep-alive connection's quiet exchanges leave the kernel as one
/// summary in N, weighted with those counted before it, and what is counted reaches userspace
/// before anything else of the connection (the failure that follows, the close): summed, the
/// weights are every quiet exchange of each side, and the engine counts every exchange. curl
/// makes 40 quiet calls, one the server answers 503 (after which the client's calls to it go
/// whole: retries are read whole), and 20 more, on one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counted_quiet_exchanges_keep_their_counts() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load_counting(8, 5_000) else {
        return;
    };
    let (mut server, port) = python_server("keepalive_http_server.py", &[]);
    let url = |path: &str| format!("http://127.0.0.1:{port}{path}");
    let mut urls: Vec<String> = (0..40).map(|i| url(&format!("/ok/{i}"))).collect();
    urls.push(url("/busy"));
    urls.extend((40..60).map(|i| url(&format!("/ok/{i}"))));
    let mut curl = Proc::spawn(
        std::process::Command::new("curl")
            .args(["-s", "--max-time", "20"])
            .args(&urls)
            .stdout(Stdio::null()),
    );
    assert!(curl.wait(Duration::from_secs(30)).success(), "curl failed");
    let pids = [curl.pid(), server.pid()];
    let evs = collect(&mut cap, Duration::from_secs(2), involving(&pids), |_| {
        false
    })
    .await;
    server.kill();
    let weights = |pid: u32| -> (u32, usize) {
        let mine = evs.iter().filter_map(|e| match e {
            Event::Summary(s) if s.request.pid == pid => Some(s.weight),
            _ => None,
        });
        (mine.clone().sum(), mine.count())
    };
    let (client, server_side) = (weights(pids[0]), weights(pids[1]));
    // Every quiet exchange of each side, in far fewer records.
    assert_eq!((client.0, server_side.0), (40, 60), "\n{}", dump(&evs));
    assert!(
        client.1 <= 12 && server_side.1 <= 16,
        "one in 8 sent, and the counts before the failure and the close: {client:?} {server_side:?}"
    );
    // What the client counted went before its failed call.
    let busy = evs
        .iter()
        .position(|e| matches!(e, Event::Data(d) if d.pid == pids[0] && d.payload.starts_with(b"GET /busy ")))
        .unwrap_or_else(|| panic!("the client's /busy whole\n{}", dump(&evs)));
    assert!(
        !evs[busy..]
            .iter()
            .any(|e| matches!(e, Event::Summary(s) if s.request.pid == pids[0])),
        "a count of the client's after its failure\n{}",
        dump(&evs)
    );
    let d = integration_tests::correlate::derive(&evs, Default::default());
    let s = d.engine.stats();
    assert_eq!((s.outbound, s.inbound), (61, 61), "{s:?}");
}

/// Counts stay whole when a connection's next request does not start in one write: 20 quiet
/// calls counted one in 8 on a keep-alive connection, then a request whose method is split
/// across two writes (`GE`, then the rest), then 6 more. The kernel read `GE` where it holds
/// requests: what it counted goes as a tally that names no request (those bytes start none),
/// and every call is counted once, on both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_split_in_its_method_keeps_the_counts_before_it() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load_counting(8, 5_000) else {
        return;
    };
    let (evs, _, client) = server_and_client(&mut cap, "split_method.py", "done").await;
    let split = data_events(&evs)
        .iter()
        .filter(|d| d.pid == client && d.payload.as_ref() == b"GE")
        .count();
    assert_eq!(split, 1, "the client's `GE` whole\n{}", dump(&evs));
    assert!(
        evs.iter().any(|e| matches!(e, Event::Summary(s)
            if s.request.pid == client && s.is_tally() && s.request.payload.is_empty())),
        "a tally of the client's that names no request\n{}",
        dump(&evs)
    );
    let d = integration_tests::correlate::derive(&evs, Default::default());
    let s = d.engine.stats();
    // 20 + the split one + 5 + /bye, each side; a tally lost would leave 4 out.
    assert_eq!((s.outbound, s.inbound), (27, 27), "{s:?}\n{}", dump(&evs));
}

/// A client that gives up on a call (closes its connection with the request unanswered) failed
/// it: its next calls to that destination are read whole, not counted, so a retry that follows
/// a timeout on a pooled connection is seen. 20 quiet calls on one keep-alive connection, one
/// given up on another, then 5 more on the first: those 5 arrive whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_given_up_makes_its_destination_read_whole() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load_counting(8, 100) else {
        return;
    };
    let (evs, _, client) = server_and_client(&mut cap, "giving_up.py", "done").await;
    let line = |p: &[u8]| {
        String::from_utf8_lossy(p)
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    let after_whole = data_events(&evs)
        .iter()
        .filter(|d| d.pid == client && d.payload.starts_with(b"GET /after/"))
        .count();
    let after_summarised: Vec<String> = evs
        .iter()
        .filter_map(|e| match e {
            Event::Summary(s)
                if s.request.pid == client && s.request.payload.starts_with(b"GET /after/") =>
            {
                Some(line(&s.request.payload))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        (after_whole, after_summarised.len()),
        (5, 0),
        "{after_summarised:?}\n{}",
        dump(&evs)
    );
    // Before it, the first connection's quiet calls were counted: 20 in a few records.
    let before: Vec<u32> = evs
        .iter()
        .filter_map(|e| match e {
            Event::Summary(s)
                if s.request.pid == client && s.request.payload.starts_with(b"GET /ok/") =>
            {
                Some(s.weight)
            }
            _ => None,
        })
        .collect();
    assert_eq!(before.iter().sum::<u32>(), 20, "{before:?}");
    assert!(before.len() < 20, "{before:?}");
}

/// Runs the Python fixture `name` as `server`, then as `client` of it, which prints `said`;
/// returns the events of both and their pids (server, client).
async fn server_and_client(
    cap: &mut retry_agent::capture::Capture,
    name: &str,
    said: &str,
) -> (Vec<Event>, u32, u32) {
    let (mut server, port) = serve(python, name, &["server"], Ready::SaysReady);
    let mut client =
        Proc::spawn(python(name, &[&port.to_string(), "client"]).stdout(Stdio::piped()));
    assert_eq!(client.read_line().trim(), said);
    let _ = client.wait(Duration::from_secs(5));
    let _ = server.wait(Duration::from_secs(5));
    let pids = (server.pid(), client.pid());
    let evs = collect(
        cap,
        Duration::from_secs(2),
        involving(&[pids.0, pids.1]),
        |_| false,
    )
    .await;
    (evs, pids.0, pids.1)
}

/// Settings as `load` has them, for the altered objects.
fn altered_config() -> CaptureConfig {
    CaptureConfig {
        go: GoMode::On,
        ..CaptureConfig::default()
    }
}

/// The gaps that are not a syscall this kernel lacks, as (program, reason).
fn missed(cap: &Capture) -> Vec<(String, GapReason)> {
    cap.gaps()
        .iter()
        .filter(|g| g.reason != GapReason::NoTracepoint)
        .map(|g| (g.program.clone(), g.reason))
        .collect()
}

/// A data program the kernel refuses (here the verifier, on another kernel its JIT) leaves that
/// syscall's I/O unseen, named, and the capture runs: before, the whole load failed and a node
/// had no capture at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_program_the_kernel_refuses_is_a_named_gap_and_capture_goes_on() {
    if !can_run() {
        return;
    }
    let obj = altered::refusing("ra_exit_readv");
    let mut cap = Capture::load_object(&altered_config(), &obj)
        .unwrap_or_else(|e| panic!("capture without readv failed to load: {e}"));
    assert_eq!(
        missed(&cap),
        vec![("ra_exit_readv".to_string(), GapReason::Verifier)]
    );
    let gap = cap
        .gaps()
        .iter()
        .find(|g| g.program == "ra_exit_readv")
        .unwrap();
    assert_eq!(gap.tracepoint, "syscalls/sys_exit_readv");
    assert!(
        gap.detail
            .contains("verifier rejected program ra_exit_readv")
            && gap.detail.contains("unreachable insn"),
        "{}",
        gap.detail
    );

    let (echo, port) = python_server("echo_server.py", &[]);
    let mut client = Proc::spawn(&mut python("vectored_client.py", &[&port.to_string()]));
    assert!(client.wait(Duration::from_secs(10)).success());
    let pids = [echo.pid(), client.pid()];
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&pids), |_| {
        false
    })
    .await;
    let data = data_events(&evs);
    let seen = |sc: Syscall| {
        data.iter()
            .any(|d| d.pid == client.pid() && d.syscall == sc)
    };
    // Every other syscall of the client is seen; readv, whose program is missing, is not.
    for sc in [
        Syscall::Writev,
        Syscall::Sendmsg,
        Syscall::Recvmsg,
        Syscall::Sendmmsg,
        Syscall::Recvmmsg,
    ] {
        assert!(seen(sc), "no {sc:?} from the client\n{}", dump(&evs));
    }
    assert!(!seen(Syscall::Readv), "readv seen without its program");
}

/// A program the capture cannot do without (connections' closing) that the kernel refuses, or
/// whose tracepoint it lacks, fails the load naming it, and leaves nothing loaded behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_program_the_kernel_refuses_fails_the_load_naming_it() {
    if !can_run() {
        return;
    }
    let before = retry_agent::capture::loaded_program_ids();
    match Capture::load_object(&altered_config(), &altered::refusing("ra_enter_close")) {
        Err(CaptureError::Verifier { program, log, .. }) => {
            assert_eq!(program, "ra_enter_close");
            assert!(log.contains("unreachable insn"), "{log}");
        }
        Err(e) => panic!("another error than the verifier's: {e}"),
        Ok(_) => panic!("the capture loaded without its close program"),
    }
    match Capture::load_object(
        &altered_config(),
        &altered::without_tracepoint("sys_enter_close"),
    ) {
        Err(e @ CaptureError::NoTracepoint { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("ra_enter_close") && text.contains("syscalls/sys_enter_clos_"),
                "{text}"
            );
        }
        Err(e) => panic!("another error than the missing tracepoint: {e}"),
        Ok(_) => panic!("the capture loaded without its close tracepoint"),
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = retry_agent::capture::loaded_program_ids();
    let left: Vec<_> = after.iter().filter(|id| !before.contains(id)).collect();
    assert!(left.is_empty(), "programs left loaded: {left:?}");
}

/// A tracepoint the kernel does not have (a syscall this architecture lacks) is skipped: a gap
/// of its own kind, since no process can make that call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tracepoint_the_kernel_lacks_is_skipped() {
    if !can_run() {
        return;
    }
    let obj = altered::without_tracepoint("sys_exit_readv");
    let cap = Capture::load_object(&altered_config(), &obj)
        .unwrap_or_else(|e| panic!("capture failed to load: {e}"));
    let gap = cap
        .gaps()
        .iter()
        .find(|g| g.program == "ra_exit_readv")
        .unwrap_or_else(|| panic!("no gap for readv: {:?}", cap.gaps()));
    assert_eq!(
        (gap.tracepoint.as_str(), gap.reason),
        ("syscalls/sys_exit_read_", GapReason::NoTracepoint)
    );
    assert!(missed(&cap).is_empty(), "{:?}", cap.gaps());
}
