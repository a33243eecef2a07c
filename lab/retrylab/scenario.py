"""Scenarios: the TOML file, its defaults and overrides, checked; where each node lives."""
import tomllib
from collections import deque
from pathlib import Path

from .common import GRPC_RUNTIMES, LabError, NET, RUNTIMES, SIDECARS


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
        if n.get("fanout") and n["runtime"] != "go":
            raise LabError("node %s: fanout (concurrent calls on spawned goroutines) is a Go "
                           "service's; %s calls one downstream after another" % (n["name"], n["runtime"]))
        if n["runtime"] == "haproxy" and len(n["calls"]) != 1:
            raise LabError("haproxy node %s must call exactly one node" % n["name"])
        if n.get("sidecar") is not None and n["sidecar"] not in SIDECARS:
            raise LabError("node %s: sidecar must be one of %s" % (n["name"], SIDECARS))
        if n.get("sidecar") and n["runtime"] == "haproxy":
            raise LabError("node %s: an HAProxy hop takes no sidecar" % n["name"])
        for c in n["calls"]:
            if c not in by:
                raise LabError("node %s calls unknown node %s" % (n["name"], c))
            if n.get("sidecar") and by[c]["runtime"] in GRPC_RUNTIMES:
                raise LabError("node %s: its sidecar forwards HTTP/1, %s is gRPC" % (n["name"], c))
            if by[c]["runtime"] in GRPC_RUNTIMES and n["runtime"] not in ("python", *GRPC_RUNTIMES):
                raise LabError("gRPC callee %s needs a python or gRPC caller, %s is %s"
                               % (c, n["name"], n["runtime"]))
            if n["runtime"] == "go-grpc" and by[c]["runtime"] not in GRPC_RUNTIMES:
                raise LabError("node %s: the gRPC-go service calls gRPC callees only, %s is %s"
                               % (n["name"], c, by[c]["runtime"]))
    # Hosts ("machines"): with any node placed on one, every node must be, and each host gets
    # its own namespace, bridge, agent and shim (fleet.setup_topology).
    placed = [n for n in nodes if n.get("host")]
    if placed:
        if len(placed) != len(nodes):
            raise LabError("with hosts, every node needs a host")
        sc["hosts"] = sorted({n["host"] for n in nodes})
        for h in sc["hosts"]:
            if len(h) > 6 or not h.isalnum():
                raise LabError("host %s: names are alphanumeric, at most 6 chars" % h)
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
        # `also = { b = 0.1 }`: other nodes failing on their own at that rate in the same window,
        # so every hop has both its own failures (claimed) and its callees' (unclaimed).
        also = f.setdefault("also", {})
        for name, rate in also.items():
            if name not in by or name == f["node"]:
                raise LabError("fault.also: %r is not another node" % name)
            if not 0.0 < float(rate) <= 1.0:
                raise LabError("fault.also.%s: a rate in (0, 1]" % name)
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


SIDECAR_PORT_BASE = 18400
ENVOY_ADMIN_PORT = 15000


def sidecar_port(callee):
    """Where a caller with a sidecar sends its calls to `callee`: its own Envoy, on loopback in
    the caller's namespace (one listener per callee, as Istio's outbound listeners)."""
    return SIDECAR_PORT_BASE + callee["index"]


def envoy_admin(n):
    """A sidecar's admin API, on the pod's address (Istio's port) so the agent on the node
    reaches it over the bridge; pods have no default route, so nothing beyond the lab does."""
    return "%s:%d" % (node_ip(n), ENVOY_ADMIN_PORT)


def envoy_cluster(callee):
    """Clusters are named by the mesh, not after the agent's service ids (Istio's form)."""
    return "outbound|%d||%s.lab.svc.cluster.local" % (node_port(callee), callee["name"])


def comm(n):
    return "ra-" + n["name"]


def host_ns(h):
    return "ralab-" + h


def host_ip(sc, h):
    """A host's own address on the lab network (its bridge; what its shim connects from)."""
    return "%s.%d" % (NET, 2 + sc["hosts"].index(h))
