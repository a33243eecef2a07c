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
/// its own with 500; anything else 200.
pub const SERVICE_A_PY: &str = r#"
import sys, http.server, http.client
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

/// What the agent derived from a capture.
pub struct Derived {
    pub exchanges: HashMap<ExchangeId, Exchange>,
    pub verdicts: Vec<Verdict>,
    pub engine: Engine,
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
