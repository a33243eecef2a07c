//! L7 reassembly against real peers: `cargo test -p integration-tests --test l7` as root.
//!
//! Each test loads the capture in-process, drives real clients and servers over loopback
//! (Python http.server + curl + requests + Node http; grpcio server + client), feeds the
//! captured events through `l7::Reassembler`, and checks that the exchanges reconstructed on
//! both sides equal what the peers themselves logged.
use std::{
    collections::HashSet,
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::capture::{Proc, can_run, collect, free_port, python, wait_listening};
use retry_agent::{
    capture::{Capture, CaptureConfig, CaptureError, Event, Role},
    l7::{Exchange, L7Config, Method, OutcomeClass, Protocol, Reassembler},
};

/// HTTP/1.1 keep-alive server; logs `METHOD PATH STATUS` per request on stdout.
const HTTP_SERVER_PY: &str = r#"
import sys, http.server
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self, body=True):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        p = self.path.split("?")[0]
        status, extra = 200, {}
        if p.startswith("/missing"):
            status = 404
        elif p.startswith("/busy"):
            status, extra = 503, {"Retry-After": "1"}
        elif p.startswith("/limited"):
            status = 429
        elif self.command == "POST":
            status = 201
        data = b"x" * (2000 if p.startswith("/big") else 7)
        self.send_response(status)
        for k, v in extra.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)
        print(self.command, p, status, flush=True)
    def do_GET(self): self.answer()
    def do_POST(self): self.answer()
    def do_PUT(self): self.answer()
    def do_DELETE(self): self.answer()
    def do_HEAD(self): self.answer(body=False)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"#;

/// python-requests on one keep-alive session; logs `METHOD PATH STATUS`.
const REQUESTS_PY: &str = r#"
import sys, requests
base = "http://127.0.0.1:" + sys.argv[1]
s = requests.Session()
for m, p, kw in [("GET", "/users/1", {}), ("POST", "/charge", {"data": b"{\"amount\": 5}", "headers": {"Idempotency-Key": "k1"}}),
                 ("GET", "/missing/2", {}), ("PUT", "/items/3", {"data": b"v"}), ("GET", "/busy", {}),
                 ("HEAD", "/users/1", {}), ("DELETE", "/items/3", {}), ("GET", "/big/blob", {}), ("GET", "/limited", {})]:
    r = s.request(m, base + p + "?q=1", **kw)
    print(m, p, r.status_code, flush=True)
"#;

/// Node's http client with a keep-alive agent, requests one after another.
const NODE_JS: &str = r#"
const http = require('http');
const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
const port = +process.argv[process.argv.length - 1];
const reqs = [['GET', '/node/1'], ['POST', '/node/post'], ['GET', '/missing/node'], ['GET', '/big/node']];
(async () => {
  for (const [method, path] of reqs) {
    await new Promise((resolve, reject) => {
      const r = http.request({ host: '127.0.0.1', port, method, path, agent, headers: { 'x-retry-attempt': '1' } }, (res) => {
        res.resume();
        res.on('end', () => { console.log(method, path, res.statusCode); resolve(); });
      });
      r.on('error', reject);
      r.end(method === 'POST' ? 'node body' : undefined);
    });
  }
  agent.destroy();
})();
"#;

/// A generic grpcio server (raw bytes, no generated stubs): status chosen by method name.
const GRPC_SERVER_PY: &str = r#"
import sys, grpc
from concurrent import futures
codes = {"Ok": None, "Unavailable": grpc.StatusCode.UNAVAILABLE, "Exhausted": grpc.StatusCode.RESOURCE_EXHAUSTED,
         "Invalid": grpc.StatusCode.INVALID_ARGUMENT, "NotFound": grpc.StatusCode.NOT_FOUND}
class H(grpc.GenericRpcHandler):
    def service(self, details):
        name = details.method.rsplit("/", 1)[-1]
        def handle(req, ctx):
            code = codes.get(name)
            print(details.method, (code.value[0] if code else 0), flush=True)
            if code:
                ctx.abort(code, "failed on purpose")
            return b"pong:" + req
        return grpc.unary_unary_rpc_method_handler(handle)
s = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[H()])
s.add_insecure_port("127.0.0.1:" + sys.argv[1])
s.start()
print("ready", flush=True)
s.wait_for_termination()
"#;

