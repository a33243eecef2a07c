"""The lab's commands (`run`, `analyse`, `cleanup`, `leftovers`) and their argument parsing."""
import argparse
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import retrylab

from .common import LOCK, LabError, MODES, REPO, log
from .scenario import load_scenario
from .model import expected_x
from .build import build
from .fleet import cleanup, leftovers
from .modes import run_mode
from .analysis import analyse_mode, decisions_of
from .report import markdown, svg


def cmd_run(args):
    overrides = {"retries": args.retries, "rate": args.rate, "duration_s": args.duration,
                 "work_ms": args.work_ms}
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
              "work_ms": sc.get("work_ms"),
              "fault": sc.get("fault"), "expected_x": expected_x(sc), "modes": [],
              "nodes": [{k: n[k] for k in ("name", "runtime", "depth", "calls")} for n in sc["nodes"]]}
    for m in modes:
        log("mode %s: %s, Ƞ=%s, %ss" % (m, sc["name"], sc["rate"], sc["duration_s"]))
        result["modes"].append(run_mode(sc, m, args, out))
    return write_reports(sc, result, out)


def cmd_analyse(args):
    """Recompute the figures of an earlier run from its logs (no namespaces, no root needed)."""
    out = Path(args.out)
    old = json.loads((out / "result.json").read_text())
    overrides = {"retries": old.get("retries"), "rate": old.get("rate"),
                 "duration_s": args.duration, "work_ms": old.get("work_ms")}
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
    ap = argparse.ArgumentParser(description=retrylab.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("scenario")
    r.add_argument("--modes", help="comma list of none,observe,shim (default: the scenario's)")
    r.add_argument("--retries", type=int, help="retries per hop R (all edges)")
    r.add_argument("--rate", type=float, help="Ƞ, requests/s at the root")
    r.add_argument("--work-ms", type=int, help="ms every hop holds its request after its calls "
                   "(more requests in flight per service without more load)")
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
