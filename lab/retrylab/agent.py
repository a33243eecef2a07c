"""The agent under test: its binary, its processes per mode, and its API."""
import http.client
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from .common import BIN, BRIDGE, NET, REPO, STATE_DIR, log
from .scenario import envoy_admin, node_ip, node_port
from .fleet import kill_pids, spawn


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
             "ns_files": {h: ",".join("/run/netns/ralab-" + n["name"] for n in sc["nodes"]
                                      if n.get("host") == h) for h in sc.get("hosts", [])},
             # A host's shim steers its services' ports and those they call on other hosts
             # (the caller's side of a cross-host edge is where its retries are stopped).
             "host_ports": {h: ",".join(sorted({str(node_port(n)) for n in sc["nodes"] if n.get("host") == h}
                                               | {str(node_port(m)) for n in sc["nodes"] if n.get("host") == h
                                                  for m in sc["nodes"] if m["name"] in n["calls"]}))
                            for h in sc.get("hosts", [])},
             # {envoy_admin[a]}: node a's Envoy sidecar's admin API (the Envoy actuator's target).
             "envoy_admin": {n["name"]: envoy_admin(n) for n in sc["nodes"] if n.get("sidecar")},
             "api_socket": str(API_SOCKET),
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
                    "`cargo xtask lab` builds it, or pass --agent)")
    spec = sc.get("agent", {}).get(mode)
    if not spec:
        return [], "scenario has no [agent.%s] section" % mode
    procs = []
    for i, argv in enumerate(spec.get("procs", [])):
        # "@host" first: run inside that host's namespace (its shim steers its iptables).
        ns = None
        if argv and argv[0].startswith("@"):
            ns, argv = "ralab-" + argv[0][1:], argv[1:]
        p = spawn([str(binary)] + expand(argv, sc, mode_dir), ns=ns, out=mode_dir / ("agent-%d.log" % i),
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


# The agent serves /v1/* only on its private Unix socket (--api-socket {api_socket}).
API_SOCKET = STATE_DIR / "api.sock"


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        import socket
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(str(self._path))


def fetch_json(path, socket_path=None):
    """GET `path` (e.g. /v1/verdicts) from the agent's private API socket."""
    try:
        conn = _UnixHTTPConnection(socket_path or API_SOCKET, timeout=5)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            if r.status != 200:
                raise OSError("HTTP %d" % r.status)
            return json.loads(r.read())
        finally:
            conn.close()
    except (OSError, ValueError, http.client.HTTPException) as e:
        log("GET %s: %s" % (path, e))
        return None


def items(doc, key):
    if isinstance(doc, list):
        return doc
    if isinstance(doc, dict):
        for k in (key, "items", "data"):
            if isinstance(doc.get(k), list):
                return doc[k]
    return []