const GRPC_CLIENT_PY: &str = r#"
import sys, grpc
ch = grpc.insecure_channel("127.0.0.1:" + sys.argv[1], options=[("grpc.enable_retries", 0)])
for name in ["Ok", "Unavailable", "Ok", "Exhausted", "Invalid", "NotFound", "Ok"]:
    m = "/shop.v1.Orders/" + name
    try:
        ch.unary_unary(m)(b"ping", timeout=5)
        code = 0
    except grpc.RpcError as e:
        code = e.code().value[0]
    print(m, code, flush=True)
ch.close()
"#;

/// Node's h2c server: gRPC-style answers (200 + grpc-status trailer) chosen by path; logs
/// `PATH GRPC_STATUS` per stream.
const NODE_H2_SERVER_JS: &str = r#"
const http2 = require('http2');
const codes = { Ok: '0', Unavailable: '14', Exhausted: '8', Invalid: '3' };
const server = http2.createServer();
server.on('stream', (stream, headers) => {
  const path = headers[':path'];
  const code = codes[path.split('/').pop()] || '0';
  stream.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true });
  stream.on('wantTrailers', () => stream.sendTrailers({ 'grpc-status': code }));
  stream.end(Buffer.from([0, 0, 0, 0, 2, 0x08, 0x01]));
  console.log(path, code);
});
server.listen(+process.argv[process.argv.length - 1], '127.0.0.1', () => console.log('ready'));
"#;

/// Node's h2c client: sequential calls on one session; logs `PATH GRPC_STATUS`.
const NODE_H2_CLIENT_JS: &str = r#"
const http2 = require('http2');
const port = +process.argv[process.argv.length - 1];
const session = http2.connect('http://127.0.0.1:' + port);
const names = ['Ok', 'Unavailable', 'Ok', 'Exhausted', 'Invalid', 'Ok'];
(async () => {
  for (const name of names) {
    const path = '/shop.v1.Orders/' + name;
    await new Promise((resolve, reject) => {
      const req = session.request({ ':method': 'POST', ':path': path, 'content-type': 'application/grpc', te: 'trailers' });
      let code = '';
      req.on('trailers', (t) => { code = t['grpc-status']; });
      req.on('data', () => {});
      req.on('end', () => { console.log(path, code); resolve(); });
      req.on('error', reject);
      req.end(Buffer.from([0, 0, 0, 0, 2, 0x0a, 0x00]));
    });
  }
  session.close();
})();
"#;

/// Capture with the largest payload prefix, so header blocks are whole (the default of 256
/// bytes is exercised by the unit tests' truncation cases).
fn load_capture() -> Option<Capture> {
    let cfg = CaptureConfig { payload_bytes: 4096, tls: true, ..CaptureConfig::default() };
    match Capture::load(&cfg) {
        Ok(c) => Some(c),
        Err(e @ (CaptureError::MissingCapability(_) | CaptureError::TracefsNotMounted | CaptureError::KernelTooOld(_))) => {
            eprintln!("skip: {e}");
            None
        }
        Err(e) => panic!("capture failed to load: {e:?}\n{e}"),
    }
}

fn have(tool: &str, arg: &str) -> bool {
    let ok = Command::new(tool).arg(arg).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skip part: {tool} not available");
    }
    ok
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

/// Lines a peer printed, until it exits (or was killed).
fn output_lines(p: &mut Proc) -> Vec<String> {
    use std::io::BufRead;
    let Some(out) = p.0.stdout.take() else { return Vec::new() };
    std::io::BufReader::new(out).lines().map_while(Result::ok).map(|l| l.trim().to_string()).collect()
}

