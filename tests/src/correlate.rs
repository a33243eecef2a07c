//! Helpers for the correlation end-to-end tests (tests/tests/correlate.rs): a three-service
//! chain of small Python servers on loopback, and the l7 → correlate path run over captured
//! events exactly as the agent runs it.
use std::collections::HashMap;

use retry_agent::{
    capture::Event,
    correlate::{CorrelateConfig, Engine, Verdict},
    l7::{Exchange, ExchangeId, L7Config, Reassembler},
};

/// Service B: `/fail...` answers 503 (B fails on its own), anything else 200.
pub const SERVICE_B_PY: &str = r#"
import sys, http.server
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        status = 503 if self.path.startswith("/fail") else 200
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"b\n")
        print(self.path, status, flush=True)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"#;

/// Service A (thread per request): `/chain/N` calls B's `/fail/N` with two attempts (one
/// retry) and answers 502 when both fail; `/own/N` calls B's `/ok/N` (fine) and then fails on
/// its own with 500; `/slow/N` answers 200 after a second; anything else 200.
pub const SERVICE_A_PY: &str = r#"
import sys, time, http.server, http.client
B = int(sys.argv[2])
def call(path):
    c = http.client.HTTPConnection("127.0.0.1", B, timeout=5)
    c.request("GET", path)
    r = c.getresponse()
    r.read()
    c.close()
    return r.status
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        p = self.path
        status = 200
        if p.startswith("/chain/"):
            status = 502
            for attempt in range(2):
                if call("/fail" + p[len("/chain"):]) < 500:
                    status = 200
                    break
        elif p.startswith("/own/"):
            call("/ok" + p[len("/own"):])
            status = 500
        elif p.startswith("/slow/"):
            time.sleep(1.0)
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"a\n")
        print(p, status, flush=True)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"#;

/// The client: one new connection per path; prints `PATH STATUS`, then `done`.
pub const CLIENT_PY: &str = r#"
import sys, urllib.request, urllib.error
for p in sys.argv[2:]:
    try:
        urllib.request.urlopen("http://127.0.0.1:%s%s" % (sys.argv[1], p), timeout=10).read()
        print(p, 200, flush=True)
    except urllib.error.HTTPError as e:
        print(p, e.code, flush=True)
print("done", flush=True)
"#;

/// A client with a 0.3 s timeout: gives up on `/slow/N` while A is still working.
pub const IMPATIENT_CLIENT_PY: &str = r#"
import sys, socket, urllib.request, urllib.error
for p in sys.argv[2:]:
    try:
        urllib.request.urlopen("http://127.0.0.1:%s%s" % (sys.argv[1], p), timeout=0.3).read()
        print(p, 200, flush=True)
    except (socket.timeout, urllib.error.URLError) as e:
        print(p, "timeout", flush=True)
print("done", flush=True)
"#;

/// An event loop (Node): every request on one thread, overlapping; `/chain/N` calls B's
/// `/fail/N` once after 100 ms and answers 502 when it fails.
pub const EVENT_LOOP_JS: &str = r#"
const http = require('http');
const [port, b] = [+process.argv[1], +process.argv[2]];
http.createServer((req, res) => {
  setTimeout(() => {
    http.get({ host: '127.0.0.1', port: b, path: '/fail' + req.url.slice('/chain'.length), agent: false }, (r) => {
      r.resume();
      r.on('end', () => { res.writeHead(r.statusCode >= 500 ? 502 : 200, { 'Content-Length': '2' }); res.end('n\n'); });
    });
  }, 100);
}).listen(port, '127.0.0.1');
"#;

/// Fires all paths at once (threads), each on its own connection; prints `done` at the end.
pub const PARALLEL_CLIENT_PY: &str = r#"
import sys, threading, urllib.request, urllib.error
def get(p):
    try:
        urllib.request.urlopen("http://127.0.0.1:%s%s" % (sys.argv[1], p), timeout=10).read()
    except urllib.error.HTTPError:
        pass
ts = [threading.Thread(target=get, args=(p,)) for p in sys.argv[2:]]
[t.start() for t in ts]
[t.join() for t in ts]
print("done", flush=True)
"#;

/// What the agent derived from a capture.
pub struct Derived {
    pub exchanges: HashMap<ExchangeId, Exchange>,
    pub verdicts: Vec<Verdict>,
    pub engine: Engine,
}

/// Runs `client` (a program printing `done` last) while collecting the events of `pids` and
/// the client; returns the events and the client's lines.
pub async fn capture_while(
    cap: &mut retry_agent::capture::Capture,
    client: crate::capture::Proc,
    pids: &[u32],
) -> (Vec<Event>, Vec<String>) {
    let mut pids = pids.to_vec();
    pids.push(client.pid());
    let collecting =
        crate::capture::collect(cap, std::time::Duration::from_secs(8), move |e: &Event| pids.contains(&e.pid()), |_| false);
    let waiter = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        // One reader for the whole output: lines arriving together must not be lost.
        let mut client = client;
        let Some(out) = client.0.stdout.take() else { return Vec::new() };
        let lines: Vec<String> = std::io::BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .map(|l| l.trim().to_string())
            .take_while(|l| l != "done")
            .collect();
        drop(client);
        lines
    });
    let events = collecting.await;
    let lines = waiter.await.unwrap_or_default();
    (events, lines)
}

/// Events (kernel order) → l7 → correlate, then everything pending judged.
pub fn derive(events: &[Event], cfg: CorrelateConfig) -> Derived {
    let mut l7 = Reassembler::new(L7Config::default());
    let mut engine = Engine::new(cfg);
    let mut xs = Vec::new();
    let mut verdicts = Vec::new();
    let mut exchanges = HashMap::new();
    let mut feed = |xs: &mut Vec<Exchange>, engine: &mut Engine, verdicts: &mut Vec<Verdict>| {
        for x in xs.drain(..) {
            engine.push(&x, verdicts);
            exchanges.insert(x.id, x);
        }
    };
    let mut last = 0;
    for ev in events {
        if let Event::Process(p) = ev {
            engine.on_process(p);
        }
        last = last.max(ev.ts_ns());
        l7.push(ev, &mut xs);
        feed(&mut xs, &mut engine, &mut verdicts);
    }
    // Close what is still open a second after the last event (not at the end of time: the
    // engine's window follows capture time), and complete the current statistics bucket.
    l7.tick(last + 1_000_000_000, &mut xs);
    feed(&mut xs, &mut engine, &mut verdicts);
    engine.tick(last + 1_000_000_000, &mut verdicts);
    engine.flush(&mut verdicts);
    Derived { exchanges, verdicts, engine }
}
