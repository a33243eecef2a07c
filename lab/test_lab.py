"""Unit tests of the lab's analysis (no root, no namespaces): python3 lab/test_lab.py"""
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from retrylab import analysis, common, model, scenario as scenarios  # noqa: E402


def scenario(text):
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(text)
    return scenarios.load_scenario(f.name, {})


CHAIN7 = """
rate = 10
[defaults]
retries = %d
%s
[[nodes]]
name = "a"
runtime = "python"
calls = ["b"]
[[nodes]]
name = "b"
runtime = "go"
calls = ["c"]
[[nodes]]
name = "c"
runtime = "node"
calls = ["d"]
[[nodes]]
name = "d"
runtime = "python"
calls = ["e"]
[[nodes]]
name = "e"
runtime = "rust"
calls = ["f"]
[[nodes]]
name = "f"
runtime = "go"
calls = ["g"]
[[nodes]]
name = "g"
runtime = "python"
[fault]
node = "d"
"""


class ModelTests(unittest.TestCase):
    def test_chain_without_control_multiplies_by_attempts_per_hop(self):
        sc = scenario(CHAIN7 % (1, ""))
        self.assertEqual([n["depth"] for n in sc["nodes"]], list(range(7)))
        x = model.expected_x(sc)
        self.assertEqual([x[k] for k in "abcdefg"], [1, 2, 4, 8, 8, 8, 8])
        x = model.expected_x(scenario(CHAIN7 % (2, "")))
        self.assertEqual([x[k] for k in "abcdefg"], [1, 3, 9, 27, 27, 27, 27])

    def test_budgets_compound_like_the_design(self):
        x = model.expected_x(scenario(CHAIN7 % (3, "budget = 0.1")))
        self.assertEqual([x[k] for k in "abcdefg"], [1, 1.1, 1.21, 1.331, 1.331, 1.331, 1.331])

    def test_fanout_stops_at_the_first_failing_downstream(self):
        sc = scenario(FANOUT % ("python", "", "c"))
        self.assertEqual(model.expected_x(sc), {"a": 1.0, "b": 1.0, "c": 3.0})

    def test_a_go_fanout_calls_every_downstream_whatever_fails(self):
        sc = scenario(FANOUT % ("go", "fanout = true", "b"))
        self.assertEqual(model.expected_x(sc), {"a": 1.0, "b": 3.0, "c": 1.0, "d": 1.0})
        self.assertEqual(analysis.variant(sc["nodes"][0]), "go+fanout")

    def test_an_envoy_sidecar_multiplies_its_callers_attempts(self):
        sc = scenario(ENVOY3)
        self.assertEqual(model.expected_x(sc), {"a": 1.0, "b": 4.0, "c": 8.0})

    def test_bad_scenarios_are_refused(self):
        with self.assertRaises(common.LabError):
            scenario('[[nodes]]\nname = "a"\nruntime = "go"\nsidecar = "linkerd"\n')
        with self.assertRaises(common.LabError):
            scenario('[[nodes]]\nname = "a"\nruntime = "cobol"\n')
        with self.assertRaises(common.LabError):
            scenario('[[nodes]]\nname = "a"\nruntime = "go"\ncalls = ["x"]\n')
        with self.assertRaises(common.LabError):  # fan-out on goroutines is Go's
            scenario('[[nodes]]\nname = "a"\nruntime = "node"\nfanout = true\n')
        with self.assertRaises(common.LabError):  # the gRPC-go service calls gRPC only
            scenario('[[nodes]]\nname = "a"\nruntime = "go-grpc"\ncalls = ["b"]\n'
                     '[[nodes]]\nname = "b"\nruntime = "go"\n')
        scenario('[[nodes]]\nname = "a"\nruntime = "python"\ncalls = ["b"]\n'
                 '[[nodes]]\nname = "b"\nruntime = "go-grpc"\ncalls = ["c"]\n'
                 '[[nodes]]\nname = "c"\nruntime = "python-grpc"\n')
        with self.assertRaises(common.LabError):  # grpc callees need a Python caller
            scenario('[[nodes]]\nname = "a"\nruntime = "go"\ncalls = ["b"]\n'
                     '[[nodes]]\nname = "b"\nruntime = "python-grpc"\n')


