"""Lab service, Python flavour: a thread-per-request HTTP (or gRPC) server whose outbound calls go
through `requests` with urllib3 `Retry` (HTTP callees) or grpcio's service-config retry policy
(gRPC callees). It knows nothing about the agent.

Config is one JSON document in $LAB_CFG (written by lab/lab.py). Every request served appends one
JSON line to cfg["log"]: the ground truth the lab scores the agent against.
"""
import json
import os
import random
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CFG = json.loads(os.environ["LAB_CFG"])
NAME = CFG["name"]
LOG_LOCK = threading.Lock()
LOG = open(CFG["log"], "a", buffering=1)


class Budget:
    """Retry budget as a token bucket (Finagle/gRPC style): each first attempt deposits `ratio`
    tokens, each retry withdraws one, so retries stay <= ratio x requests over time."""

    def __init__(self, ratio, cap=10.0):
        self.ratio = ratio
        self.cap = cap
        self.tokens = 0.0
        self.lock = threading.Lock()

    def deposit(self):
        with self.lock:
            self.tokens = min(self.cap, self.tokens + self.ratio)

    def withdraw(self):
        with self.lock:
            if self.tokens >= 1.0:
                self.tokens -= 1.0
                return True
            return False


EPOCH = None


def epoch():
    """The run's time zero, written by the lab once the whole fleet listens (fault windows are
    relative to it); None until then."""
    global EPOCH
    if EPOCH is None:
        try:
            with open(CFG["epoch_file"]) as f:
                EPOCH = float(f.read())
        except (OSError, ValueError, KeyError):
            return None
    return EPOCH


def fault_now():
    """The fault configured for this service, if its window is open now."""
    f = CFG.get("fault")
    if not f:
        return None
    e = epoch()
    if e is None:
        return None
    now = time.time() - e
    if f["start"] <= now < f["end"] and random.random() < f.get("rate", 1.0):
        return f
    return None


# ---- outbound: HTTP via requests + urllib3 Retry ---------------------------------------------
import requests  # noqa: E402
from requests.adapters import HTTPAdapter  # noqa: E402
from urllib3.exceptions import MaxRetryError  # noqa: E402
from urllib3.util.retry import Retry  # noqa: E402

TLS = threading.local()


def retry_class(budget):
    """A urllib3 Retry that also honours a retry budget and counts retries per thread."""

    class BudgetRetry(Retry):
        def increment(self, method=None, url=None, response=None, error=None, _pool=None,
                      _stacktrace=None):
            new = super().increment(method, url, response, error, _pool, _stacktrace)
            if budget is not None and not budget.withdraw():
                raise MaxRetryError(_pool, url, error or Exception("retry budget exhausted"))
            TLS.retries = getattr(TLS, "retries", 0) + 1
            return new

    return BudgetRetry


def http_caller(ds):
    budget = Budget(ds["budget"]) if ds.get("budget") is not None else None
    rc = retry_class(budget)
    timeout = ds["timeout_ms"] / 1000.0

    def session():
        s = getattr(TLS, "sessions", None)
        if s is None:
            s = TLS.sessions = {}
        if ds["name"] not in s:
            sess = requests.Session()
            retry = rc(total=ds["retries"], connect=ds["retries"], read=ds["retries"],
                       status=ds["retries"], status_forcelist=[500, 502, 503, 504],
                       allowed_methods=None, backoff_factor=ds.get("backoff_ms", 0) / 1000.0,
                       raise_on_status=False, respect_retry_after_header=False)
            sess.mount("http://", HTTPAdapter(max_retries=retry, pool_maxsize=8))
            s[ds["name"]] = sess
        return s[ds["name"]]

    def call(req_id, trace):
        if budget is not None:
            budget.deposit()
        TLS.retries = 0
        try:
            # A distinct path and request id per logical request (as real callers send item ids
            # and x-request-id), the same on every retry of it.
            headers = {"x-lab-parent": req_id, "x-request-id": req_id}
            if trace:
                headers["traceparent"] = trace
            r = session().get(ds["url"] + "/" + req_id, headers=headers, timeout=timeout)
            ok = r.status_code < 500
            r.close()
        except requests.RequestException:
            ok = False
        return ok, 1 + TLS.retries

    return call


