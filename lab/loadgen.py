"""Open-loop constant-rate load at the lab's root: request k is due at t0 + k/rate whether or not
earlier ones have answered (no coordinated omission). One JSON line per request on stdout's file.

argv: url rate t0 duration_s timeout_ms out_path
"""
import http.client
import json
import queue
import random
import sys
import threading
import time
import urllib.parse

url, rate, t0, duration, timeout_ms, out = sys.argv[1:7]
rate, t0, duration, timeout = float(rate), float(t0), float(duration), float(timeout_ms) / 1000
u = urllib.parse.urlsplit(url)
host, port, path = u.hostname, u.port or 80, u.path or "/"
due = queue.Queue()
lock = threading.Lock()
f = open(out, "w", buffering=1)


def worker():
    conn = None
    while True:
        item = due.get()
        if item is None:
            return
        k, t = item
        start = time.time()
        status = 0
        try:
            if conn is None:
                conn = http.client.HTTPConnection(host, port, timeout=timeout)
            # Distinct requests have distinct paths (an observer must not take them for retries).
            # A W3C trace context per request, as an instrumented edge proxy would send: the
            # services that forward it (forward_trace) carry its trace id on their calls.
            conn.request("GET", "%s/load-%d" % (path, k),
                         headers={"traceparent": "00-%032x-%016x-01" % (
                             random.getrandbits(128), random.getrandbits(64))})
            r = conn.getresponse()
            r.read()
            status = r.status
        except (OSError, http.client.HTTPException):
            if conn is not None:
                conn.close()
            conn = None
        end = time.time()
        rec = {"t": round(t, 4), "start": round(start, 4), "d": round(end - t, 4), "status": status}
        with lock:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")


workers = [threading.Thread(target=worker, daemon=True) for _ in range(min(256, int(rate * timeout) + 16))]
for w in workers:
    w.start()
n = int(rate * duration)
for k in range(n):
    t = t0 + k / rate
    delay = t - time.time()
    if delay > 0:
        time.sleep(delay)
    due.put((k, t))
for _ in workers:
    due.put(None)
for w in workers:
    w.join(timeout + 1)
f.close()
