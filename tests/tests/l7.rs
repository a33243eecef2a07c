//! L7 reassembly against real peers: `cargo test -p integration-tests --test l7` as root.
//!
//! Each test loads the capture in-process, drives real clients and servers over loopback
//! (Python http.server + curl + requests + Node http and h2c; HAProxy h2c; grpcio server +
//! client), feeds the captured events through `l7::Reassembler`, and checks that the exchanges
//! reconstructed on both sides equal what the peers themselves logged.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use std::{
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::fixture::{
    Proc, Ready, can_run, collect, free_port, haproxy_answering, have, involving, load_with, node,
    python, python_server, serve, wait_listening,
};
use retry_agent::{
    capture::{Capture, CaptureConfig, Event, Role},
    l7::{Exchange, L7Config, Method, OutcomeClass, Protocol, Reassembler},
};

/// Capture with the largest payload prefix, so header blocks are whole (the default of 256
/// bytes is exercised by the unit tests' truncation cases), and each quiet exchange sent: these
/// tests compare exchanges one by one with what the peers logged (counted ones keep their
/// counts, `capture::counted_quiet_exchanges_keep_their_counts`, not each exchange).
fn load_capture() -> Option<Capture> {
    load_with(&CaptureConfig {
        payload_bytes: 4096,
        tls: true,
        summary_every: 1,
        ..CaptureConfig::default()
    })
}

/// `load_capture` with every exchange read whole: for what only whole records show (framing).
fn load_capture_whole() -> Option<Capture> {
    load_with(&CaptureConfig {
        payload_bytes: 4096,
        tls: true,
        summarize: false,
        ..CaptureConfig::default()
    })
}

fn reassemble(evs: &[Event]) -> Vec<Exchange> {
    // RA_L7_DUMP=1 prints the captured events (JSON lines) for diagnosis.
    if std::env::var_os("RA_L7_DUMP").is_some() {
        for e in evs {
            eprintln!("{}", serde_json::to_string(e).unwrap_or_default());
        }
    }
    let mut r = Reassembler::new(L7Config::default());
    let mut out = Vec::new();
    for e in evs {
        r.push(e, &mut out);
    }
    r.tick(u64::MAX, &mut out);
    let s = r.stats();
    eprintln!("l7 stats: {s:?}");
    out
}

