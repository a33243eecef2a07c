#!/usr/bin/env python3
"""The storm lab orchestrator: a polyglot fleet in network namespaces that reproduces a retry storm,
measured with the agent off and on.

    lab.py run SCENARIO.toml [--modes none,observe,shim] [--retries N] [--rate X] [--out DIR]
    lab.py cleanup           # remove every namespace, veth, bridge, rule and process of the lab
    lab.py leftovers         # print what of the lab still exists (JSON); exit 1 if anything

Topology: one network namespace per service (`ralab-<node>`, like a pod) plus `ralab-load` for the
load generator, each joined by a veth pair to the bridge `ralab0` in the root namespace (like a
node). Addresses only inside 10.213.0.0/24. Everything is torn down after the run, after a failure
and on SIGINT/SIGTERM; `cleanup` repairs what a SIGKILL left behind.

Ground truth: every service appends one JSON line per request served (see lab/services/*): whether
it failed on its own (`own`, 503) or because a downstream failed (`downstream`, 502), and how many
attempts it made per downstream. This script turns those lines into the figures (requests served
per node as multiples of the root rate, availability at the root), and scores the agent's verdicts
against them when an agent mode runs.
"""
import argparse
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections import defaultdict, deque
from pathlib import Path

LAB = Path(__file__).resolve().parent
REPO = LAB.parent
TARGET = REPO / "target" / "lab"
BIN = TARGET / "bin"
STATE_DIR = Path("/run/ralab")
STATE = STATE_DIR / "pids"
LOCK = Path("/run/ralab.lock")
BRIDGE = "ralab0"
NET = "10.213.0"
BRIDGE_IP = NET + ".1"
LOAD_NS = "ralab-load"
RUNTIMES = ("python", "python-grpc", "go", "node", "rust", "haproxy")
HAPROXY_SOCKET = STATE_DIR / "haproxy.sock"
HAPROXY_MAP = STATE_DIR / "haproxy.map"
MODES = ("none", "observe", "shim")


class LabError(Exception):
    pass


def log(msg):
    print("[lab] " + msg, file=sys.stderr, flush=True)


def sh(*args, check=True, quiet=False):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise LabError("%s: %s" % (" ".join(args), r.stderr.strip()))
    return r


# ---- scenario -----------------------------------------------------------------------------------

def load_scenario(path, overrides):
    with open(path, "rb") as f:
        sc = tomllib.load(f)
    sc.setdefault("name", Path(path).stem)
    sc.setdefault("rate", 10.0)
    sc.setdefault("duration_s", 30.0)
    sc.setdefault("root_timeout_ms", 15000)
    sc.setdefault("settle_s", 2.0)
    sc.setdefault("modes", ["none"])
    d = sc.setdefault("defaults", {})
    d.setdefault("retries", 1)
    d.setdefault("timeout_ms", 2000)
    d.setdefault("backoff_ms", 5)
    sc.setdefault("edges", {})
    for k, v in overrides.items():
        if v is None:
            continue
        if k == "retries":
            d["retries"] = v
            for e in sc["edges"].values():
                e.pop("retries", None)
        else:
            sc[k] = v
    nodes = sc.get("nodes") or []
    if not nodes:
        raise LabError("scenario has no [[nodes]]")
    names = [n["name"] for n in nodes]
    if len(set(names)) != len(names):
        raise LabError("duplicate node names")
    by = {n["name"]: n for n in nodes}
    for i, n in enumerate(nodes):
        n["index"] = i + 1
        n.setdefault("calls", [])
        if n.get("runtime") not in RUNTIMES:
            raise LabError("node %s: runtime must be one of %s" % (n["name"], RUNTIMES))
        if len(n["name"]) > 8 or not n["name"].isalnum():
            raise LabError("node %s: names are alphanumeric, at most 8 chars" % n["name"])
        if n["runtime"] == "haproxy" and len(n["calls"]) != 1:
            raise LabError("haproxy node %s must call exactly one node" % n["name"])
        for c in n["calls"]:
            if c not in by:
                raise LabError("node %s calls unknown node %s" % (n["name"], c))
            if by[c]["runtime"] == "python-grpc" and n["runtime"] not in ("python", "python-grpc"):
                raise LabError("gRPC callee %s needs a python caller, %s is %s"
                               % (c, n["name"], n["runtime"]))
    f = sc.get("fault")
    if f:
        if f.get("node") not in by:
            raise LabError("fault at unknown node %r" % f.get("node"))
        if f.setdefault("kind", "error") not in ("error", "latency", "refused"):
            raise LabError("fault kind must be error, latency or refused")
        f.setdefault("rate", 1.0)
        f.setdefault("start_s", 0.0)
        f.setdefault("end_s", sc["duration_s"])
        f.setdefault("latency_ms", 3000)
    # depth = shortest distance from the root (the first node).
    depth = {nodes[0]["name"]: 0}
    q = deque([nodes[0]["name"]])
    while q:
        x = q.popleft()
        for c in by[x]["calls"]:
            if c not in depth:
                depth[c] = depth[x] + 1
                q.append(c)
    for n in nodes:
        n["depth"] = depth.get(n["name"])
    return sc