# ---- outbound: gRPC with a service-config retry policy ---------------------------------------
def grpc_caller(ds):
    import grpc

    policy = {
        "methodConfig": [{
            "name": [{"service": "lab.Hop"}],
            "timeout": "%.3fs" % (ds["timeout_ms"] / 1000.0),
            "retryPolicy": {
                "maxAttempts": max(2, ds["retries"] + 1),
                "initialBackoff": "%.3fs" % max(0.001, ds.get("backoff_ms", 1) / 1000.0),
                "maxBackoff": "0.1s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }],
    }
    if ds.get("budget") is not None:
        # gRPC's own budget: retries stop while tokens < maxTokens/2.
        policy["retryThrottling"] = {"maxTokens": 10, "tokenRatio": ds["budget"]}
    if ds["retries"] == 0:
        del policy["methodConfig"][0]["retryPolicy"]
    target = ds["url"].split("://", 1)[-1].split("/", 1)[0]
    ch = grpc.insecure_channel(target, options=[
        ("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(policy))])
    stub = ch.unary_unary("/lab.Hop/Work")

    def call(req_id, trace):
        md = (("x-lab-parent", req_id), ("x-request-id", req_id))
        if trace:
            md += (("traceparent", trace),)
        try:
            stub(req_id.encode(), metadata=md)
            ok = True
        except grpc.RpcError:
            ok = False
        # grpcio does not expose attempt counts to the caller: the callee's log has them.
        return ok, None

    return call


CALLERS = [(ds["name"], grpc_caller(ds) if ds.get("proto") == "grpc" else http_caller(ds))
           for ds in CFG.get("downstreams", [])]


def outbound_trace(inbound):
    """With `forward_trace` (an OpenTelemetry-instrumented service): the inbound W3C trace
    context's trace id on every outbound call, under a new span id; a new trace when none came
    in. Without it, no trace header at all."""
    if not CFG.get("forward_trace"):
        return None
    parts = (inbound or "").split("-")
    trace_id = parts[1] if len(parts) == 4 and len(parts[1]) == 32 else uuid.uuid4().hex
    return "00-%s-%s-01" % (trace_id, uuid.uuid4().hex[:16])


def handle(parent, trace_in=None):
    """Serve one request: call every downstream in order, then maybe fail on our own."""
    req_id = uuid.uuid4().hex[:16]
    trace = outbound_trace(trace_in)
    t0 = time.time()
    attempts = {}
    cause = "none"
    for name, call in CALLERS:
        ok, n = call(req_id, trace)
        attempts[name] = n
        if not ok:
            cause = "downstream"
            break
    fault = fault_now() if cause == "none" else None
    if fault is not None:
        if fault["kind"] == "latency":
            time.sleep(fault.get("latency_ms", 3000) / 1000.0)
        else:
            cause = "own"
    if CFG.get("work_ms"):
        time.sleep(CFG["work_ms"] / 1000.0)
    rec = {"t": round(t0, 4), "d": round(time.time() - t0, 4), "svc": NAME, "id": req_id,
           "parent": parent, "cause": cause, "ok": cause == "none", "attempts": attempts,
           "fault": fault is not None, "tid": threading.get_native_id()}
    return rec


def log(rec):
    line = json.dumps(rec, separators=(",", ":"))
    with LOG_LOCK:
        LOG.write(line + "\n")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        rec = handle(self.headers.get("x-lab-parent"), self.headers.get("traceparent"))
        status = {"none": 200, "own": 503, "downstream": 502}[rec["cause"]]
        rec["status"] = status
        body = b"ok\n" if status == 200 else b"fail\n"
        try:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            rec["abandoned"] = True  # the caller gave up (timeout) before we answered
        log(rec)

    def log_message(self, *args):
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512

    def server_bind(self):
        # HTTPServer.server_bind resolves our own name (getfqdn): a DNS round trip we don't need.
        import socketserver
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


def serve_grpc(host, port):
    import grpc
    from concurrent import futures

    def work(_req, ctx):
        md = dict(ctx.invocation_metadata())
        rec = handle(md.get("x-lab-parent"), md.get("traceparent"))
        rec["prev_attempts"] = int(md.get("grpc-previous-rpc-attempts", "0"))
        rec["status"] = {"none": 0, "own": 14, "downstream": 14}[rec["cause"]]
        log(rec)
        if rec["cause"] != "none":
            ctx.abort(grpc.StatusCode.UNAVAILABLE, rec["cause"])
        return b"ok"

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "lab.Hop", {"Work": grpc.unary_unary_rpc_method_handler(work)}),))
    server.add_insecure_port("%s:%d" % (host, port))
    server.start()
    server.wait_for_termination()


def main():
    host, port = CFG["listen"].rsplit(":", 1)
    if CFG.get("proto") == "grpc":
        serve_grpc(host, int(port))
    else:
        Server((host, int(port)), Handler).serve_forever()


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(0)