fn method_name(m: &Option<Method>) -> String {
    m.as_ref()
        .and_then(|m| serde_json::to_value(m).ok())
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// `METHOD PATH STATUS` of the completed exchanges of `pid` in `role`, in request order.
fn http_lines(ex: &[Exchange], pid: u32, role: Role) -> Vec<String> {
    let mut v: Vec<&Exchange> = ex
        .iter()
        .filter(|e| e.pid == pid && e.role == role && e.protocol == Protocol::Http1)
        .collect();
    v.sort_by_key(|e| e.request_start_ns);
    v.iter()
        .map(|e| {
            format!(
                "{} {} {}",
                method_name(&e.method),
                e.path.clone().unwrap_or_default(),
                e.status.map(|s| s.to_string()).unwrap_or_default()
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_exchanges_equal_what_the_peers_logged() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load_capture() else {
        return;
    };
    let (mut server, port) = python_server("keepalive_http_server.py", &[]);
    let ps = port.to_string();

    let mut clients: Vec<(Proc, &str)> = Vec::new();
    let mut py = Proc::spawn(python("requests_client.py", &[&ps]).stdout(Stdio::piped()));
    let py_lines = py.output_lines();
    clients.push((py, "requests"));
    // curl: two URLs on one keep-alive connection.
    let mut curl = Proc::spawn(
        Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-o",
                "/dev/null",
                "-w",
                "GET %{url_effective} %{http_code}\\n",
                &format!("http://127.0.0.1:{port}/curl/7?x=1"),
                &format!("http://127.0.0.1:{port}/missing/curl"),
            ])
            .stdout(Stdio::piped()),
    );
    let curl_lines: Vec<String> = curl
        .output_lines()
        .iter()
        .map(|l| {
            l.replace(&format!("http://127.0.0.1:{port}"), "")
                .replace("?x=1", "")
        })
        .collect();
    clients.push((curl, "curl"));
    let node_lines = if have("node", "--version") {
        let mut node = Proc::spawn(node("node_client.js", &[&ps]).stdout(Stdio::piped()));
        let l = node.output_lines();
        clients.push((node, "node"));
        l
    } else {
        Vec::new()
    };
    let mut pids = vec![server.pid()];
    pids.extend(clients.iter().map(|(p, _)| p.pid()));
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&pids), |_| {
        false
    })
    .await;
    let server_pid = server.pid();
    server.kill();
    let server_lines = server.output_lines();
    let ex = reassemble(&evs);

    let expect = [
        (&py_lines, 0usize, "requests"),
        (&curl_lines, 1, "curl"),
        (&node_lines, 2, "node"),
    ];
    let mut total = 0;
    for (want, i, name) in expect {
        let Some((p, _)) = clients.get(i) else {
            continue;
        };
        assert!(!want.is_empty() || name == "node", "{name} logged nothing");
        let got = http_lines(&ex, p.pid(), Role::Client);
        assert_eq!(
            &got, want,
            "{name}: client exchanges vs the client's own log"
        );
        total += want.len();
    }
    // The server side of the same traffic, as the server logged it (order across clients
    // interleaves by time; compare as sorted multisets).
    let mut got = http_lines(&ex, server_pid, Role::Server);
    let mut want = server_lines.clone();
    got.sort();
    want.sort();
    assert_eq!(got, want, "server exchanges vs the server's log");
    assert_eq!(
        want.len(),
        total,
        "the server saw every request the clients sent"
    );

    // Fields beyond the log line.
    let mine = |pid: u32| ex.iter().filter(move |e| e.pid == pid);
    let py_pid = clients[0].0.pid();
    let charge = mine(py_pid)
        .find(|e| e.path.as_deref() == Some("/charge"))
        .expect("POST /charge");
    assert!(charge.idempotency_key && charge.idempotent && charge.body_hash.is_some());
    assert_eq!(charge.outcome, OutcomeClass::Success);
    let busy = mine(py_pid)
        .find(|e| e.path.as_deref() == Some("/busy"))
        .expect("GET /busy");
    assert_eq!(
        (busy.outcome, busy.retry_after),
        (OutcomeClass::Overload, true)
    );
    let missing = mine(server_pid)
        .find(|e| e.path.as_deref() == Some("/missing/2"))
        .expect("server 404");
    assert_eq!(missing.outcome, OutcomeClass::Semantic);
    assert!(
        mine(server_pid).all(|e| !e.unknown && e.failure.is_none()),
        "{ex:#?}"
    );
    if let Some((node, _)) = clients.get(2) {
        assert!(mine(node.pid()).all(|e| e.retry_markers.retry_attempt == Some(1)));
    }
}

