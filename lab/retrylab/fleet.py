"""Topology and processes: namespaces, the bridge, the lab's processes, and their cleanup."""
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from .common import BIN, BRIDGE, BRIDGE_IP, LOAD_NS, NET, STATE, STATE_DIR, sh
from .scenario import host_ip, host_ns, node_ip


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
    # Hosts: a namespace each with its own bridge (and so its own iptables, where its shim
    # steers), uplinked to the lab bridge like machines to a switch; their pods hang off it.
    hosts = sc.get("hosts") or []
    for j, h in enumerate(hosts):
        ns, up = host_ns(h), "ralabu%d" % j
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", ns, "addr", "add", host_ip(sc, h) + "/24", "dev", "br0")
        sh("ip", "-n", ns, "link", "set", "br0", "type", "bridge", "nf_call_iptables", "1", check=False)
        sh("ip", "-n", ns, "link", "set", "br0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", up + "h", "type", "veth", "peer", "name", up + "n")
        sh("ip", "link", "set", up + "n", "netns", ns)
        sh("ip", "-n", ns, "link", "set", up + "n", "master", "br0")
        sh("ip", "-n", ns, "link", "set", up + "n", "up")
        sh("ip", "link", "set", up + "h", "master", BRIDGE)
        sh("ip", "link", "set", up + "h", "up")
    pods = [(("ralab-" + n["name"]), "ralab%d" % n["index"], node_ip(n), n.get("host"))
            for n in sc["nodes"]]
    pods.append((LOAD_NS, "ralab99", NET + ".200", None))
    for ns, veth, ip, host in pods:
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth + "h", "type", "veth", "peer", "name", veth + "n")
        sh("ip", "link", "set", veth + "n", "netns", ns)
        if host:
            hns = host_ns(host)
            sh("ip", "link", "set", veth + "h", "netns", hns)
            sh("ip", "-n", hns, "link", "set", veth + "h", "master", "br0")
            sh("ip", "-n", hns, "link", "set", veth + "h", "up")
        else:
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
