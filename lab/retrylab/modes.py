"""One mode of a run: the fleet up, load, the fault, the logs gathered, the fleet down."""
import json
import os
import shutil
import time
import urllib.request

from .common import GRPC_RUNTIMES, LAB, LOAD_NS, STATE_DIR, LabError, log, sh
from .scenario import edge_policy, envoy_admin, node_ip, node_port, sidecar_port
from .build import command, named_link, real, sidecar_command
from .fleet import cleanup, setup_topology, spawn, wait_port
from .agent import fetch_json, items, start_agent, stop
from .analysis import analyse_mode, decisions_of, host_figures, parse_envoy_stats


def run_mode(sc, mode, args, out):
    mode_dir = out / mode
    # Services append to their logs: a reused output directory must start empty.
    shutil.rmtree(mode_dir, ignore_errors=True)
    mode_dir.mkdir(parents=True, exist_ok=True)
    nodes = sc["nodes"]
    by = {n["name"]: n for n in nodes}
    cleanup()
    setup_topology(sc)
    procs = []
    agent_procs = []
    try:
        if mode != "none":
            agent_procs, why = start_agent(sc, mode, args, mode_dir)
            if why:
                log("mode %s skipped: %s" % (mode, why))
                return {"mode": mode, "skipped": why}
        # Fault windows are relative to time zero, which the lab writes to epoch_file once
        # every service listens (slow starts on a busy machine do not shift the windows).
        epoch_file = mode_dir / "epoch"
        try:
            epoch_file.unlink()
        except OSError:
            pass
        f = sc.get("fault")
        # Sidecars first: their callers' first calls go through them.
        sidecars = [n for n in nodes if n.get("sidecar") == "envoy"]
        for n in sidecars:
            argv = sidecar_command(n, sc, mode_dir) + ["--log-path", str(mode_dir / (n["name"] + ".envoy.log"))]
            procs.append(spawn(argv, ns="ralab-" + n["name"], out=mode_dir / (n["name"] + ".envoy.jsonl")))
        for n in sidecars:
            if not wait_envoy(envoy_admin(n), time.time() + sc.get("startup_timeout_s", 60.0)):
                raise LabError("the Envoy sidecar of %s is not ready in time; see %s" % (
                    n["name"], mode_dir / (n["name"] + ".envoy.log")))
        for n in nodes:
            cfg = {
                "name": n["name"], "runtime": n["runtime"],
                "listen": "%s:%d" % (node_ip(n), node_port(n)),
                "proto": "grpc" if n["runtime"] in GRPC_RUNTIMES else "http",
                "log": str(mode_dir / (n["name"] + ".jsonl")),
                "epoch_file": str(epoch_file),
                "work_ms": n.get("work_ms", sc.get("work_ms", 0)),
                "forward_trace": bool(n.get("forward_trace", False)),
                "fanout": bool(n.get("fanout", False)),
                "downstreams": [],
                "fault": None,
            }
            for c in n["calls"]:
                cn = by[c]
                p = edge_policy(sc, n["name"], c)
                # Through a sidecar, the caller sends to its own Envoy on loopback.
                via = ("127.0.0.1", sidecar_port(cn)) if n in sidecars else (node_ip(cn), node_port(cn))
                cfg["downstreams"].append({
                    "name": c, "url": "http://%s:%d/work" % via,
                    "proto": "grpc" if cn["runtime"] in GRPC_RUNTIMES else "http",
                    "retries": int(p["retries"]), "timeout_ms": int(p["timeout_ms"]),
                    "backoff_ms": int(p.get("backoff_ms", 0)), "budget": p.get("budget"),
                })
            if f and f["kind"] in ("error", "latency"):
                # The fault's node, or one of `also` (own failures elsewhere, same window).
                rate = f["rate"] if f["node"] == n["name"] else f["also"].get(n["name"])
                if rate is not None:
                    cfg["fault"] = {"kind": f["kind"], "rate": rate, "start": f["start_s"],
                                    "end": f["end_s"], "latency_ms": f["latency_ms"]}
            env = dict(os.environ, LAB_CFG=json.dumps(cfg), PYTHONUNBUFFERED="1")
            # HAProxy's stdout is its access log: the ground truth of that hop.
            out = mode_dir / (n["name"] + (".jsonl" if n["runtime"] == "haproxy" else ".stderr"))
            procs.append(spawn(command(n, sc, mode_dir), ns="ralab-" + n["name"], env=env, out=out))
        ready_by = time.time() + sc.get("startup_timeout_s", 60.0)
        for n in nodes:
            if not wait_port(node_ip(n), node_port(n), ready_by):
                raise LabError("service %s (%s) not listening in time; see %s" % (
                    n["name"], n["runtime"], mode_dir / (n["name"] + ".stderr")))
        t0 = time.time() + sc.get("startup_s", 1.0)
        tmp = mode_dir / "epoch.tmp"
        tmp.write_text(repr(t0))
        tmp.replace(epoch_file)
        root = nodes[0]
        load = spawn([str(named_link("ra-load", real("python3"))), str(LAB / "loadgen.py"),
                      "http://%s:%d/work" % (node_ip(root), node_port(root)), str(sc["rate"]),
                      repr(t0), str(sc["duration_s"]), str(sc["root_timeout_ms"]),
                      str(mode_dir / "load.jsonl")], ns=LOAD_NS, out=mode_dir / "load.stderr")
        refused = None
        if f and f["kind"] == "refused":
            refused = threading_refuse(by[f["node"]], t0 + f["start_s"], t0 + f["end_s"])
        deadline = t0 + sc["duration_s"] + sc["root_timeout_ms"] / 1000.0 + 10
        while load.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        if refused is not None:
            refused.join(5)
        for n in sidecars:
            # Envoy's own counters (totals over the mode, incl. retries its breaker refused).
            stats = envoy_get(envoy_admin(n), "/stats?filter=%5Ecluster%5C.outbound")
            (mode_dir / (n["name"] + ".envoy-stats.json")).write_text(
                json.dumps(parse_envoy_stats(stats or "")))
        verdicts, decisions, per_host = [], [], {}
        if mode != "none":
            api = sc.get("agent", {}).get("api", "127.0.0.1:19464")
            if sc.get("hosts"):
                # One agent per host, each with its own socket and decision log.
                for h in sc["hosts"]:
                    hv = items(fetch_json("/v1/verdicts", STATE_DIR / ("api-%s.sock" % h)), "verdicts")
                    hd = decisions_of(mode_dir, "decisions-%s.jsonl" % h)
                    per_host[h] = (hv, hd)
                    verdicts += hv
                    decisions += hd
            else:
                verdicts = items(fetch_json("/v1/verdicts"), "verdicts")
                # The decision log has every decision; the API only the live ones.
                decisions = decisions_of(mode_dir)
                if not decisions:
                    decisions = items(fetch_json("/v1/decisions"), "decisions")
            try:
                with urllib.request.urlopen("http://%s/metrics" % api, timeout=5) as r:
                    (mode_dir / "metrics.txt").write_bytes(r.read())
            except OSError as e:
                log("GET /metrics: %s" % e)
            with open(mode_dir / "verdicts.json", "w") as fo:
                json.dump(verdicts, fo)
            with open(mode_dir / "decisions.json", "w") as fo:
                json.dump(decisions, fo)
    finally:
        stop(procs)
        stop(agent_procs)
        cleanup()
    res = analyse_mode(sc, mode, t0, mode_dir, verdicts, decisions)
    if per_host:
        res["per_host"] = {h: host_figures(sc, t0, v, d) for h, (v, d) in per_host.items()}
    return res