/// One side's HTTP/2 exchanges, in request order, against that side's log (`PATH CODE` lines).
/// A field the reassembler reports must equal the logged one; a field it could not know (the
/// capture cut a header block) must be absent and the exchange marked unknown.
fn check_h2(ex: &[Exchange], pid: u32, role: Role, log: &[String]) -> Vec<Exchange> {
    let mut v: Vec<Exchange> = ex
        .iter()
        .filter(|e| e.pid == pid && e.role == role && e.protocol == Protocol::Http2)
        .cloned()
        .collect();
    v.sort_by_key(|e| e.request_start_ns);
    assert_eq!(
        v.len(),
        log.len(),
        "{role:?}: one exchange per logged call\n{v:#?}\n{log:?}"
    );
    for (e, line) in v.iter().zip(log) {
        let (path, code) = line.rsplit_once(' ').unwrap_or((line, ""));
        if let Some(p) = &e.path {
            assert_eq!(p, path, "{role:?} {e:#?}");
        } else {
            assert!(e.unknown, "no path and not marked unknown: {e:#?}");
        }
        match e.grpc_status {
            Some(g) => assert_eq!(g.to_string(), code, "{role:?} {e:#?}"),
            None => assert!(e.unknown, "no grpc-status and not marked unknown: {e:#?}"),
        }
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_h2c_exchanges_equal_what_the_peers_logged() {
    if !can_run() || !have("node", "--version") {
        return;
    }
    let Some(mut cap) = load_capture() else {
        return;
    };
    let (mut server, port) = serve(node, "node_h2c_server.js", &[], Ready::SaysReady);
    let ps = port.to_string();
    let mut client = Proc::spawn(node("node_h2c_client.js", &[&ps]).stdout(Stdio::piped()));
    let client_lines = client.output_lines();
    assert_eq!(client_lines.len(), 6, "{client_lines:?}");
    let pids = [server.pid(), client.pid()];
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&pids), |_| {
        false
    })
    .await;
    let server_pid = server.pid();
    server.kill();
    let server_lines = server.output_lines();
    let ex = reassemble(&evs);
    let client_ex = check_h2(&ex, client.pid(), Role::Client, &client_lines);
    check_h2(&ex, server_pid, Role::Server, &server_lines);
    eprintln!(
        "node h2c: {} exchanges, {} fully known",
        ex.len(),
        ex.iter().filter(|e| !e.unknown).count()
    );
    // Node writes each batch of frames from one buffer, so the capture holds whole header
    // blocks: every field is known on both sides (Huffman strings, dynamic table and all).
    assert!(
        ex.iter()
            .all(|e| !e.unknown && e.method == Some(Method::Post)),
        "{ex:#?}"
    );
    use OutcomeClass::*;
    let classes: Vec<OutcomeClass> = client_ex.iter().map(|e| e.outcome).collect();
    assert_eq!(
        classes,
        vec![Success, Transient, Success, Overload, Semantic, Success]
    );
}

/// The HTTP/2 calls of a Node h2c session to `port` that was in use before capture started,
/// as the capture saw them over two seconds (`None`: capture cannot run here).
async fn calls_of_a_session_older_than_capture(port: u16) -> Option<Vec<Exchange>> {
    let ps = port.to_string();
    let mut client =
        Proc::spawn(node("node_h2c_long_client.js", &[&ps, "6"]).stdout(Stdio::piped()));
    // Its session, and both HPACK tables, in use before capture starts.
    assert!(
        client.read_line().starts_with('/'),
        "the client's first call"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut cap = load_capture()?;
    let pids = [client.pid()];
    let evs = collect(&mut cap, Duration::from_secs(2), involving(&pids), |_| {
        false
    })
    .await;
    client.kill();
    let calls: Vec<Exchange> = reassemble(&evs)
        .into_iter()
        .filter(|e| e.pid == client.pid() && e.protocol == Protocol::Http2)
        .collect();
    assert!(calls.len() > 20, "{} calls: {calls:#?}", calls.len());
    // Picked up mid-life: the requests' method is not vouched for, and nothing is guessed.
    assert!(
        calls.iter().all(|e| e.unknown && e.method.is_none()),
        "{calls:#?}"
    );
    Some(calls)
}

fn on_path<'a>(calls: &'a [Exchange], path: &str) -> Vec<&'a Exchange> {
    let on: Vec<&Exchange> = calls
        .iter()
        .filter(|e| e.path.as_deref() == Some(path))
        .collect();
    assert!(on.len() > 5, "{path}: {calls:#?}");
    on
}