fn method_name(m: &Option<Method>) -> String {
    m.as_ref().and_then(|m| serde_json::to_value(m).ok()).and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

/// `METHOD PATH STATUS` of the completed exchanges of `pid` in `role`, in request order.
fn http_lines(ex: &[Exchange], pid: u32, role: Role) -> Vec<String> {
    let mut v: Vec<&Exchange> = ex.iter().filter(|e| e.pid == pid && e.role == role && e.protocol == Protocol::Http1).collect();
    v.sort_by_key(|e| e.request_start_ns);
    v.iter()
        .map(|e| format!("{} {} {}", method_name(&e.method), e.path.clone().unwrap_or_default(), e.status.map(|s| s.to_string()).unwrap_or_default()))
        .collect()
}

fn involving(pids: &[u32]) -> impl FnMut(&Event) -> bool + use<> {
    let pids: HashSet<u32> = pids.iter().copied().collect();
    move |e| pids.contains(&e.pid())
}

/// A Python server listening on a fresh loopback port (its first argument), stdout piped.
fn python_server(code: &str, extra: &[&str]) -> (Proc, u16) {
    let port = free_port();
    let ps = port.to_string();
    let mut args = vec![ps.as_str()];
    args.extend_from_slice(extra);
    let server = Proc::spawn(python(code, &args).stdout(Stdio::piped()));
    wait_listening(&format!("127.0.0.1:{port}"), None);
    (server, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_exchanges_equal_what_the_peers_logged() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load_capture() else { return };
    let (mut server, port) = python_server(HTTP_SERVER_PY, &[]);
    let ps = port.to_string();

    let mut clients: Vec<(Proc, &str)> = Vec::new();
    let mut py = Proc::spawn(python(REQUESTS_PY, &[&ps]).stdout(Stdio::piped()));
    let py_lines = output_lines(&mut py);
    clients.push((py, "requests"));
    // curl: two URLs on one keep-alive connection.
    let mut curl = Proc::spawn(Command::new("curl").args([
        "-s",
        "-o",
        "/dev/null",
        "-o",
        "/dev/null",
        "-w",
        "GET %{url_effective} %{http_code}\\n",
        &format!("http://127.0.0.1:{port}/curl/7?x=1"),
        &format!("http://127.0.0.1:{port}/missing/curl"),
    ]).stdout(Stdio::piped()));
    let curl_lines: Vec<String> = output_lines(&mut curl)
        .iter()
        .map(|l| l.replace(&format!("http://127.0.0.1:{port}"), "").replace("?x=1", ""))
        .collect();
    clients.push((curl, "curl"));
    let node_lines = if have("node", "--version") {
        let mut node = Proc::spawn(Command::new("node").args(["-e", NODE_JS, &ps]).stdout(Stdio::piped()));
        let l = output_lines(&mut node);
        clients.push((node, "node"));
        l
    } else {
        Vec::new()
    };
    let mut pids = vec![server.pid()];
    pids.extend(clients.iter().map(|(p, _)| p.pid()));
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&pids), |_| false).await;
    let server_pid = server.pid();
    let _ = server.0.kill();
    let server_lines = output_lines(&mut server);
    let ex = reassemble(&evs);

    let expect = [(&py_lines, 0usize, "requests"), (&curl_lines, 1, "curl"), (&node_lines, 2, "node")];
    let mut total = 0;
    for (want, i, name) in expect {
        let Some((p, _)) = clients.get(i) else { continue };
        assert!(!want.is_empty() || name == "node", "{name} logged nothing");
        let got = http_lines(&ex, p.pid(), Role::Client);
        assert_eq!(&got, want, "{name}: client exchanges vs the client's own log");
        total += want.len();
    }
    // The server side of the same traffic, as the server logged it (order across clients
    // interleaves by time; compare as sorted multisets).
    let mut got = http_lines(&ex, server_pid, Role::Server);
    let mut want = server_lines.clone();
    got.sort();
    want.sort();
    assert_eq!(got, want, "server exchanges vs the server's log");
    assert_eq!(want.len(), total, "the server saw every request the clients sent");

    // Fields beyond the log line.
    let mine = |pid: u32| ex.iter().filter(move |e| e.pid == pid);
    let py_pid = clients[0].0.pid();
    let charge = mine(py_pid).find(|e| e.path.as_deref() == Some("/charge")).expect("POST /charge");
    assert!(charge.idempotency_key && charge.idempotent && charge.body_hash.is_some());
    assert_eq!(charge.outcome, OutcomeClass::Success);
    let busy = mine(py_pid).find(|e| e.path.as_deref() == Some("/busy")).expect("GET /busy");
    assert_eq!((busy.outcome, busy.retry_after), (OutcomeClass::Overload, true));
    let missing = mine(server_pid).find(|e| e.path.as_deref() == Some("/missing/2")).expect("server 404");
    assert_eq!(missing.outcome, OutcomeClass::Semantic);
    assert!(mine(server_pid).all(|e| !e.unknown && e.failure.is_none()), "{ex:#?}");
    if let Some((node, _)) = clients.get(2) {
        assert!(mine(node.pid()).all(|e| e.retry_markers.retry_attempt == Some(1)));
    }
}

