// Lab service, Node flavour: http server; outbound calls through fetch (undici) wrapped in the
// retry helper Node users typically write (attempts, jittered backoff, AbortSignal.timeout).
// It knows nothing about the agent. Config: JSON in $LAB_CFG; ground truth: one JSON line per
// request served, appended to cfg.log.
'use strict';
const http = require('http');
const fs = require('fs');
const crypto = require('crypto');

const cfg = JSON.parse(process.env.LAB_CFG);
const log = fs.createWriteStream(cfg.log, { flags: 'a' });

// Retry budget: each first attempt deposits `ratio` tokens, each retry withdraws one.
function makeBudget(ratio) {
  let tokens = 0;
  return {
    deposit() { tokens = Math.min(10, tokens + ratio); },
    withdraw() { if (tokens >= 1) { tokens -= 1; return true; } return false; },
  };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function makeCaller(ds) {
  const budget = ds.budget == null ? null : makeBudget(ds.budget);
  return async function call(reqId, trace) {
    if (budget) budget.deposit();
    let attempts = 0;
    for (;;) {
      attempts += 1;
      try {
        // A distinct path and request id per logical request, the same on every retry of it.
        const headers = { 'x-lab-parent': reqId, 'x-request-id': reqId };
        if (trace) headers.traceparent = trace;
        const res = await fetch(`${ds.url}/${reqId}`, {
          headers,
          signal: AbortSignal.timeout(ds.timeout_ms),
        });
        await res.arrayBuffer();
        if (res.status < 500) return [true, attempts];
      } catch (_e) {
        // timeout, refused, reset: retryable like a 5xx
      }
      if (attempts > ds.retries) return [false, attempts];
      if (budget && !budget.withdraw()) return [false, attempts];
      if (ds.backoff_ms > 0) await sleep(Math.random() * ds.backoff_ms * attempts);
    }
  };
}

const callers = (cfg.downstreams || []).map((ds) => [ds.name, makeCaller(ds)]);

// The run's time zero, written by the lab once the whole fleet listens (fault windows are
// relative to it); null until then.
let epoch = null;
function getEpoch() {
  if (epoch === null) {
    try {
      const v = parseFloat(fs.readFileSync(cfg.epoch_file, 'utf8'));
      if (!Number.isNaN(v)) epoch = v;
    } catch (_e) { /* not written yet */ }
  }
  return epoch;
}

function faultNow() {
  const f = cfg.fault;
  if (!f) return null;
  const e = getEpoch();
  if (e === null) return null;
  const now = Date.now() / 1000 - e;
  if (now >= f.start && now < f.end && Math.random() < (f.rate ?? 1)) return f;
  return null;
}

// With forward_trace (an OpenTelemetry-instrumented service): the inbound W3C trace context's
// trace id on every outbound call, under a new span id; a new trace when none came in.
function outboundTrace(inbound) {
  if (!cfg.forward_trace) return null;
  const parts = (inbound || '').split('-');
  const traceId = parts.length === 4 && parts[1].length === 32
    ? parts[1] : crypto.randomBytes(16).toString('hex');
  return `00-${traceId}-${crypto.randomBytes(8).toString('hex')}-01`;
}

const server = http.createServer(async (req, res) => {
  const t0 = Date.now();
  const reqId = crypto.randomBytes(8).toString('hex');
  const trace = outboundTrace(req.headers.traceparent);
  const attempts = {};
  let cause = 'none';
  for (const [name, call] of callers) {
    const [ok, n] = await call(reqId, trace);
    attempts[name] = n;
    if (!ok) { cause = 'downstream'; break; }
  }
  const fault = cause === 'none' ? faultNow() : null;
  if (fault) {
    if (fault.kind === 'latency') await sleep(fault.latency_ms || 3000);
    else cause = 'own';
  }
  if (cfg.work_ms) await sleep(cfg.work_ms);
  const status = { none: 200, own: 503, downstream: 502 }[cause];
  const rec = {
    t: t0 / 1000, d: (Date.now() - t0) / 1000, svc: cfg.name, id: reqId,
    parent: req.headers['x-lab-parent'] || null, cause, ok: cause === 'none', attempts,
    fault: !!fault, status,
  };
  if (res.destroyed || req.socket.destroyed) rec.abandoned = true;
  res.writeHead(status, { 'Content-Length': 3 });
  res.end('ok\n');
  log.write(JSON.stringify(rec) + '\n');
});
server.keepAliveTimeout = 30000;
const i = cfg.listen.lastIndexOf(':');
server.listen(Number(cfg.listen.slice(i + 1)), cfg.listen.slice(0, i));
process.on('SIGTERM', () => { log.end(() => process.exit(0)); });