/// An HTTP/2 connection older than the capture (the agent restarted among long-lived
/// connections): its blocks refer to a table whose start went by unseen. HAProxy answers from
/// the static table and literals, so its answers are read whole; Node's requests refer to its
/// table, so they come without a method. Each `/fail` answered 503 shows as a failure (before,
/// every block of such a connection was unknown: no status at all, no failure ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_connection_older_than_capture_still_shows_its_failures() {
    if !can_run() || !have("node", "--version") || !have("haproxy", "-v") {
        return;
    }
    let port = free_port();
    let cfg = std::env::temp_dir().join(format!("ra-l7-h2-older-{}.cfg", std::process::id()));
    let _haproxy = haproxy_answering(
        &cfg,
        port,
        " proto h2",
        &["http-request return status 503 content-type text/plain string no if { path /fail }"],
    );
    let calls = calls_of_a_session_older_than_capture(port).await;
    let _ = std::fs::remove_file(&cfg);
    let Some(calls) = calls else { return };
    let (ok, fail) = (on_path(&calls, "/ok"), on_path(&calls, "/fail"));
    assert!(ok.iter().all(|e| e.status == Some(200)), "{ok:#?}");
    assert!(
        fail.iter().all(|e| e.status == Some(503)
            && e.failure_seen()
            && e.outcome == OutcomeClass::Transient),
        "{fail:#?}"
    );
}

/// The same with a server whose encoder indexes what it sends (Node's, nghttp2's; Go's alike):
/// its answers' heads refer to a content-type it indexed before capture started. A head that
/// leaves its stream open cannot carry a gRPC status, so its static 200 is read as a success
/// (before, every such answer was an unseen outcome, and the edge had no successes to count
/// its failures against). A 503 the server indexed before capture is a reference nothing
/// resolves: unseen, never a success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_connection_older_than_capture_to_an_indexing_server_shows_its_successes() {
    if !can_run() || !have("node", "--version") {
        return;
    }
    let (_server, port) = serve(node, "node_h2c_plain_server.js", &[], Ready::SaysReady);
    let Some(calls) = calls_of_a_session_older_than_capture(port).await else {
        return;
    };
    let (ok, fail) = (on_path(&calls, "/ok"), on_path(&calls, "/fail"));
    assert!(
        ok.iter().all(|e| e.status == Some(200)
            && e.outcome == OutcomeClass::Success
            && !e.outcome_unseen()),
        "{ok:#?}"
    );
    assert!(
        fail.iter()
            .all(|e| e.outcome != OutcomeClass::Success
                && (e.failure_seen() || e.outcome_unseen())),
        "{fail:#?}"
    );
}

/// Whether the gRPC tests can run: the kernel side, and grpcio (said when missing).
fn can_run_grpc() -> bool {
    if !can_run() {
        return false;
    }
    let grpcio = Command::new("python3")
        .args(["-c", "import grpc"])
        .status()
        .is_ok_and(|s| s.success());
    if !grpcio {
        eprintln!("skip: python grpcio not installed");
    }
    grpcio
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_exchanges_equal_what_the_peers_logged() {
    if !can_run_grpc() {
        return;
    }
    let Some(mut cap) = load_capture() else {
        return;
    };
    let (mut server, port) = serve(python, "grpc_server.py", &[], Ready::SaysReady);
    let ps = port.to_string();
    let mut client = Proc::spawn(python("grpc_client.py", &[&ps]).stdout(Stdio::piped()));
    let client_lines = client.output_lines();
    assert_eq!(client_lines.len(), 7, "{client_lines:?}");
    let pids = [server.pid(), client.pid()];
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&pids), |_| {
        false
    })
    .await;
    let server_pid = server.pid();
    server.kill();
    let server_lines = server.output_lines();
    let ex = reassemble(&evs);

    let client_ex = check_h2(&ex, client.pid(), Role::Client, &client_lines);
    let server_ex = check_h2(&ex, server_pid, Role::Server, &server_lines);
    // Reads are whole (recvmsg): the client always knows the statuses, the server the paths.
    use OutcomeClass::*;
    let classes: Vec<OutcomeClass> = client_ex.iter().map(|e| e.outcome).collect();
    assert_eq!(
        classes,
        vec![
            Success, Transient, Success, Overload, Semantic, Semantic, Success
        ]
    );
    assert!(
        server_ex
            .iter()
            .all(|e| e.path.is_some() && e.method == Some(Method::Post)),
        "{server_ex:#?}"
    );
    // grpcio writes each frame as many small iovecs: the capture must follow enough of them, and
    // the default prefix must hold a whole header block, or the HPACK table is lost and every
    // later exchange on the connection turns unknown (client paths and retry markers with it).
    assert!(
        client_ex.iter().chain(server_ex.iter()).all(|e| !e.unknown),
        "grpcio exchanges decoded whole: {ex:#?}"
    );
    assert!(
        client_ex.iter().all(|e| e.path.is_some()),
        "client paths: {client_ex:#?}"
    );
}

