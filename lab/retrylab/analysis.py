"""Analysis: the services' ground-truth logs turned into figures, and the agent's verdicts scored."""
import json
import time
from collections import defaultdict

from .common import NET
from .scenario import comm, envoy_cluster, node_ip, node_port


def read_jsonl(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue  # a line cut by the kill, or HAProxy's own chatter
                if isinstance(r, dict) and "d_ms" in r:
                    # An HAProxy access-log line: a proxy only ever fails because its server did.
                    r["d"] = r["d_ms"] / 1000.0
                    r["t"] = (r.get("end_ms", 0) - r["d_ms"]) / 1000.0
                    r["cause"] = "downstream" if r.get("status", 0) >= 500 or r.get("status", 0) <= 0 else "none"
                    r["ok"] = r["cause"] == "none"
                    r["attempts"] = {r.get("callee"): max(0, r.get("retries", 0)) + 1}
                out.append(r)
    except OSError:
        pass
    return out


def decisions_of(mode_dir, name="decisions.jsonl"):
    return [r["decision"] for r in read_jsonl(mode_dir / name)
            if r.get("kind") == "decision" and isinstance(r.get("decision"), dict)]


def service_of(sid, sc):
    """Map an agent ServiceId to a lab node: by process name, port, address or plain name."""
    s = str(sid)
    if "-envoy" in s:
        return None  # a node's Envoy sidecar (comm ra-<node>-envoy), not the node itself
    for n in sc["nodes"]:
        if s == comm(n) or s.startswith(comm(n) + ":") or s == n["name"]:
            return n
    for n in sc["nodes"]:
        if s.endswith(":%d" % node_port(n)) or node_ip(n) + ":" in s or ("=" + n["name"]) in s:
            return n
    return None


def end_name(sid, sc):
    """An edge end as the report names it: a lab node, `<node>.envoy` for a node's sidecar
    (comm ra-<node>-envoy), else the agent's own id."""
    n = service_of(sid, sc)
    if n:
        return n["name"]
    s = str(sid)
    if s.startswith("ra-") and "-envoy" in s:
        return s[3:].split("-envoy", 1)[0] + ".envoy"
    return sid


def host_figures(sc, t0, verdicts, decisions):
    """One host's agent: its verdicts by service and claim, and its decisions by edge (a lab
    node's name where the agent's service id or the callee's address says which)."""
    by_service = defaultdict(lambda: defaultdict(int))
    for v in verdicts:
        n = service_of(v.get("service"), sc) if isinstance(v, dict) else None
        claim = v.get("claim") if isinstance(v, dict) else None
        by_service[n["name"] if n else "?"][str(claim)] += 1
    edges = defaultdict(lambda: defaultdict(int))
    for d in decisions:
        edge = d.get("edge") or {}
        caller = service_of(edge.get("caller"), sc)
        callee = service_of(edge.get("callee"), sc)
        if callee is None:
            callee = next((service_of(a, sc) for a in d.get("callee_addrs") or [] if service_of(a, sc)), None)
        name = "%s->%s" % (caller["name"] if caller else edge.get("caller"),
                           callee["name"] if callee else edge.get("callee"))
        edges[name]["%s/%s" % (d.get("action"), d.get("reason"))] += 1
    return {"verdicts": {k: dict(v) for k, v in sorted(by_service.items())},
            "decisions": {k: dict(v) for k, v in sorted(edges.items())}}


def to_epoch(ts_ns):
    # Kernel timestamps are CLOCK_MONOTONIC (bpf_ktime_get_ns); wall-clock ones are > 1e18.
    if ts_ns is None:
        return None
    ts = ts_ns / 1e9
    if ts_ns < 1e18:
        ts += time.time() - time.monotonic()
    return ts


def in_flight(recs, a, b):
    """Requests the node held at once, on average over [a, b) (Little's law: the time its
    requests spent inside the window over the window's length)."""
    if b <= a:
        return 0.0
    held = sum(max(0.0, min(b, r["t"] + r.get("d", 0.0)) - max(a, r["t"])) for r in recs
               if isinstance(r.get("t"), (int, float)) and isinstance(r.get("d", 0.0), (int, float)))
    return round(held / (b - a), 2)


def analyse_mode(sc, mode, t0, mode_dir, verdicts, decisions):
    rate = float(sc["rate"])
    f = sc.get("fault")
    dur = float(sc["duration_s"])
    if f:
        fs, fe = t0 + f["start_s"], t0 + min(f["end_s"], dur)
    else:
        fs, fe = t0 + dur, t0 + dur
    w0, w1 = fs + sc["settle_s"], fe  # storm steady state
    b0, b1 = t0 + min(2.0, f["start_s"] / 2 if f else 2.0), fs  # baseline
    logs = {n["name"]: read_jsonl(mode_dir / (n["name"] + ".jsonl")) for n in sc["nodes"]}
    load = read_jsonl(mode_dir / "load.jsonl")

    def per_s(recs, a, b):
        return sum(1 for r in recs if a <= r["t"] < b) / max(1e-9, b - a)

    nodes = {}
    by = {n["name"]: n for n in sc["nodes"]}
    for n in sc["nodes"]:
        recs = logs[n["name"]]
        arrivals = None
        callers = [m for m in sc["nodes"] if n["name"] in m["calls"]]
        if f and f["kind"] == "refused" and f["node"] == n["name"] and callers:
            # It served nothing: count the connection attempts its callers made instead.
            arrivals = sum(per_s([r for r in logs[m["name"]]
                                  if isinstance(r.get("attempts", {}).get(n["name"]), int)
                                  for _ in range(r["attempts"][n["name"]])], w0, w1)
                           for m in callers)
        served = per_s(recs, w0, w1)
        x = {
            "runtime": n["runtime"], "depth": n["depth"],
            "served_per_s": round(served, 3),
            "served_x": round((arrivals if arrivals is not None else served) / rate, 3),
            "baseline_x": round(per_s(recs, b0, b1) / rate, 3),
            "own_failures": sum(1 for r in recs if r.get("cause") == "own"),
            "downstream_failures": sum(1 for r in recs if r.get("cause") == "downstream"),
            "served_total": len(recs),
            "abandoned": sum(1 for r in recs if r.get("abandoned")),
            "in_flight": in_flight(recs, w0, w1),
        }
        if arrivals is not None:
            x["counted_from"] = "caller attempts (refused connections)"
        nodes[n["name"]] = x
    # Retries per edge, from the caller's own counts, or the callee's log (gRPC hides them).
    edges = {}
    for n in sc["nodes"]:
        for c in n["calls"]:
            calls = [r for r in logs[n["name"]] if c in r.get("attempts", {})]
            att = [r["attempts"][c] for r in calls]
            if calls and any(a is None for a in att):
                per_parent = defaultdict(int)
                for r in logs[c]:
                    if r.get("parent"):
                        per_parent[r["parent"]] += 1
                att = [per_parent.get(r["id"], 0) or 1 for r in calls]
            ncalls = len(att)
            nretries = sum(att) - ncalls
            edges["%s->%s" % (n["name"], c)] = {
                "calls": ncalls, "retries": nretries,
                "retry_rate": round(nretries / ncalls, 4) if ncalls else None}
    sidecars = {n["name"]: sidecar_figures(sc, n, mode_dir, w0, w1) for n in sc["nodes"]
                if n.get("sidecar") == "envoy"}
    ok = [r for r in load if r["status"] == 200]
    in_f = [r for r in load if fs <= r["t"] < fe]
    timeline = build_timeline(sc, logs, t0)
    res = {
        "mode": mode, "t0": t0, "fault_start": fs - t0 if f else None,
        "fault_end": fe - t0 if f else None, "window": [w0 - t0, w1 - t0],
        "root": {
            "sent": len(load), "ok": len(ok),
            "availability": round(len(ok) / len(load), 5) if load else None,
            "availability_fault_window":
                round(sum(1 for r in in_f if r["status"] == 200) / len(in_f), 5) if in_f else None,
            "latency_p50_s": pct([r["d"] for r in ok], 50),
            "latency_p99_s": pct([r["d"] for r in ok], 99),
        },
        "nodes": nodes, "edges": edges, "timeline": timeline,
    }
    if sidecars:
        res["sidecars"] = sidecars
    if mode != "none":
        res["agent"] = score_agent(sc, logs, verdicts, decisions, fs, t0, mode_dir)
    return res


def parse_envoy_stats(text):
    """Envoy's `/stats` text (`name: value` lines) → {name: int}."""
    out = {}
    for line in text.splitlines():
        name, _, val = line.partition(": ")
        try:
            out[name.strip()] = int(val)
        except ValueError:
            continue
    return out


def sidecar_figures(sc, n, mode_dir, w0, w1):
    """An Envoy sidecar's own figures per callee: from its access log, requests it forwarded in
    the storm window and upstream attempts per request (%UPSTREAM_REQUEST_ATTEMPT_COUNT%); from
    its stats, the mode's totals (upstream_rq_total, _retry, and _retry_overflow: retries its
    circuit breaker refused, which is where the agent's override shows)."""
    by = {m["name"]: m for m in sc["nodes"]}
    att = defaultdict(list)
    try:
        with open(mode_dir / (n["name"] + ".envoy.jsonl")) as f:
            for line in f:
                try:
                    r = json.loads(line)
                    t, a = float(r["t_start_s"]), int(r["attempts"])
                except (ValueError, KeyError, TypeError):
                    continue
                if w0 <= t < w1:
                    att[r.get("callee")].append(a)
    except OSError:
        pass
    try:
        stats = json.loads((mode_dir / (n["name"] + ".envoy-stats.json")).read_text())
    except (OSError, ValueError):
        stats = {}
    out = {}
    for c in n["calls"]:
        cl = "cluster.%s." % envoy_cluster(by[c])
        a = att.get(c, [])
        out[c] = {
            "cluster": envoy_cluster(by[c]),
            "window_requests": len(a),
            "window_attempts_per_request": round(sum(a) / len(a), 3) if a else None,
            "upstream_rq_total": stats.get(cl + "upstream_rq_total"),
            "upstream_rq_retry": stats.get(cl + "upstream_rq_retry"),
            "upstream_rq_retry_overflow": stats.get(cl + "upstream_rq_retry_overflow"),
        }
    return out


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(len(xs) * p / 100))], 4)