def edge_policy(sc, caller, callee):
    p = dict(sc["defaults"])
    p.update(sc["edges"].get("%s->%s" % (caller, callee), {}))
    return p


def node_ip(n):
    return "%s.%d" % (NET, 10 + n["index"])


PORT_BASE = 18300


def node_port(n):
    # Unique ports let an observer tell services apart by port as well as by process name, and
    # an unusual range keeps the shim's port-based steering off everyone else's traffic.
    return PORT_BASE + n["index"]


def comm(n):
    return "ra-" + n["name"]


# ---- build --------------------------------------------------------------------------------------

def real(cmd):
    p = shutil.which(cmd)
    if not p:
        raise LabError("%s not found" % cmd)
    if cmd.startswith("python"):
        # pyenv shims are shell scripts: resolve to the interpreter itself.
        r = subprocess.run([p, "-c", "import sys; print(sys.executable)"], capture_output=True,
                           text=True)
        p = r.stdout.strip() or p
    return os.path.realpath(p)


def build(runtimes):
    TARGET.mkdir(parents=True, exist_ok=True)
    BIN.mkdir(parents=True, exist_ok=True)
    if "go" in runtimes:
        out = TARGET / "go-svc"
        src = LAB / "services" / "go" / "main.go"
        if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
            log("building the Go service")
            env = dict(os.environ, GOFLAGS="-mod=mod", GOCACHE=str(TARGET / "gocache"),
                       GOPATH=str(TARGET / "gopath"), CGO_ENABLED="0")
            r = subprocess.run(["go", "build", "-o", str(out), "."], cwd=src.parent, env=env,
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise LabError("go build: " + r.stderr)
    if "rust" in runtimes:
        log("building the Rust service")
        r = subprocess.run(["cargo", "build", "-q", "-p", "lab-rust-svc"], cwd=REPO,
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise LabError("cargo build -p lab-rust-svc: " + r.stderr[-4000:])


def haproxy_config(sc, n, mode_dir):
    """An HAProxy hop with L7 retries (`retries`, `retry-on`) that the agent can switch off per
    backend at runtime through the map (deploy/haproxy/retry-suppress.cfg). Its ground truth is
    its own access log, one JSON line per request, on stdout."""
    by = {m["name"]: m for m in sc["nodes"]}
    callee = by[n["calls"][0]]
    p = edge_policy(sc, n["name"], callee["name"])
    # The backend is named as the agent names the callee (comm:port), the map's key.
    backend = "%s:%d" % (comm(callee), node_port(callee))
    # %Ts is the connection's accept date (stale on keep-alive): log the end time instead.
    fmt = ('{"end_ms":%%[date(0,ms)],"d_ms":%%Ta,"svc":"%s","status":%%ST,"retries":%%rc,'
           '"callee":"%s"}' % (n["name"], callee["name"]))
    cfg = "\n".join([
        "global",
        "    stats socket %s mode 600 level admin" % HAPROXY_SOCKET,
        "defaults",
        "    mode http",
        "    timeout connect %dms" % int(p["timeout_ms"]),
        "    timeout client 30s",
        "    timeout server %dms" % int(p["timeout_ms"]),
        "    log stdout format raw local0",
        "frontend fe",
        "    bind %s:%d" % (node_ip(n), node_port(n)),
        "    log global",
        "    log-format '%s'" % fmt,
        "    default_backend %s" % backend,
        "backend %s" % backend,
        "    retries %d" % int(p["retries"]),
        "    retry-on all-retryable-errors",
        "    http-request set-var(txn.ra_until) be_name,map_str_int(%s,0)" % HAPROXY_MAP,
        "    http-request set-var(txn.ra_now) date",
        "    http-request set-var(txn.ra_left) var(txn.ra_until),sub(txn.ra_now)",
        "    http-request disable-l7-retry if { var(txn.ra_left) -m int gt 0 }",
        "    server s1 %s:%d" % (node_ip(callee), node_port(callee)),
        "",
    ])
    path = mode_dir / ("%s.haproxy.cfg" % n["name"])
    path.write_text(cfg)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    HAPROXY_MAP.touch()
    return path


def command(n, sc=None, mode_dir=None):
    """argv for a node; argv[0] is a per-service symlink so each process's comm names it."""
    rt = n["runtime"]
    if rt == "haproxy":
        cfg = haproxy_config(sc, n, mode_dir)
        return [str(named_link(comm(n), real("haproxy"))), "-db", "-f", str(cfg)]
    if rt in ("python", "python-grpc"):
        target, args = real("python3"), [str(LAB / "services" / "python" / "svc.py")]
    elif rt == "go":
        target, args = str(TARGET / "go-svc"), []
    elif rt == "node":
        target, args = real("node"), [str(LAB / "services" / "node" / "svc.js")]
    else:
        target, args = str(REPO / "target" / "debug" / "lab-rust-svc"), []
    return [str(named_link(comm(n), target))] + args


def named_link(name, target):
    link = BIN / name
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)
    return link


# ---- topology and processes ---------------------------------------------------------------------

def record_pid(pid):
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE, "a") as f:
        f.write("%d\n" % pid)