/// The (path, status) pairs of a side's exchanges, counted, against its log's `METHOD CODE` lines.
fn h2_calls(ex: &[Exchange], pid: u32, role: Role) -> Vec<String> {
    let mut v: Vec<String> = ex
        .iter()
        .filter(|e| e.pid == pid && e.role == role && e.protocol == Protocol::Http2)
        .map(|e| {
            let path = e.path.clone().unwrap_or_else(|| "?".into());
            let code = e.grpc_status.map_or_else(|| "?".into(), |g| g.to_string());
            format!("{path} {code}")
        })
        .collect();
    v.sort();
    v
}

/// 32 threads calling over one grpcio channel: the channel batches many streams' frames into
/// one write (and the server's reads and writes batch alike), often past the default 1 KiB
/// prefix and as hundreds of iovecs. Once one header block is cut the HPACK table is unknowable
/// for the rest of the connection, so every exchange after it turned unknown (the lab's chain7
/// gRPC hop; all 604 client exchanges of a 400-call run). The kernel captures HTTP/2
/// connections with a larger prefix cut over several records: every exchange decodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_grpc_calls_on_one_channel_all_decode() {
    if !can_run_grpc() {
        return;
    }
    // The default capture size, as the agent runs.
    let Some(mut cap) = load_with(&CaptureConfig::default()) else {
        return;
    };
    let (mut server, port) = serve(python, "grpc_server.py", &["32"], Ready::SaysReady);
    let ps = port.to_string();
    let mut client =
        Proc::spawn(python("grpc_concurrent_client.py", &[&ps, "400"]).stdout(Stdio::piped()));
    let mut client_lines = client.output_lines();
    assert_eq!(client_lines.len(), 400, "{client_lines:?}");
    let pids = [server.pid(), client.pid()];
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&pids), |_| {
        false
    })
    .await;
    let server_pid = server.pid();
    server.kill();
    let mut server_lines = server.output_lines();
    let ex = reassemble(&evs);
    let unknown = ex.iter().filter(|e| e.unknown).count();
    assert_eq!(unknown, 0, "{unknown} of {} exchanges unknown", ex.len());
    client_lines.sort();
    server_lines.sort();
    assert_eq!(h2_calls(&ex, client.pid(), Role::Client), client_lines);
    assert_eq!(h2_calls(&ex, server_pid, Role::Server), server_lines);
    // Each call's `traceparent` is new and Huffman-coded by grpcio's encoder (as every HTTP/2
    // client's literals are): read alike on both sides, one trace per call.
    let traces = |pid: u32, role: Role| {
        let mut t: Vec<Option<u64>> = ex
            .iter()
            .filter(|e| e.pid == pid && e.role == role && e.protocol == Protocol::Http2)
            .map(|e| e.trace_id)
            .collect();
        t.sort_unstable();
        t
    };
    let client_traces = traces(client.pid(), Role::Client);
    assert!(
        client_traces.iter().all(Option::is_some),
        "a call without its trace id"
    );
    let distinct: std::collections::HashSet<_> = client_traces.iter().collect();
    assert_eq!(distinct.len(), 400);
    assert_eq!(traces(server_pid, Role::Server), client_traces);
    // The premise: syscalls of the run moved more than the default prefix (one syscall's
    // records share its connection and exit time).
    let mut per_syscall: std::collections::HashMap<_, u64> = std::collections::HashMap::new();
    for d in integration_tests::fixture::data_events(&evs) {
        *per_syscall.entry((d.conn, d.ts_exit_ns)).or_default() += d.len;
    }
    let large = per_syscall.values().filter(|&&n| n > 1024).count();
    eprintln!("{large} syscalls moved more than 1 KiB");
    assert!(
        large > 0,
        "no syscall batched past the default prefix: the test proves nothing"
    );
}