def build_timeline(sc, logs, t0):
    n_s = int(sc["duration_s"]) + 1
    out = {}
    for name, recs in logs.items():
        b = [0] * n_s
        for r in recs:
            i = int(r["t"] - t0)
            if 0 <= i < n_s:
                b[i] += 1
        out[name] = b
    return out


def agent_health(mode_dir):
    """The agent's own counters (events seen, drops), to tell a blind agent from a wrong one."""
    out = {}
    try:
        text = (mode_dir / "metrics.txt").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, val = line.rsplit(" ", 1)
        if any(k in name for k in ("capture", "drop", "exchanges", "verdicts", "decisions")):
            try:
                out[name] = float(val)
            except ValueError:
                pass
    return out


def variant(n):
    """What verdicts are scored by: the runtime, `+trace` when the service forwards the W3C
    trace context (the same runtime links differently with and without it), `+fanout` when it
    calls its downstreams at once on spawned goroutines."""
    return (n["runtime"] + ("+trace" if n.get("forward_trace") else "")
            + ("+fanout" if n.get("fanout") else ""))


def first_retry_stopped(sc, logs, fs):
    """Seconds from the fault's onset to the first attempt a caller made that its callee never
    saw, by the services' own records: the caller counted k attempts of a request, the callee
    logged fewer with that request as parent, yet at least one (so it was reachable: a refused
    connection is no stop). Something on the way answered it (the shim, by decision or by the
    callee's claim header). When: the end of the last attempt that got through, which the
    stopped one followed by at most its backoff. None when no attempt was stopped."""
    first = None
    for n in sc["nodes"]:
        for c in n["calls"]:
            by_parent = defaultdict(list)
            for r in logs.get(c, []):
                if r.get("parent"):
                    by_parent[r["parent"]].append(r)
            for r in logs.get(n["name"], []):
                k = r.get("attempts", {}).get(c)
                seen = by_parent.get(r.get("id"), [])
                if not isinstance(k, int) or not seen or len(seen) >= k:
                    continue
                at = max(x["t"] + x.get("d", 0.0) for x in seen)
                if at >= fs - 1 and (first is None or at < first):
                    first = at
    return None if first is None else round(first - fs, 3)


