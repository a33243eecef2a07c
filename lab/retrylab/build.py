"""Building the fleet's programs and the command line of each node."""
import os
import shutil
import subprocess

from .common import BIN, HAPROXY_MAP, HAPROXY_SOCKET, LAB, LabError, REPO, STATE_DIR, TARGET, log
from .scenario import comm, edge_policy, node_ip, node_port


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