/// Bodies sent with sendfile(2) or splice(2) never pass through user memory: capture counts
/// them, l7 frames them, and the keep-alive connection parses on to the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_copy_bodies_are_framed() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load_capture_whole() else {
        return;
    };
    let (mut server, port) = python_server("zero_copy_server.py", &[]);
    let url = |p: &str| format!("http://127.0.0.1:{port}{p}");
    let curl = Proc::spawn(Command::new("curl").args([
        "-s",
        "-o",
        "/dev/null",
        "-o",
        "/dev/null",
        "-o",
        "/dev/null",
        &url("/sendfile"),
        &url("/splice"),
        &url("/missing"),
    ]));
    let pids = vec![server.pid(), curl.pid()];
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&pids), |_| {
        false
    })
    .await;
    let server_pid = server.pid();
    server.kill();
    let logged = server.output_lines();
    let ex = reassemble(&evs);
    assert_eq!(
        logged,
        ["GET /sendfile 200", "GET /splice 200", "GET /missing 404"],
        "the server's own log"
    );
    assert_eq!(
        http_lines(&ex, server_pid, Role::Server),
        logged,
        "server exchanges vs its log"
    );
    assert_eq!(
        http_lines(&ex, curl.pid(), Role::Client),
        logged,
        "curl's exchanges"
    );
    for e in ex
        .iter()
        .filter(|e| e.pid == server_pid && e.status == Some(200))
    {
        assert!(e.response_bytes >= 100_000 && !e.unknown, "{e:?}");
    }
}