def score_agent(sc, logs, verdicts, decisions, fs, t0, logs_dir):
    """Per runtime: precision = verdicts whose claim matches the ground truth / verdicts that
    took a side; recall = failures served that got a right verdict / failures served (right
    verdicts are capped per node and cause, so duplicate verdicts cannot push it past 1)."""
    by_rt = defaultdict(lambda: {"verdicts": 0, "correct": 0, "missing": 0, "unmatched": 0,
                                 "failures": 0})
    # Per runtime (variant) and linking method: how each way of linking fares on its own.
    by_link = defaultdict(lambda: defaultdict(lambda: {"verdicts": 0, "correct": 0}))
    fail_idx = {}
    for n in sc["nodes"]:
        fails = [r for r in logs[n["name"]] if r.get("cause") in ("own", "downstream")]
        by_rt[variant(n)]["failures"] += len(fails)
        fail_idx[n["name"]] = sorted(fails, key=lambda r: r["t"] + r["d"])
    truth_count = {(n["name"], c): sum(1 for r in fail_idx[n["name"]] if r["cause"] == c)
                   for n in sc["nodes"] for c in ("own", "downstream")}
    right = defaultdict(int)
    unknown_services = set()
    for v in verdicts:
        if not isinstance(v, dict):
            continue
        n = service_of(v.get("service"), sc)
        if n is None:
            unknown_services.add(str(v.get("service")))
            continue
        s = by_rt[variant(n)]
        s["verdicts"] += 1
        claim = v.get("claim")
        if claim not in ("claimed", "unclaimed"):
            s["missing"] += 1
            continue
        lk = by_link[variant(n)][str(v.get("link", "unknown"))]
        status = v.get("status")
        if status == 503:
            truth = "own"
        elif status == 502:
            truth = "downstream"
        else:
            # No HTTP status (gRPC, timeout): the nearest failure that node served.
            ts = to_epoch(v.get("ts_ns"))
            best = None
            for r in fail_idx[n["name"]]:
                dt = abs(r["t"] + r["d"] - ts) if ts else 0
                if best is None or dt < best[0]:
                    best = (dt, r)
            if best is None or best[0] > 0.5:
                s["unmatched"] += 1
                continue
            truth = best[1]["cause"]
        lk["verdicts"] += 1
        if (claim == "claimed") == (truth == "own"):
            s["correct"] += 1
            lk["correct"] += 1
            right[(n["name"], truth)] += 1
    recalled = defaultdict(int)
    rt_of = {n["name"]: variant(n) for n in sc["nodes"]}
    for (node, cause), k in right.items():
        recalled[rt_of[node]] += min(k, truth_count[(node, cause)])
    per_rt = {}
    for rt, s in by_rt.items():
        decided = s["verdicts"] - s["missing"] - s["unmatched"]
        per_rt[rt] = dict(s, precision=round(s["correct"] / decided, 4) if decided else None,
                          recall=round(recalled[rt] / s["failures"], 4) if s["failures"] else None)
    first = None
    per_edge = {}
    for d in decisions:
        if not isinstance(d, dict):
            continue
        addrs = [str(a) for a in d.get("callee_addrs") or []]
        edge = d.get("edge") or {}
        callee = service_of(edge.get("callee"), sc)
        if callee is None and not any(a.startswith(NET + ".") for a in addrs):
            continue  # someone else's traffic on this node
        ts = to_epoch(d.get("issued_at_ns"))
        name = "%s->%s" % (end_name(edge.get("caller"), sc), end_name(edge.get("callee"), sc))
        per_edge.setdefault(name, []).append({
            "action": d.get("action"), "reason": d.get("reason"),
            "at_s": round(ts - t0, 3) if ts is not None else None})
        if d.get("action") == "suppress_retries" and ts is not None and ts >= fs - 1 and (
                first is None or ts < first):
            first = ts
    per_link = {rt: {k: dict(c, precision=round(c["correct"] / c["verdicts"], 4))
                     for k, c in links.items() if c["verdicts"]}
                for rt, links in by_link.items()}
    return {"verdicts": len(verdicts), "decisions": len(decisions), "per_runtime": per_rt,
            "per_link": per_link,
            "health": agent_health(logs_dir),
            "unknown_services": sorted(unknown_services)[:20], "decisions_per_edge": per_edge,
            "first_suppression_s": round(first - fs, 3) if first else None,
            "first_retry_stopped_s": first_retry_stopped(sc, logs, fs),
            "first_suppression_at": round(first - t0, 3) if first else None}