/// One side's HTTP/2 exchanges, in request order, against that side's log (`PATH CODE` lines).
/// A field the reassembler reports must equal the logged one; a field it could not know (the
/// capture cut a header block) must be absent and the exchange marked unknown.
fn check_h2(ex: &[Exchange], pid: u32, role: Role, log: &[String]) -> Vec<Exchange> {
    let mut v: Vec<Exchange> =
        ex.iter().filter(|e| e.pid == pid && e.role == role && e.protocol == Protocol::Http2).cloned().collect();
    v.sort_by_key(|e| e.request_start_ns);
    assert_eq!(v.len(), log.len(), "{role:?}: one exchange per logged call\n{v:#?}\n{log:?}");
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

/// Reads one line from a child's stdout byte by byte (no buffered reader that could swallow
/// later lines).
fn first_line(p: &mut Proc) -> String {
    use std::io::Read;
    let mut byte = [0u8; 1];
    let mut line = Vec::new();
    while let Some(out) = p.0.stdout.as_mut() {
        if out.read(&mut byte).unwrap_or(0) == 0 || byte[0] == b'\n' {
            break;
        }
        line.push(byte[0]);
    }
    String::from_utf8_lossy(&line).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_h2c_exchanges_equal_what_the_peers_logged() {
    if !can_run() || !have("node", "--version") {
        return;
    }
    let Some(mut cap) = load_capture() else { return };
    let port = free_port();
    let ps = port.to_string();
    let mut server = Proc::spawn(Command::new("node").args(["-e", NODE_H2_SERVER_JS, &ps]).stdout(Stdio::piped()));
    assert_eq!(first_line(&mut server), "ready");
    let mut client = Proc::spawn(Command::new("node").args(["-e", NODE_H2_CLIENT_JS, &ps]).stdout(Stdio::piped()));
    let client_lines = output_lines(&mut client);
    assert_eq!(client_lines.len(), 6, "{client_lines:?}");
    let pids = [server.pid(), client.pid()];
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&pids), |_| false).await;
    let server_pid = server.pid();
    let _ = server.0.kill();
    let server_lines = output_lines(&mut server);
    let ex = reassemble(&evs);
    let client_ex = check_h2(&ex, client.pid(), Role::Client, &client_lines);
    check_h2(&ex, server_pid, Role::Server, &server_lines);
    eprintln!("node h2c: {} exchanges, {} fully known", ex.len(), ex.iter().filter(|e| !e.unknown).count());
    // Node writes each batch of frames from one buffer, so the capture holds whole header
    // blocks: every field is known on both sides (Huffman strings, dynamic table and all).
    assert!(ex.iter().all(|e| !e.unknown && e.method == Some(Method::Post)), "{ex:#?}");
    use OutcomeClass::*;
    let classes: Vec<OutcomeClass> = client_ex.iter().map(|e| e.outcome).collect();
    assert_eq!(classes, vec![Success, Transient, Success, Overload, Semantic, Success]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_exchanges_equal_what_the_peers_logged() {
    if !can_run() {
        return;
    }
    if !Command::new("python3").args(["-c", "import grpc"]).status().is_ok_and(|s| s.success()) {
        eprintln!("skip: python grpcio not installed");
        return;
    }
    let Some(mut cap) = load_capture() else { return };
    let port = free_port();
    let ps = port.to_string();
    let mut server = Proc::spawn(python(GRPC_SERVER_PY, &[&ps]).stdout(Stdio::piped()));
    assert_eq!(first_line(&mut server), "ready");
    let mut client = Proc::spawn(python(GRPC_CLIENT_PY, &[&ps]).stdout(Stdio::piped()));
    let client_lines = output_lines(&mut client);
    assert_eq!(client_lines.len(), 7, "{client_lines:?}");
    let pids = [server.pid(), client.pid()];
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&pids), |_| false).await;
    let server_pid = server.pid();
    let _ = server.0.kill();
    let server_lines = output_lines(&mut server);
    let ex = reassemble(&evs);

    let client_ex = check_h2(&ex, client.pid(), Role::Client, &client_lines);
    let server_ex = check_h2(&ex, server_pid, Role::Server, &server_lines);
    // Reads are whole (recvmsg): the client always knows the statuses, the server the paths.
    use OutcomeClass::*;
    let classes: Vec<OutcomeClass> = client_ex.iter().map(|e| e.outcome).collect();
    assert_eq!(classes, vec![Success, Transient, Success, Overload, Semantic, Semantic, Success]);
    assert!(server_ex.iter().all(|e| e.path.is_some() && e.method == Some(Method::Post)), "{server_ex:#?}");
    // grpcio writes each frame as many small iovecs: the capture must follow enough of them, and
    // the default prefix must hold a whole header block, or the HPACK table is lost and every
    // later exchange on the connection turns unknown (client paths and retry markers with it).
    assert!(client_ex.iter().chain(server_ex.iter()).all(|e| !e.unknown), "grpcio exchanges decoded whole: {ex:#?}");
    assert!(client_ex.iter().all(|e| e.path.is_some()), "client paths: {client_ex:#?}");
}