/// A self-signed certificate and key in a fresh directory (removed by the caller).
fn self_signed(tag: &str) -> (std::path::PathBuf, String, String) {
    let dir = std::env::temp_dir().join(format!("ra-tls-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    assert!(made.is_ok_and(|s| s.success()), "openssl req");
    (dir, cert.display().to_string(), key.display().to_string())
}

/// curl over HTTPS, two URLs on one connection; its `GET PATH CODE` lines.
fn curl_https(port: u16, paths: [&str; 2]) -> (Proc, Vec<String>) {
    let url = |p: &str| format!("https://127.0.0.1:{port}{p}");
    let mut curl = Proc::spawn(
        Command::new("curl")
            .args([
                "-sk",
                "-o",
                "/dev/null",
                "-o",
                "/dev/null",
                "-w",
                "GET %{url_effective} %{http_code}\\n",
            ])
            .args([url(paths[0]), url(paths[1])])
            .stdout(Stdio::piped()),
    );
    let lines = curl
        .output_lines()
        .iter()
        .map(|l| l.replace(&format!("https://127.0.0.1:{port}"), ""))
        .collect();
    (curl, lines)
}

/// HTTPS through OpenSSL on both sides: Python's ssl serving, curl (SSL_read/SSL_write) and
/// python-requests calling. Capture reads the plaintext from libssl's uprobes; l7 rebuilds the
/// exchanges both sides logged, never the ciphertext.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_exchanges_come_from_libssl_plaintext() {
    if !can_run() || !have("openssl", "version") {
        return;
    }
    let (dir, cert, key) = self_signed("plain");
    let Some(mut cap) = load_capture() else {
        return;
    };
    let (mut server, port) = python_server("keepalive_http_server.py", &[&cert, &key]);
    let (curl, curl_lines) = curl_https(port, ["/tls/curl", "/missing/tls"]);
    let mut py = Proc::spawn(
        python(
            "requests_tls_client.py",
            &[&port.to_string(), "/tls/py", "/busy"],
        )
        .stdout(Stdio::piped()),
    );
    let py_lines = py.output_lines();
    let pids = vec![server.pid(), curl.pid(), py.pid()];
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&pids), |_| {
        false
    })
    .await;
    let server_pid = server.pid();
    server.kill();
    let mut server_lines = server.output_lines();
    let _ = std::fs::remove_dir_all(&dir);
    let ex = reassemble(&evs);
    assert_eq!(
        curl_lines,
        ["GET /tls/curl 200", "GET /missing/tls 404"],
        "curl's own log"
    );
    assert_eq!(
        py_lines,
        ["GET /tls/py 200", "GET /busy 503"],
        "requests' own log"
    );
    assert_eq!(
        http_lines(&ex, curl.pid(), Role::Client),
        curl_lines,
        "curl's exchanges (SSL_write/SSL_read)"
    );
    assert_eq!(
        http_lines(&ex, py.pid(), Role::Client),
        py_lines,
        "requests' exchanges (SSL_write_ex/SSL_read_ex)"
    );
    let mut got = http_lines(&ex, server_pid, Role::Server);
    got.sort();
    server_lines.sort();
    assert_eq!(got, server_lines, "server exchanges vs its log");
    assert_eq!(server_lines.len(), 4);
}

/// A container image brings its own libssl (another file): a server started after the capture,
/// in a mount namespace where libssl.so.3 is a copy, is instrumented by the rescan that finds
/// the copy through /proc/<pid>/root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_rescan_reaches_a_libssl_private_to_a_mount_namespace() {
    const LIBSSL: &str = "/usr/lib/x86_64-linux-gnu/libssl.so.3";
    if !can_run()
        || !have("openssl", "version")
        || !have("unshare", "--version")
        || !std::path::Path::new(LIBSSL).exists()
    {
        return;
    }
    let (dir, cert, key) = self_signed("ns");
    let copy = dir.join("libssl.so.3");
    std::fs::copy(LIBSSL, &copy).expect("copy libssl");
    let Some(mut cap) = load_capture() else {
        return;
    };
    let port = free_port();
    let ps = port.to_string();
    let script = integration_tests::fixture::fixture("keepalive_http_server.py");
    let mut server = Proc::spawn(
        Command::new("unshare")
            .args(["-m", "sh", "-c"])
            .arg(format!(
                "mount --bind {} {LIBSSL} && exec python3 -u {} {ps} {cert} {key}",
                copy.display(),
                script.display()
            ))
            .stdout(Stdio::piped()),
    );
    wait_listening(&format!("127.0.0.1:{port}"), None);
    let added = cap.rescan_tls();
    assert!(
        added >= 1,
        "the namespace's libssl copy must be a new library: {added}"
    );
    let (curl, curl_lines) = curl_https(port, ["/ns/a", "/missing/ns"]);
    let pids = vec![server.pid(), curl.pid()];
    // The server is python under `sh -c ... exec`: the same pid.
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&pids), |_| {
        false
    })
    .await;
    let server_pid = server.pid();
    server.kill();
    let server_lines = server.output_lines();
    let _ = std::fs::remove_dir_all(&dir);
    let ex = reassemble(&evs);
    assert_eq!(
        curl_lines,
        ["GET /ns/a 200", "GET /missing/ns 404"],
        "curl's own log"
    );
    assert_eq!(
        http_lines(&ex, server_pid, Role::Server),
        server_lines,
        "server exchanges through its private libssl"
    );
    assert_eq!(server_lines.len(), 2);
}
