"""Paths, names and the lab's error type, shared by every part of the lab."""
import subprocess
import sys
from pathlib import Path


# lab/: this package lives in lab/retrylab/.
LAB = Path(__file__).resolve().parent.parent
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
RUNTIMES = ("python", "python-grpc", "go", "go-grpc", "node", "rust", "haproxy")
# The runtimes that serve gRPC (/lab.Hop/Work) instead of HTTP/1.
GRPC_RUNTIMES = ("python-grpc", "go-grpc")
HAPROXY_SOCKET = STATE_DIR / "haproxy.sock"
HAPROXY_MAP = STATE_DIR / "haproxy.map"
# "envoy": the agent actuates the scenario's Envoy sidecars through their admin API, no shim.
MODES = ("none", "observe", "shim", "envoy")
SIDECARS = ("envoy",)


class LabError(Exception):
    pass


def log(msg):
    print("[lab] " + msg, file=sys.stderr, flush=True)


def sh(*args, check=True, quiet=False):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise LabError("%s: %s" % (" ".join(args), r.stderr.strip()))
    return r
