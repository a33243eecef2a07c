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

The package: `common` (paths, names, errors), `scenario` (the TOML file), `model` (expected
figures), `build` (the fleet's programs), `fleet` (namespaces and processes), `agent` (the agent
under test), `modes` (one mode of a run), `analysis` (ground truth and scoring), `report`
(table and plot), `cli` (the commands); `lab/lab.py` is the entry point.
"""