# A calls b, c, d (runtime, fan-out setting); the fault is at the given node.
FANOUT = """
[defaults]
retries = 2
[[nodes]]
name = "a"
runtime = "%s"
%s
calls = ["b", "c", "d"]
[[nodes]]
name = "b"
runtime = "go"
[[nodes]]
name = "c"
runtime = "go"
[[nodes]]
name = "d"
runtime = "go"
[fault]
node = "%s"
"""

ENVOY3 = """
rate = 10
[[nodes]]
name = "a"
runtime = "python"
calls = ["b"]
sidecar = "envoy"
[[nodes]]
name = "b"
runtime = "go"
calls = ["c"]
[[nodes]]
name = "c"
runtime = "python"
[edges."a->b"]
retries = 0
envoy_retries = 3
[fault]
node = "c"
"""


class AnalysisTests(unittest.TestCase):
    def setUp(self):
        self.sc = scenario(CHAIN7 % (1, ""))

    def test_agent_service_ids_map_to_nodes(self):
        self.assertEqual(analysis.service_of("ra-c:18303", self.sc)["name"], "c")
        self.assertEqual(analysis.service_of("ra-c", self.sc)["name"], "c")
        self.assertEqual(analysis.service_of("10.213.0.14:18304", self.sc)["name"], "d")
        self.assertIsNone(analysis.service_of("haproxy:38377", self.sc))
        # A sidecar listens on ports of its own and is not the node it serves.
        self.assertIsNone(analysis.service_of("ra-a-envoy:18402", self.sc))
        self.assertEqual(analysis.end_name("ra-a-envoy:15000", self.sc), "a.envoy")

    def test_in_flight_is_the_time_held_inside_the_window_over_its_length(self):
        # Two requests of 2 s each inside a 4 s window: one at a time on average; a request
        # that straddles the window's start counts only its inside part; a record without a
        # duration holds nothing.
        recs = [{"t": 10.0, "d": 2.0}, {"t": 11.0, "d": 2.0}, {"t": 9.0, "d": 2.0}, {"t": 12.0}]
        self.assertEqual(analysis.in_flight(recs, 10.0, 14.0), 1.25)
        self.assertEqual(analysis.in_flight(recs, 14.0, 14.0), 0.0)

    def test_envoy_sidecar_figures_come_from_its_log_and_stats(self):
        sc = scenario(ENVOY3)
        d = Path(tempfile.mkdtemp())
        (d / "a.envoy.jsonl").write_text(
            '{"t_start_s":"100.5","attempts":"4","callee":"b"}\n[warning] chatter\n'
            '{"t_start_s":"101.0","attempts":2,"callee":"b"}\n'
            '{"t_start_s":"99.0","attempts":"4","callee":"b"}\n')
        stats = "cluster.outbound|18302||b.lab.svc.cluster.local.upstream_rq_retry_overflow: 7\nbad\n"
        (d / "a.envoy-stats.json").write_text(__import__("json").dumps(analysis.parse_envoy_stats(stats)))
        f = analysis.sidecar_figures(sc, sc["nodes"][0], d, 100.0, 102.0)["b"]
        self.assertEqual((f["window_requests"], f["window_attempts_per_request"]), (2, 3.0))
        self.assertEqual((f["upstream_rq_retry_overflow"], f["upstream_rq_total"]), (7, None))

    def test_haproxy_log_lines_become_ground_truth(self):
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write('{"end_ms":1000500,"d_ms":500,"svc":"h","status":502,"retries":1,"callee":"c"}\n')
            f.write("[WARNING] haproxy chatter\n")
            f.write('{"end_ms":1001000,"d_ms":10,"svc":"h","status":200,"retries":0,"callee":"c"}\n')
        recs = analysis.read_jsonl(f.name)
        self.assertEqual(len(recs), 2)
        self.assertEqual((recs[0]["t"], recs[0]["cause"], recs[0]["attempts"]), (1000.0, "downstream", {"c": 2}))
        self.assertEqual((recs[1]["cause"], recs[1]["ok"]), ("none", True))

    def test_verdicts_are_scored_against_the_services_own_records(self):
        logs = {n["name"]: [] for n in self.sc["nodes"]}
        logs["c"] = [{"t": 1.0, "d": 0.1, "cause": "downstream"}] * 4
        logs["d"] = [{"t": 1.0, "d": 0.1, "cause": "own"}] * 2
        verdicts = [
            {"service": "ra-c:18303", "claim": "unclaimed", "status": 502},  # right
            {"service": "ra-c:18303", "claim": "claimed", "status": 502},  # wrong
            {"service": "ra-d:18304", "claim": "claimed", "status": 503},  # right
            {"service": "ra-d:18304", "claim": "missing", "status": 503},  # no side taken
            {"service": "someone-else", "claim": "claimed", "status": 503},  # not ours
        ]
        with tempfile.TemporaryDirectory() as d:
            s = analysis.score_agent(self.sc, logs, verdicts, [], 0.0, 0.0, Path(d))
        self.assertEqual(s["unknown_services"], ["someone-else"])
        py, node = s["per_runtime"]["python"], s["per_runtime"]["node"]
        self.assertEqual((py["verdicts"], py["correct"], py["missing"]), (2, 1, 1))
        self.assertEqual(py["precision"], 1.0)  # d: the one decided verdict was right
        self.assertEqual(py["recall"], 0.5)
        self.assertEqual((node["correct"], node["precision"], node["recall"]), (1, 0.5, 0.25))

    def test_duplicate_verdicts_do_not_inflate_recall(self):
        logs = {n["name"]: [] for n in self.sc["nodes"]}
        logs["d"] = [{"t": 1.0, "d": 0.1, "cause": "own"}]
        verdicts = [{"service": "ra-d:18304", "claim": "claimed", "status": 503}] * 3
        with tempfile.TemporaryDirectory() as d:
            s = analysis.score_agent(self.sc, logs, verdicts, [], 0.0, 0.0, Path(d))
        self.assertEqual(s["per_runtime"]["python"]["recall"], 1.0)

    def test_first_suppression_counts_only_lab_edges(self):
        decisions = [
            {"edge": {"caller": "wrk", "callee": "haproxy:1"}, "callee_addrs": ["127.0.0.1:1"],
             "action": "suppress_retries", "issued_at_ns": int(10.1e9 + 2e18)},
            {"edge": {"caller": "ra-c:18303", "callee": "ra-d:18304"},
             "callee_addrs": ["10.213.0.14:18304"], "action": "suppress_retries",
             "reason": "over_budget", "issued_at_ns": int(10.5e9 + 2e18)},
        ]
        with tempfile.TemporaryDirectory() as d:
            s = analysis.score_agent(self.sc, {n["name"]: [] for n in self.sc["nodes"]}, [], decisions,
                                2e9 + 10.0, 2e9, Path(d))
        self.assertEqual(list(s["decisions_per_edge"]), ["c->d"])
        self.assertAlmostEqual(s["first_suppression_s"], 0.5, places=3)

    def test_a_retry_the_callee_never_saw_was_stopped(self):
        logs = {n["name"]: [] for n in self.sc["nodes"]}
        # b made two attempts of request 1 (c saw one, ending at 10.3), two of request 2 (c saw
        # both), and two of request 3 that c never saw (refused: no stop).
        logs["b"] = [{"t": 10.2, "id": "1", "attempts": {"c": 2}},
                     {"t": 10.0, "id": "2", "attempts": {"c": 2}},
                     {"t": 10.1, "id": "3", "attempts": {"c": 2}}]
        logs["c"] = [{"t": 10.25, "d": 0.05, "parent": "1"},
                     {"t": 10.0, "d": 0.01, "parent": "2"}, {"t": 10.02, "d": 0.01, "parent": "2"}]
        self.assertAlmostEqual(analysis.first_retry_stopped(self.sc, logs, 10.0), 0.3, places=3)
        logs["c"].pop(0)
        self.assertIsNone(analysis.first_retry_stopped(self.sc, logs, 10.0))


if __name__ == "__main__":
    unittest.main()