def lab_namespaces():
    r = sh("ip", "-j", "netns", "list", check=False)
    try:
        return [x["name"] for x in json.loads(r.stdout or "[]") if x["name"].startswith("ralab-")]
    except (ValueError, KeyError):
        return []


def lab_links():
    r = sh("ip", "-j", "link", "show", check=False)
    try:
        return [x["ifname"] for x in json.loads(r.stdout or "[]") if x["ifname"].startswith("ralab")]
    except (ValueError, KeyError):
        return []


def mentions_lab(line):
    low = line.lower()
    return BRIDGE in low or NET + "." in low or "ralab" in low


def lab_rules():
    """iptables rules and chains in the root namespace that belong to the lab: they mention its
    bridge, subnet, or a RALAB* chain (the shim runs with --shim-chain RALAB_SHIM in the lab)."""
    out = []
    for tool in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle", "raw"):
            r = sh(tool, "-w", "-t", table, "-S", check=False)
            for line in r.stdout.splitlines():
                if line.startswith(("-A", "-N")) and mentions_lab(line):
                    out.append((tool, table, line))
    return out


def is_lab_process(pid):
    """Guard against pid reuse: a recorded pid is ours only if it still runs a lab program."""
    try:
        cmd = Path("/proc/%d/cmdline" % pid).read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return any(k in cmd for k in (str(BIN), "loadgen.py", "netns exec ralab-"))


def lab_pids():
    pids = set()
    for ns in lab_namespaces():
        r = sh("ip", "netns", "pids", ns, check=False)
        pids.update(int(p) for p in r.stdout.split() if p.isdigit())
    try:
        for line in STATE.read_text().split():
            if line.isdigit() and is_lab_process(int(line)):
                pids.add(int(line))
    except OSError:
        pass
    return sorted(pids)


def leftovers():
    return {"namespaces": lab_namespaces(), "links": lab_links(),
            "rules": [" ".join(r) for r in lab_rules()], "pids": lab_pids()}


def kill_pids(pids):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for p in pids:
            try:
                os.kill(p, sig)
                alive.append(p)
            except ProcessLookupError:
                pass
        if not alive:
            return
        deadline = time.time() + 3
        while time.time() < deadline and any(Path("/proc/%d" % p).exists() for p in alive):
            time.sleep(0.05)
        pids = [p for p in alive if Path("/proc/%d" % p).exists()]


def cleanup():
    """Idempotent: kill lab processes (by the pids the lab recorded or found in its namespaces),
    then remove namespaces, links and root-namespace rules that belong to the lab."""
    kill_pids(lab_pids())
    for ns in lab_namespaces():
        sh("ip", "netns", "del", ns, check=False)
    for link in lab_links():
        sh("ip", "link", "del", link, check=False)
    rules = lab_rules()
    for tool, table, line in rules:
        if line.startswith("-A"):
            sh(tool, "-w", "-t", table, *("-D" + line[2:]).split(), check=False)
    for tool, table, line in rules:
        if line.startswith("-N"):
            chain = line.split()[1]
            sh(tool, "-w", "-t", table, "-F", chain, check=False)
            sh(tool, "-w", "-t", table, "-X", chain, check=False)
    try:
        STATE.unlink()
    except OSError:
        pass


