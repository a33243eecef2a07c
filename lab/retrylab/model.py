"""Expected figures: the design's model of retry amplification per node."""
from collections import defaultdict

from .scenario import edge_policy


def expected_x(sc):
    """Requests per node as multiples of the root rate during a hard fault (error, rate 1) in the
    design's model: a failing callee gets 1+R attempts per call (1+min(R, budget) under a
    budget), times 1+E through a caller's Envoy sidecar with E route retries; a caller stops at
    its first failed downstream, unless it fans out (calls them all at once)."""
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
                # A sidecar retries each of the caller's attempts on its own.
                e = float(p.get("envoy_retries", 0)) if n.get("sidecar") == "envoy" else 0.0
                arrivals[c] += arrivals[n["name"]] * (1 + r) * (1 + e)
                if not n.get("fanout"):
                    break
                continue
            arrivals[c] += arrivals[n["name"]]
    return {k: round(v, 3) for k, v in arrivals.items()}
