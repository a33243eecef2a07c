//! Storm-lab service, Rust flavour: a hyper 1 server on tokio; outbound calls through a hyper
//! client wrapped in a retry layer (attempts, jittered backoff, retry on 5xx, transport errors and
//! timeouts, optional retry budget). It knows nothing about the agent.
//!
//! Config: one JSON document in $LAB_CFG (written by lab/lab.py). Ground truth: one JSON line
//! per request served, appended to `log`.
use std::{
    collections::BTreeMap,
    convert::Infallible,
    io::Write,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use http_body_util::{BodyExt, Empty, Full};
use hyper::{
    Request, Response, StatusCode,
    body::{Bytes, Incoming},
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::{TcpListener, TcpStream};

#[derive(Deserialize)]
struct Fault {
    kind: String,
    rate: f64,
    start: f64,
    end: f64,
    #[serde(default)]
    latency_ms: u64,
}

#[derive(Deserialize)]
struct Downstream {
    name: String,
    url: String,
    retries: u32,
    timeout_ms: u64,
    #[serde(default)]
    backoff_ms: u64,
    budget: Option<f64>,
}

#[derive(Deserialize)]
struct Config {
    epoch_file: String,
    name: String,
    listen: SocketAddr,
    #[serde(default)]
    downstreams: Vec<Downstream>,
    fault: Option<Fault>,
    #[serde(default)]
    work_ms: u64,
    /// Forward the inbound traceparent's trace id to outbound calls (OpenTelemetry).
    #[serde(default)]
    forward_trace: bool,
    log: String,
}

/// Retry budget as a token bucket: each first attempt deposits `ratio`, each retry takes one.
struct Budget {
    ratio: f64,
    tokens: Mutex<f64>,
}

impl Budget {
    fn deposit(&self) {
        if let Ok(mut t) = self.tokens.lock() {
            *t = (*t + self.ratio).min(10.0);
        }
    }
    fn withdraw(&self) -> bool {
        match self.tokens.lock() {
            Ok(mut t) if *t >= 1.0 => {
                *t -= 1.0;
                true
            }
            _ => false,
        }
    }
}

struct Caller {
    name: String,
    addr: SocketAddr,
    authority: String,
    path: String,
    retries: u32,
    timeout: Duration,
    backoff_ms: u64,
    budget: Option<Budget>,
}

/// Why an attempt failed; every kind is retryable for this client (as for most).
#[derive(Debug)]
enum CallError {
    Connect,
    Http,
    Build,
    Timeout,
}

impl Caller {
    fn new(ds: Downstream) -> Result<Caller, String> {
        let rest = ds
            .url
            .strip_prefix("http://")
            .ok_or_else(|| format!("{}: not http://", ds.url))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let addr = authority.parse().map_err(|e| format!("{authority}: {e}"))?;
        Ok(Caller {
            name: ds.name,
            addr,
            authority: authority.to_string(),
            path: path.to_string(),
            retries: ds.retries,
            timeout: Duration::from_millis(ds.timeout_ms),
            backoff_ms: ds.backoff_ms,
            budget: ds.budget.map(|ratio| Budget {
                ratio,
                tokens: Mutex::new(0.0),
            }),
        })
    }

    /// One attempt on a fresh connection, bounded by the per-try timeout.
    async fn attempt(&self, rid: &str, trace: Option<&str>) -> Result<StatusCode, CallError> {
        let fut = async {
            let stream = TcpStream::connect(self.addr)
                .await
                .map_err(|_| CallError::Connect)?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|_| CallError::Http)?;
            tokio::spawn(conn);
            // A distinct path and request id per logical request, the same on every retry of it.
            let mut req = Request::get(format!("{}/{rid}", self.path))
                .header("host", &self.authority)
                .header("x-request-id", rid)
                .header("x-lab-parent", rid);
            if let Some(t) = trace {
                req = req.header("traceparent", t);
            }
            let req = req
                .body(Empty::<Bytes>::new())
                .map_err(|_| CallError::Build)?;
            let resp = sender
                .send_request(req)
                .await
                .map_err(|_| CallError::Http)?;
            let status = resp.status();
            resp.into_body()
                .collect()
                .await
                .map_err(|_| CallError::Http)?;
            Ok(status)
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .unwrap_or(Err(CallError::Timeout))
    }

    /// The retry layer: retry transport errors, timeouts and 5xx up to `retries` more times,
    /// within the budget, with full-jitter backoff. Returns (ok, attempts).
    async fn call(&self, rid: &str, trace: Option<&str>) -> (bool, u32) {
        if let Some(b) = &self.budget {
            b.deposit();
        }
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.attempt(rid, trace).await {
                Ok(s) if !s.is_server_error() => return (true, attempts),
                _ => {}
            }
            if attempts > self.retries || self.budget.as_ref().is_some_and(|b| !b.withdraw()) {
                return (false, attempts);
            }
            if self.backoff_ms > 0 {
                let ms = rand_u64() % (self.backoff_ms * u64::from(attempts) + 1);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
        }
    }
}

struct Svc {
    epoch_file: String,
    epoch: Mutex<Option<f64>>,
    name: String,
    callers: Vec<Caller>,
    fault: Option<Fault>,
    work_ms: u64,
    forward_trace: bool,
    log: Mutex<std::fs::File>,
}

impl Svc {
    /// The run's time zero, written by the lab once the whole fleet listens (fault windows are
    /// relative to it); None until then.
    fn epoch(&self) -> Option<f64> {
        let mut e = self.epoch.lock().ok()?;
        if e.is_none() {
            *e = std::fs::read_to_string(&self.epoch_file)
                .ok()
                .and_then(|s| s.trim().parse().ok());
        }
        *e
    }
}

static SEED: AtomicU64 = AtomicU64::new(0);

/// xorshift64*: jitter and fault sampling need no cryptographic randomness.
fn rand_u64() -> u64 {
    let mut x = SEED.load(Ordering::Relaxed);
    if x == 0 {
        x = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1;
    }
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    SEED.store(x, Ordering::Relaxed);
    x.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// With `forward_trace` (an OpenTelemetry-instrumented service): the inbound W3C trace
/// context's trace id under a new span id, or a new trace when none came in.
fn outbound_trace(inbound: Option<&str>) -> String {
    let trace_id = inbound
        .and_then(|t| {
            let parts: Vec<&str> = t.split('-').collect();
            (parts.len() == 4 && parts[1].len() == 32).then(|| parts[1].to_string())
        })
        .unwrap_or_else(|| format!("{:016x}{:016x}", rand_u64(), rand_u64()));
    format!("00-{trace_id}-{:016x}-01", rand_u64())
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

async fn handle(
    svc: Arc<Svc>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let t0 = now_s();
    let started = Instant::now();
    let parent = req
        .headers()
        .get("x-lab-parent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let id = format!("{:016x}", rand_u64());
    let trace = svc.forward_trace.then(|| {
        outbound_trace(
            req.headers()
                .get("traceparent")
                .and_then(|v| v.to_str().ok()),
        )
    });
    let mut attempts = BTreeMap::new();
    let mut cause = "none";
    for c in &svc.callers {
        let (ok, n) = c.call(&id, trace.as_deref()).await;
        attempts.insert(c.name.clone(), n);
        if !ok {
            cause = "downstream";
            break;
        }
    }
    let mut faulted = false;
    let rel = svc.epoch().map(|e| t0 - e);
    if cause == "none"
        && let Some(f) = &svc.fault
        && let Some(rel) = rel
        && rel >= f.start
        && rel < f.end
        && (rand_u64() as f64 / u64::MAX as f64) < f.rate
    {
        faulted = true;
        if f.kind == "latency" {
            tokio::time::sleep(Duration::from_millis(f.latency_ms)).await;
        } else {
            cause = "own";
        }
    }
    if svc.work_ms > 0 {
        tokio::time::sleep(Duration::from_millis(svc.work_ms)).await;
    }
    let status = match cause {
        "none" => StatusCode::OK,
        "own" => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_GATEWAY,
    };
    let rec = serde_json::json!({
        "t": t0, "d": started.elapsed().as_secs_f64(), "svc": svc.name, "id": id, "parent": parent,
        "cause": cause, "ok": cause == "none", "attempts": attempts, "fault": faulted,
        "status": status.as_u16(),
    });
    if let Ok(mut f) = svc.log.lock() {
        let _ = writeln!(f, "{rec}");
    }
    let mut resp = Response::new(Full::new(Bytes::from_static(b"ok\n")));
    *resp.status_mut() = status;
    Ok(resp)
}

#[tokio::main]
async fn main() {
    let cfg: Config = match std::env::var("LAB_CFG")
        .map_err(|e| e.to_string())
        .and_then(|s| serde_json::from_str(&s).map_err(|e| e.to_string()))
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("lab-rust-svc: bad LAB_CFG: {e}");
            std::process::exit(64);
        }
    };
    let log = match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&cfg.log)
    {
        Ok(f) => f,
        Err(e) => {
            eprintln!("lab-rust-svc: {}: {e}", cfg.log);
            std::process::exit(1);
        }
    };
    let mut callers = Vec::new();
    for ds in cfg.downstreams {
        match Caller::new(ds) {
            Ok(c) => callers.push(c),
            Err(e) => {
                eprintln!("lab-rust-svc: downstream {e}");
                std::process::exit(64);
            }
        }
    }
    let svc = Arc::new(Svc {
        epoch_file: cfg.epoch_file,
        epoch: Mutex::new(None),
        name: cfg.name,
        callers,
        fault: cfg.fault,
        work_ms: cfg.work_ms,
        forward_trace: cfg.forward_trace,
        log: Mutex::new(log),
    });
    let listener = match TcpListener::bind(cfg.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("lab-rust-svc: bind {}: {e}", cfg.listen);
            std::process::exit(1);
        }
    };
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let svc = svc.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(svc.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