def envoy_get(admin, path, quiet=False):
    try:
        with urllib.request.urlopen("http://%s%s" % (admin, path), timeout=5) as r:
            return r.read().decode(errors="replace")
    except OSError as e:
        if not quiet:
            log("GET %s%s: %s" % (admin, path, e))
        return None


def wait_envoy(admin, deadline):
    """Envoy answers /ready with LIVE once its static listeners and clusters are up."""
    while time.time() < deadline:
        body = envoy_get(admin, "/ready", quiet=True)
        if body and "LIVE" in body:
            return True
        time.sleep(0.1)
    return False


def threading_refuse(n, start, end):
    """Refused connections: a REJECT --reject-with tcp-reset inside the faulty pod's own
    namespace during the window (gone with the namespace if the lab dies)."""
    import threading

    ns = "ralab-" + n["name"]
    # Every packet, not only SYNs: kept-alive connections die too, as when a process crashes.
    rule = ["-p", "tcp", "--dport", str(node_port(n)), "-j", "REJECT", "--reject-with", "tcp-reset"]

    def go():
        time.sleep(max(0.0, start - time.time()))
        sh("ip", "netns", "exec", ns, "iptables", "-w", "-I", "INPUT", *rule, check=False)
        time.sleep(max(0.0, end - time.time()))
        sh("ip", "netns", "exec", ns, "iptables", "-w", "-D", "INPUT", *rule, check=False)

    th = threading.Thread(target=go, daemon=True)
    th.start()
    return th