def setup_topology(sc):
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", BRIDGE_IP + "/24", "dev", BRIDGE)
    # Bridged pod-to-pod traffic traverses the root namespace's iptables (the shim steers it).
    sh("ip", "link", "set", BRIDGE, "type", "bridge", "nf_call_iptables", "1", check=False)
    sh("ip", "link", "set", BRIDGE, "up")
    pods = [(("ralab-" + n["name"]), "ralab%d" % n["index"], node_ip(n)) for n in sc["nodes"]]
    pods.append((LOAD_NS, "ralab99", NET + ".200"))
    for ns, veth, ip in pods:
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth + "h", "type", "veth", "peer", "name", veth + "n")
        sh("ip", "link", "set", veth + "n", "netns", ns)
        sh("ip", "link", "set", veth + "h", "master", BRIDGE)
        sh("ip", "link", "set", veth + "h", "up")
        sh("ip", "-n", ns, "addr", "add", ip + "/24", "dev", veth + "n")
        sh("ip", "-n", ns, "link", "set", veth + "n", "name", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        # No default route: nothing in a pod can reach beyond the lab subnet.


def spawn(argv, ns=None, env=None, out=None):
    full = (["ip", "netns", "exec", ns] if ns else []) + argv
    fo = open(out, "w") if out else subprocess.DEVNULL
    # ip netns exec execs the command, so the pid is the service's own.
    p = subprocess.Popen(full, env=env, stdout=fo, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    record_pid(p.pid)
    return p


def wait_port(ip, port, deadline):
    while time.time() < deadline:
        try:
            with socket.create_connection((ip, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


# ---- agent --------------------------------------------------------------------------------------

def agent_binary(args):
    """A private copy of the agent: the shared target/ is rebuilt by others while the lab runs."""
    p = Path(args.agent) if args.agent else REPO / "target" / "debug" / "retry-agent"
    if not p.exists():
        return None
    copy = BIN / "retry-agent"
    if (not copy.exists() or copy.stat().st_mtime < p.stat().st_mtime) and full_agent(p):
        BIN.mkdir(parents=True, exist_ok=True)
        tmp = BIN / "retry-agent.tmp"
        shutil.copy2(p, tmp)
        tmp.replace(copy)
    return copy if copy.exists() and full_agent(copy) else None


def full_agent(p):
    """Builds of partial trees show up in target/ now and then: a `run` without its flags, or
    an agent built while the eBPF object was missing. Take only an agent with both."""
    r = subprocess.run([str(p), "run", "--help"], capture_output=True, text=True)
    if r.returncode != 0 or "--api-addr" not in r.stdout:
        return False
    data = Path(p).read_bytes()
    i = data.find(b"\x7fELF", 1)
    while i != -1:
        if data[i + 18:i + 20] == b"\xf7\x00":  # e_machine EM_BPF: the embedded object
            return True
        i = data.find(b"\x7fELF", i + 1)
    return False


def expand(argv, sc, mode_dir):
    subst = {"api": sc.get("agent", {}).get("api", "127.0.0.1:19464"), "out": str(mode_dir),
             "bridge": BRIDGE, "net": NET + ".0/24", "state": str(STATE_DIR),
             "ports": ",".join(str(node_port(n)) for n in sc["nodes"])}
    for n in sc["nodes"]:
        subst["addr_" + n["name"]] = "%s:%d" % (node_ip(n), node_port(n))
    return [a.format(**subst) for a in argv]


def start_agent(sc, mode, args, mode_dir):
    """Start the processes the scenario lists for this agent mode; returns (procs, skip reason)."""
    binary = agent_binary(args)
    if binary is None:
        return [], ("no complete agent build (target/debug/retry-agent with its eBPF object: "
                    "cargo xtask build-ebpf && cargo build -p retry-agent)")
    spec = sc.get("agent", {}).get(mode)
    if not spec:
        return [], "scenario has no [agent.%s] section" % mode
    procs = []
    for i, argv in enumerate(spec.get("procs", [])):
        p = spawn([str(binary)] + expand(argv, sc, mode_dir), out=mode_dir / ("agent-%d.log" % i),
                  env=dict(os.environ, RETRY_AGENT_LOG=spec.get("log", "info")))
        procs.append(p)
    # An agent that exits at once (not implemented yet, bad flags) means the mode cannot run.
    time.sleep(spec.get("startup_s", 2.0))
    for i, p in enumerate(procs):
        if p.poll() is not None:
            tail = (mode_dir / ("agent-%d.log" % i)).read_text()[-500:]
            stop(procs)
            return [], "agent process %d exited %s: %s" % (i, p.returncode, tail.strip())
    return procs, None


def stop(procs):
    kill_pids([p.pid for p in procs if p.poll() is None])
    for p in procs:
        try:
            p.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass


def fetch_json(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())
    except (OSError, ValueError) as e:
        log("GET %s: %s" % (url, e))
        return None


def items(doc, key):
    if isinstance(doc, list):
        return doc
    if isinstance(doc, dict):
        for k in (key, "items", "data"):
            if isinstance(doc.get(k), list):
                return doc[k]
    return []


# ---- one mode -----------------------------------------------------------------------------------

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
        for n in nodes:
            cfg = {
                "name": n["name"], "runtime": n["runtime"],
                "listen": "%s:%d" % (node_ip(n), node_port(n)),
                "proto": "grpc" if n["runtime"] == "python-grpc" else "http",
                "log": str(mode_dir / (n["name"] + ".jsonl")),
                "epoch_file": str(epoch_file),
                "work_ms": n.get("work_ms", sc.get("work_ms", 0)),
                "downstreams": [],
                "fault": None,
            }
            for c in n["calls"]:
                cn = by[c]
                p = edge_policy(sc, n["name"], c)
                cfg["downstreams"].append({
                    "name": c, "url": "http://%s:%d/work" % (node_ip(cn), node_port(cn)),
                    "proto": "grpc" if cn["runtime"] == "python-grpc" else "http",
                    "retries": int(p["retries"]), "timeout_ms": int(p["timeout_ms"]),
                    "backoff_ms": int(p.get("backoff_ms", 0)), "budget": p.get("budget"),
                })
            if f and f["node"] == n["name"] and f["kind"] in ("error", "latency"):
                cfg["fault"] = {"kind": f["kind"], "rate": f["rate"], "start": f["start_s"],
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
        verdicts, decisions = [], []
        if mode != "none":
            api = sc.get("agent", {}).get("api", "127.0.0.1:19464")
            verdicts = items(fetch_json("http://%s/v1/verdicts" % api), "verdicts")
            # The decision log has every decision; the API only the live ones.
            decisions = decisions_of(mode_dir)
            if not decisions:
                decisions = items(fetch_json("http://%s/v1/decisions" % api), "decisions")
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
    return analyse_mode(sc, mode, t0, mode_dir, verdicts, decisions)


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


# ---- analysis -----------------------------------------------------------------------------------

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


def service_of(sid, sc):
    """Map an agent ServiceId to a lab node: by process name, port, address or plain name."""
    s = str(sid)
    for n in sc["nodes"]:
        if s == comm(n) or s.startswith(comm(n) + ":") or s == n["name"]:
            return n
    for n in sc["nodes"]:
        if s.endswith(":%d" % node_port(n)) or node_ip(n) + ":" in s or ("=" + n["name"]) in s:
            return n
    return None


def to_epoch(ts_ns):
    # Kernel timestamps are CLOCK_MONOTONIC (bpf_ktime_get_ns); wall-clock ones are > 1e18.
    if ts_ns is None:
        return None
    ts = ts_ns / 1e9
    if ts_ns < 1e18:
        ts += time.time() - time.monotonic()
    return ts


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
    if mode != "none":
        res["agent"] = score_agent(sc, logs, verdicts, decisions, fs, t0, mode_dir)
    return res


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


def score_agent(sc, logs, verdicts, decisions, fs, t0, logs_dir):
    """Per runtime: precision = verdicts whose claim matches the ground truth / verdicts that
    took a side; recall = failures served that got a right verdict / failures served (right
    verdicts are capped per node and cause, so duplicate verdicts cannot push it past 1)."""
    by_rt = defaultdict(lambda: {"verdicts": 0, "correct": 0, "missing": 0, "unmatched": 0,
                                 "failures": 0})
    fail_idx = {}
    for n in sc["nodes"]:
        fails = [r for r in logs[n["name"]] if r.get("cause") in ("own", "downstream")]
        by_rt[n["runtime"]]["failures"] += len(fails)
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
        s = by_rt[n["runtime"]]
        s["verdicts"] += 1
        claim = v.get("claim")
        if claim not in ("claimed", "unclaimed"):
            s["missing"] += 1
            continue
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
        if (claim == "claimed") == (truth == "own"):
            s["correct"] += 1
            right[(n["name"], truth)] += 1
    recalled = defaultdict(int)
    rt_of = {n["name"]: n["runtime"] for n in sc["nodes"]}
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
        caller = service_of(edge.get("caller"), sc)
        callee = service_of(edge.get("callee"), sc)
        if callee is None and not any(a.startswith(NET + ".") for a in addrs):
            continue  # someone else's traffic on this node
        ts = to_epoch(d.get("issued_at_ns"))
        name = "%s->%s" % (caller["name"] if caller else edge.get("caller"),
                           callee["name"] if callee else edge.get("callee"))
        per_edge.setdefault(name, []).append({
            "action": d.get("action"), "reason": d.get("reason"),
            "at_s": round(ts - t0, 3) if ts is not None else None})
        if d.get("action") == "suppress_retries" and ts is not None and ts >= fs - 1 and (
                first is None or ts < first):
            first = ts
    return {"verdicts": len(verdicts), "decisions": len(decisions), "per_runtime": per_rt,
            "health": agent_health(logs_dir),
            "unknown_services": sorted(unknown_services)[:20], "decisions_per_edge": per_edge,
            "first_suppression_s": round(first - fs, 3) if first else None,
            "first_suppression_at": round(first - t0, 3) if first else None}


# ---- expected figures (the design's model) ------------------------------------------------------

def expected_x(sc):
    """Requests per node as multiples of the root rate during a hard fault (error, rate 1) in the
    design's model: a failing callee gets 1+R attempts per call (1+min(R, budget) under a
    budget), a caller stops at its first failed downstream."""
    f = sc.get("fault")
    if not f or f["kind"] != "error" or f["rate"] < 1.0:
        return None
    by = {n["name"]: n for n in sc["nodes"]}
    fails = {}

    def failing(x, seen=()):
        if x in fails:
            return fails[x]
        r = x == f["node"] or any(failing(c, seen + (x,)) for c in by[x]["calls"]
                                   if c not in seen)
        fails[x] = r
        return r

    arrivals = defaultdict(float)
    arrivals[sc["nodes"][0]["name"]] = 1.0
    order = sorted(sc["nodes"], key=lambda n: n["depth"] if n["depth"] is not None else 99)
    for n in order:
        for c in n["calls"]:
            p = edge_policy(sc, n["name"], c)
            if failing(c):
                r = float(p["retries"])
                if p.get("budget") is not None:
                    r = min(r, float(p["budget"]))
                arrivals[c] += arrivals[n["name"]] * (1 + r)
                break
            arrivals[c] += arrivals[n["name"]]
    return {k: round(v, 3) for k, v in arrivals.items()}


# ---- reports ------------------------------------------------------------------------------------

def markdown(sc, result):
    modes = [m for m in result["modes"] if not m.get("skipped")]
    exp = result.get("expected_x")
    f = sc.get("fault") or {}
    lines = ["# %s" % sc["name"], "",
             "Ƞ = %s req/s at the root, R = %s retries per hop, fault: %s at %s (rate %s) from %ss to %ss."
             % (sc["rate"], sc["defaults"]["retries"], f.get("kind"), f.get("node"), f.get("rate"),
                f.get("start_s"), f.get("end_s")), "",
             "Requests served per node in the fault window, as multiples of Ƞ:", ""]
    head = "| node | runtime | depth |" + (" model |" if exp else "") + "".join(
        " %s |" % m["mode"] for m in modes)
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for n in sc["nodes"]:
        row = "| %s | %s | %s |" % (n["name"].upper(), n["runtime"], n["depth"])
        if exp:
            row += " %.2fȠ |" % exp.get(n["name"], 0.0)
        for m in modes:
            row += " %.2fȠ |" % m["nodes"][n["name"]]["served_x"]
        lines.append(row)
    lines.append("")
    lines.append("| root | " + " | ".join(m["mode"] for m in modes) + " |")
    lines.append("|---|" + "---|" * len(modes))
    lines.append("| availability (whole run) | " + " | ".join(
        fmt_pct(m["root"]["availability"]) for m in modes) + " |")
    lines.append("| availability (fault window) | " + " | ".join(
        fmt_pct(m["root"]["availability_fault_window"]) for m in modes) + " |")
    lines.append("| p99 latency (s) | " + " | ".join(
        str(m["root"]["latency_p99_s"]) for m in modes) + " |")
    lines.append("| fault onset → first suppression (s) | " + " | ".join(
        str(m.get("agent", {}).get("first_suppression_s", "–")) for m in modes) + " |")
    agent_modes = [m for m in modes if m.get("agent")]
    if agent_modes:
        lines += ["", "Verdicts against ground truth:", "",
                  "| mode | runtime | verdicts | precision | recall | missing |", "|---|---|---|---|---|---|"]
        for m in agent_modes:
            for rt, s in sorted(m["agent"]["per_runtime"].items()):
                lines.append("| %s | %s | %d | %s | %s | %d |" % (
                    m["mode"], rt, s["verdicts"], fmt_pct(s["precision"]), fmt_pct(s["recall"]),
                    s["missing"]))
    skipped = [m for m in result["modes"] if m.get("skipped")]
    if skipped:
        lines += [""] + ["Mode %s skipped: %s" % (m["mode"], m["skipped"]) for m in skipped]
    return "\n".join(lines) + "\n"


def fmt_pct(x):
    return "–" if x is None else "%.2f%%" % (100 * x)


COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf"]


def svg(sc, result):
    modes = [m for m in result["modes"] if not m.get("skipped")]
    W, H, L, T, B = 900, 260, 60, 30, 30
    total_h = H * max(1, len(modes)) + 40
    ymax = max([max(v) for m in modes for v in m["timeline"].values() if v] + [1])
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
           'font-size="11">' % (W, total_h), '<rect width="100%" height="100%" fill="white"/>']
    for i, m in enumerate(modes):
        oy = 20 + i * H
        pw, ph = W - L - 140, H - T - B
        n_s = max(len(v) for v in m["timeline"].values())

        def X(t):
            return L + pw * t / max(1, n_s)

        def Y(v):
            return oy + T + ph - ph * v / ymax

        out.append('<text x="%d" y="%d" font-size="13">%s — mode: %s (requests/s per node)</text>'
                   % (L, oy + 15, sc["name"], m["mode"]))
        if m.get("fault_start") is not None:
            out.append('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#fdd" />' % (
                X(m["fault_start"]), oy + T, X(m["fault_end"]) - X(m["fault_start"]), ph))
        d = m.get("agent", {}).get("first_suppression_at")
        if d is not None:
            out.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="black" '
                       'stroke-dasharray="4,3"/><text x="%.1f" y="%d">first suppression</text>'
                       % (X(d), X(d), oy + T, oy + T + ph, X(d) + 3, oy + T + 10))
        out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="black"/>' % (L, L, oy + T, oy + T + ph))
        out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="black"/>' % (
            L, L + pw, oy + T + ph, oy + T + ph))
        for k in range(5):
            v = ymax * k / 4
            out.append('<text x="%d" y="%.1f" text-anchor="end">%.0f</text>' % (L - 4, Y(v) + 4, v))
        for s in range(0, n_s, max(1, n_s // 10)):
            out.append('<text x="%.1f" y="%d" text-anchor="middle">%ds</text>' % (
                X(s), oy + T + ph + 14, s))
        for j, n in enumerate(sc["nodes"]):
            v = m["timeline"].get(n["name"], [])
            pts = " ".join("%.1f,%.1f" % (X(s + 0.5), Y(c)) for s, c in enumerate(v))
            col = COLORS[j % len(COLORS)]
            out.append('<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>' % (col, pts))
            out.append('<text x="%d" y="%d" fill="%s">%s (%s, d=%s)</text>' % (
                L + pw + 10, oy + T + 14 * j + 10, col, n["name"].upper(), n["runtime"], n["depth"]))
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ---- entry points -------------------------------------------------------------------------------

def cmd_run(args):
    overrides = {"retries": args.retries, "rate": args.rate, "duration_s": args.duration}
    sc = load_scenario(args.scenario, overrides)
    modes = args.modes.split(",") if args.modes else sc["modes"]
    for m in modes:
        if m not in MODES:
            raise LabError("unknown mode %s (one of %s)" % (m, ", ".join(MODES)))
    out = Path(args.out) if args.out else REPO / "lab-out" / (
        "%s-%s" % (sc["name"], time.strftime("%Y%m%dT%H%M%S")))
    out.mkdir(parents=True, exist_ok=True)
    build({n["runtime"] for n in sc["nodes"]})
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    agent = REPO / "target" / "debug" / "retry-agent"
    result = {"git_head": head,
              "agent_built": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(agent.stat().st_mtime))
              if agent.exists() else None,
              "scenario": sc["name"], "rate": sc["rate"], "retries": sc["defaults"]["retries"],
              "fault": sc.get("fault"), "expected_x": expected_x(sc), "modes": [],
              "nodes": [{k: n[k] for k in ("name", "runtime", "depth", "calls")} for n in sc["nodes"]]}
    for m in modes:
        log("mode %s: %s, Ƞ=%s, %ss" % (m, sc["name"], sc["rate"], sc["duration_s"]))
        result["modes"].append(run_mode(sc, m, args, out))
    return write_reports(sc, result, out)


def decisions_of(mode_dir):
    return [r["decision"] for r in read_jsonl(mode_dir / "decisions.jsonl")
            if r.get("kind") == "decision" and isinstance(r.get("decision"), dict)]


def cmd_analyse(args):
    """Recompute the figures of an earlier run from its logs (no namespaces, no root needed)."""
    out = Path(args.out)
    old = json.loads((out / "result.json").read_text())
    overrides = {"retries": old.get("retries"), "rate": old.get("rate"),
                 "duration_s": args.duration}
    sc = load_scenario(args.scenario, overrides)
    result = dict(old, modes=[], expected_x=expected_x(sc))
    for m in old["modes"]:
        if m.get("skipped"):
            result["modes"].append(m)
            continue
        mode_dir = out / m["mode"]
        verdicts = []
        try:
            verdicts = json.loads((mode_dir / "verdicts.json").read_text())
        except (OSError, ValueError):
            pass
        result["modes"].append(analyse_mode(sc, m["mode"], m["t0"], mode_dir, verdicts,
                                            decisions_of(mode_dir)))
    return write_reports(sc, result, out)


def write_reports(sc, result, out):
    (out / "result.json").write_text(json.dumps(result, indent=1))
    (out / "table.md").write_text(markdown(sc, result))
    (out / "plot.svg").write_text(svg(sc, result))
    log("wrote %s/{result.json,table.md,plot.svg}" % out)
    print(markdown(sc, result))
    return 0


def on_signal(signum, _frame):
    raise KeyboardInterrupt("signal %d" % signum)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("scenario")
    r.add_argument("--modes", help="comma list of none,observe,shim (default: the scenario's)")
    r.add_argument("--retries", type=int, help="retries per hop R (all edges)")
    r.add_argument("--rate", type=float, help="Ƞ, requests/s at the root")
    r.add_argument("--duration", type=float, help="seconds of load per mode")
    r.add_argument("--out", help="output directory (default lab-out/<scenario>-<time>)")
    r.add_argument("--agent", help="retry-agent binary (default target/debug/retry-agent)")
    a = sub.add_parser("analyse", help="recompute the figures of an earlier run from its logs")
    a.add_argument("scenario")
    a.add_argument("out")
    a.add_argument("--duration", type=float, help="the run's --duration, if it was given")
    sub.add_parser("cleanup")
    sub.add_parser("leftovers")
    args = ap.parse_args()
    if args.cmd == "analyse":
        try:
            return cmd_analyse(args)
        except (LabError, OSError, ValueError, KeyError) as e:
            print("lab: %s" % e, file=sys.stderr)
            return 1
    if os.geteuid() != 0:
        print("lab: needs root (network namespaces)", file=sys.stderr)
        return 77
    if args.cmd == "leftovers":
        lo = leftovers()
        print(json.dumps(lo))
        return 1 if any(lo.values()) else 0
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    # One lab at a time on this machine: the names (ralab0, ralab-*) are fixed.
    lock = open(LOCK, "w")
    # A caller that holds the lock itself (the tests, across several runs) says so.
    if os.environ.get("RALAB_LOCK_HELD") != "1":
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
        except KeyboardInterrupt:
            print("lab: interrupted while waiting for another lab run", file=sys.stderr)
            return 130
    try:
        if args.cmd == "cleanup":
            cleanup()
            lo = leftovers()
            print(json.dumps(lo))
            return 1 if any(lo.values()) else 0
        return cmd_run(args)
    except LabError as e:
        print("lab: %s" % e, file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print("lab: interrupted (%s); cleaning up" % e, file=sys.stderr)
        return 130
    finally:
        cleanup()


if __name__ == "__main__":
    sys.exit(main())