/// A keep-alive server that sends response bodies without copying them through user memory:
/// `socket.sendfile` (sendfile(2), nginx's default for static files) and `os.splice` through a
/// pipe (proxies). Logs `GET PATH STATUS` per request.
const ZERO_COPY_SERVER_PY: &str = r#"
import os, socket, sys, tempfile
body = b"z" * 100000
f = tempfile.TemporaryFile()
f.write(body)
f.flush()
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", int(sys.argv[1])))
srv.listen(8)
while True:
    c, _ = srv.accept()
    buf = b""
    while True:
        d = c.recv(65536)
        if not d:
            break
        buf += d
        while b"\r\n\r\n" in buf:
            head, buf = buf.split(b"\r\n\r\n", 1)
            path = head.split(b" ")[1].decode()
            status = 200
            if path == "/sendfile":
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
                c.sendfile(f, 0)
            elif path == "/splice":
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
                r, w = os.pipe()
                off = 0
                while off < len(body):
                    n = os.splice(f.fileno(), w, min(65536, len(body) - off), offset_src=off)
                    off += n
                    while n:
                        n -= os.splice(r, c.fileno(), n)
                os.close(r)
                os.close(w)
            else:
                status = 404
                c.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            print("GET %s %d" % (path, status), flush=True)
    c.close()
"#;

/// Bodies sent with sendfile(2) or splice(2) never pass through user memory: capture counts
/// them, l7 frames them, and the keep-alive connection parses on to the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_copy_bodies_are_framed() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load_capture() else { return };
    let (mut server, port) = python_server(ZERO_COPY_SERVER_PY, &[]);
    let url = |p: &str| format!("http://127.0.0.1:{port}{p}");
    let curl = Proc::spawn(Command::new("curl").args([
        "-s", "-o", "/dev/null", "-o", "/dev/null", "-o", "/dev/null",
        &url("/sendfile"), &url("/splice"), &url("/missing"),
    ]));
    let pids = vec![server.pid(), curl.pid()];
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&pids), |_| false).await;
    let server_pid = server.pid();
    let _ = server.0.kill();
    let logged = output_lines(&mut server);
    let ex = reassemble(&evs);
    assert_eq!(logged, ["GET /sendfile 200", "GET /splice 200", "GET /missing 404"], "the server's own log");
    assert_eq!(http_lines(&ex, server_pid, Role::Server), logged, "server exchanges vs its log");
    assert_eq!(http_lines(&ex, curl.pid(), Role::Client), logged, "curl's exchanges");
    for e in ex.iter().filter(|e| e.pid == server_pid && e.status == Some(200)) {
        assert!(e.response_bytes >= 100_000 && !e.unknown, "{e:?}");
    }
}

/// A self-signed certificate and key in a fresh directory (removed by the caller).
fn self_signed(tag: &str) -> (std::path::PathBuf, String, String) {
    let dir = std::env::temp_dir().join(format!("ra-tls-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"])
        .arg("-keyout").arg(&key).arg("-out").arg(&cert)
        .stdout(Stdio::null()).stderr(Stdio::null()).status();
    assert!(made.is_ok_and(|s| s.success()), "openssl req");
    (dir, cert.display().to_string(), key.display().to_string())
}

/// The keep-alive server above, wrapped in TLS (Python's ssl: SSL_read_ex/SSL_write_ex);
/// arguments: port, cert, key.
fn tls_server_py() -> String {
    let py = HTTP_SERVER_PY.replace(
        "http.server.ThreadingHTTPServer((\"127.0.0.1\", int(sys.argv[1])), H).serve_forever()",
        "import ssl\nsrv = http.server.ThreadingHTTPServer((\"127.0.0.1\", int(sys.argv[1])), H)\n\
         ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)\nctx.load_cert_chain(sys.argv[2], sys.argv[3])\n\
         srv.socket = ctx.wrap_socket(srv.socket, server_side=True)\nsrv.serve_forever()",
    );
    assert_ne!(py, HTTP_SERVER_PY, "the TLS wrapper must apply");
    py
}

/// curl over HTTPS, two URLs on one connection; its `GET PATH CODE` lines.
fn curl_https(port: u16, paths: [&str; 2]) -> (Proc, Vec<String>) {
    let url = |p: &str| format!("https://127.0.0.1:{port}{p}");
    let mut curl = Proc::spawn(
        Command::new("curl")
            .args(["-sk", "-o", "/dev/null", "-o", "/dev/null", "-w", "GET %{url_effective} %{http_code}\\n"])
            .args([url(paths[0]), url(paths[1])])
            .stdout(Stdio::piped()),
    );
    let lines = output_lines(&mut curl).iter().map(|l| l.replace(&format!("https://127.0.0.1:{port}"), "")).collect();
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
    let Some(mut cap) = load_capture() else { return };
    let (mut server, port) = python_server(&tls_server_py(), &[&cert, &key]);
    let (curl, curl_lines) = curl_https(port, ["/tls/curl", "/missing/tls"]);
    let requests_py = format!(
        "import requests, urllib3\nurllib3.disable_warnings()\ns = requests.Session()\n\
         for p in ['/tls/py', '/busy']:\n    r = s.get('https://127.0.0.1:{port}' + p, verify=False)\n    print('GET', p, r.status_code, flush=True)\n"
    );
    let mut py = Proc::spawn(python(&requests_py, &[]).stdout(Stdio::piped()));
    let py_lines = output_lines(&mut py);
    let pids = vec![server.pid(), curl.pid(), py.pid()];
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&pids), |_| false).await;
    let server_pid = server.pid();
    let _ = server.0.kill();
    let mut server_lines = output_lines(&mut server);
    let _ = std::fs::remove_dir_all(&dir);
    let ex = reassemble(&evs);
    assert_eq!(curl_lines, ["GET /tls/curl 200", "GET /missing/tls 404"], "curl's own log");
    assert_eq!(py_lines, ["GET /tls/py 200", "GET /busy 503"], "requests' own log");
    assert_eq!(http_lines(&ex, curl.pid(), Role::Client), curl_lines, "curl's exchanges (SSL_write/SSL_read)");
    assert_eq!(http_lines(&ex, py.pid(), Role::Client), py_lines, "requests' exchanges (SSL_write_ex/SSL_read_ex)");
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
    if !can_run() || !have("openssl", "version") || !have("unshare", "--version") || !std::path::Path::new(LIBSSL).exists() {
        return;
    }
    let (dir, cert, key) = self_signed("ns");
    let copy = dir.join("libssl.so.3");
    std::fs::copy(LIBSSL, &copy).expect("copy libssl");
    let Some(mut cap) = load_capture() else { return };
    let port = free_port();
    let ps = port.to_string();
    let script = dir.join("server.py");
    std::fs::write(&script, tls_server_py()).expect("script");
    let mut server = Proc::spawn(
        Command::new("unshare")
            .args(["-m", "sh", "-c"])
            .arg(format!("mount --bind {} {LIBSSL} && exec python3 -u {} {ps} {cert} {key}", copy.display(), script.display()))
            .stdout(Stdio::piped()),
    );
    wait_listening(&format!("127.0.0.1:{port}"), None);
    let added = cap.rescan_tls();
    assert!(added >= 1, "the namespace's libssl copy must be a new library: {added}");
    let (curl, curl_lines) = curl_https(port, ["/ns/a", "/missing/ns"]);
    let pids = vec![server.pid(), curl.pid()];
    // The server is python under `sh -c ... exec`: the same pid.
    let evs = collect(&mut cap, Duration::from_secs(3), involving(&pids), |_| false).await;
    let server_pid = server.pid();
    let _ = server.0.kill();
    let server_lines = output_lines(&mut server);
    let _ = std::fs::remove_dir_all(&dir);
    let ex = reassemble(&evs);
    assert_eq!(curl_lines, ["GET /ns/a 200", "GET /missing/ns 404"], "curl's own log");
    assert_eq!(http_lines(&ex, server_pid, Role::Server), server_lines, "server exchanges through its private libssl");
    assert_eq!(server_lines.len(), 2);
}
