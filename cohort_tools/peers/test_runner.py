"""Smoke test of the peer benchmark's runner (cohort_tools/peers/run.py) end to end with real parts:
a real `cohort engine-sim serve` with 4 simulated replicas, real Envoy (round-robin, and the
real Cohort filter in affinity mode), the real open-loop client, a few seconds of the
templated-app workload, then report.write over the two runs; and the endpoint picker without
and with the simulator's KV events (cohort-epp, cohort-epp-events).

A Python unittest rather than a Rust test in tests/: everything it drives (the runner, the
client, the contenders, the report) is Python, and `scripts/test` runs the package's tests with
`.venv/bin/python -m unittest discover -s cohort_tools -t .`. Bounds are loose for a busy 2-core CI box: the
assertions are about correctness (no request lost, every record complete, round-robin uses
every replica, affinity keeps most of each prompt group at home, the engines' counters move),
not speed; the whole test is bounded by a few seconds of arrivals and the runner's timeouts.
Needs `cargo build --release -p cohort-cli`, scripts/build-wasm and Envoy (scripts/setup).
"""
import collections
import json
import os
import shutil
import tempfile
import unittest
import urllib.request

from cohort_tools import envoy_config, stack
from cohort_tools.peers import report, run, workloads


class RunnerSmoke(unittest.TestCase):
    def setUp(self):
        for need in (stack.COHORT, stack.ENVOY, stack.FILTER):
            if not os.path.exists(need):
                self.fail(f"{need} missing: run scripts/setup (it builds the cohort binary and the filter)")
        self.out = tempfile.mkdtemp(prefix="bench-peers-smoke-")
        self.addCleanup(shutil.rmtree, self.out, True)
        self.addCleanup(stack.stop_all)

    def test_envoy_workers_follow_cohort_envoy_workers(self):
        # The benchmark's Envoys run one worker; COHORT_ENVOY_WORKERS sets another count
        # (docs/BENCHMARKS.md, "Envoy with two workers"). Envoy's admin reports the count
        # it runs with.
        workdir = tempfile.mkdtemp(prefix="bench-peers-workers-")
        self.addCleanup(shutil.rmtree, workdir, True)
        seen = {}
        for workers in ("", "2"):
            if workers:
                os.environ["COHORT_ENVOY_WORKERS"] = workers
            else:
                os.environ.pop("COHORT_ENVOY_WORKERS", None)
            self.addCleanup(os.environ.pop, "COHORT_ENVOY_WORKERS", None)
            envoy, admin, _ = envoy_config.start("round-robin", workdir, [stack.free_port()] * 3,
                                                 label=f"envoy-{workers or 'default'}")
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/server_info", timeout=5) as response:
                seen[workers] = json.load(response)["command_line_options"]["concurrency"]
            envoy.terminate()
            envoy.wait(timeout=10)
        self.assertEqual(seen, {"": 1, "2": 2})

    def test_envoy_rr_and_affinity_on_four_sim_replicas(self):
        args = run.parse_args(["--engine", "sim", "--replicas", "4", "--workloads", "templated-app",
                               "--contenders", "envoy-rr,cohort-affinity", "--arrival", "poisson",
                               "--rate", "10", "--duration", "4", "--request-timeout", "30", "--out", self.out])
        config = run.settings(args, "templated-app")
        requests = run.build_requests(workloads, args, "templated-app", config)
        self.assertGreater(len(requests), 10)
        workdir = tempfile.mkdtemp(prefix="bench-peers-smoke-logs-")
        self.addCleanup(shutil.rmtree, workdir, True)
        bound = run.pooled_bound(requests, 4, config["kv_blocks"], workdir, "smoke")
        self.assertIsNotNone(bound)
        self.assertTrue(0.0 <= bound <= 1.0, bound)
        runs = {}
        for contender in ("envoy-rr", "cohort-affinity"):
            runs[contender] = run.run_one(args, "sim", "templated-app", requests, 4, contender, workdir,
                                          None, bound, None, config)
        for name, result in runs.items():
            records = result["records"]
            self.assertEqual(len(records), len(requests), name)
            failed = [r for r in records if r["error"]]
            self.assertEqual(failed, [], name)
            for r in records:
                self.assertEqual(r["status"], 200)
                self.assertIsNotNone(r["ttft_ms"])
                self.assertGreaterEqual(r["e2e_ms"], r["ttft_ms"])
                self.assertIn(r["replica"], {f"replica-{i}" for i in range(4)})
                self.assertGreater(r["prompt_tokens"], 0)
            served = sum(m["requests"] or 0 for m in result["engine_metrics"].values())
            self.assertEqual(served, len(requests), f"{name}: engine request counters {result['engine_metrics']}")
        # Round-robin spreads requests over every replica.
        rr = collections.Counter(r["replica"] for r in runs["envoy-rr"]["records"])
        self.assertEqual(len(rr), 4, rr)
        # Affinity keeps a prompt group (one application's system prompt) at home: its ring
        # hash has bounded load (hash_balance_factor 125), so a request whose home replica
        # is over 1.25x the mean in flight goes to the next one on the ring; most stay.
        by_group = collections.defaultdict(collections.Counter)
        for r in runs["cohort-affinity"]["records"]:
            by_group[r["group"]][r["replica"]] += 1
        at_home = sum(c.most_common(1)[0][1] for c in by_group.values())
        total = sum(sum(c.values()) for c in by_group.values())
        print(f"affinity: {at_home} of {total} requests on their group's home replica: {dict(by_group)}")
        # The ring comes from the replicas' per-run free ports, so which hot groups share a
        # home (and spill) varies: 23-30 of 31 at home in five runs on 2026-12-05. Round-robin
        # puts about 2 of 5 of a group on its most common replica.
        # A spilled request may pass its home's ring successor too when that one is also over
        # the bound (CI on 2026-12-06: one group of 6 on three replicas, 3/2/1), so the test
        # asserts the share at home, and against round-robin's on the same requests, rather
        # than a count of replicas per group.
        self.assertGreaterEqual(at_home, 2 / 3 * total, dict(by_group))
        rr_by_group = collections.defaultdict(collections.Counter)
        for r in runs["envoy-rr"]["records"]:
            rr_by_group[r["group"]][r["replica"]] += 1
        rr_at_home = sum(c.most_common(1)[0][1] for c in rr_by_group.values())
        self.assertGreater(at_home, rr_at_home, (dict(by_group), dict(rr_by_group)))
        report.write(list(runs.values()), self.out)
        for name in ("results.json", "table.md"):
            self.assertTrue(os.path.exists(os.path.join(self.out, name)), name)
        with open(os.path.join(self.out, "results.json")) as f:
            json.load(f)

    def test_cohort_epp_on_four_sim_replicas(self):
        # The endpoint picker's contender: real Envoy with ext_proc to `cohort serve`'s picker
        # and override_host over the replicas. Every request answered by one of the replicas,
        # and the engines' own counters served them all.
        args = run.parse_args(["--engine", "sim", "--replicas", "4", "--workloads", "templated-app",
                               "--contenders", "cohort-epp", "--arrival", "poisson",
                               "--rate", "10", "--duration", "3", "--request-timeout", "30", "--out", self.out])
        config = run.settings(args, "templated-app")
        requests = run.build_requests(workloads, args, "templated-app", config)
        workdir = tempfile.mkdtemp(prefix="bench-peers-smoke-logs-")
        self.addCleanup(shutil.rmtree, workdir, True)
        result = run.run_one(args, "sim", "templated-app", requests, 4, "cohort-epp", workdir, None, None, None,
                             config)
        records = result["records"]
        self.assertEqual(len(records), len(requests))
        self.assertEqual([r for r in records if r["error"] or r["status"] != 200], [])
        self.assertTrue(all(r["replica"] in {f"replica-{i}" for i in range(4)} for r in records))
        served = sum(m["requests"] or 0 for m in result["engine_metrics"].values())
        self.assertEqual(served, len(requests), result["engine_metrics"])

    def test_cohort_epp_events_on_four_sim_replicas(self):
        # The picker on the engines' KV events: the simulator publishes them (a free run of 8
        # ports), `cohort serve` follows every replica's stream from its config file's
        # [[replicas]] and decides every request on the published residency.
        args = run.parse_args(["--engine", "sim", "--replicas", "4", "--workloads", "templated-app",
                               "--contenders", "cohort-epp-events", "--arrival", "poisson", "--kv-blocks", "128",
                               "--rate", "10", "--duration", "3", "--request-timeout", "30", "--out", self.out])
        config = run.settings(args, "templated-app")
        requests = run.build_requests(workloads, args, "templated-app", config)
        workdir = tempfile.mkdtemp(prefix="bench-peers-smoke-logs-")
        self.addCleanup(shutil.rmtree, workdir, True)
        result = run.run_one(args, "sim", "templated-app", requests, 4, "cohort-epp-events", workdir, None, None,
                             None, config)
        records = result["records"]
        self.assertEqual([r for r in records if r["error"] or r["status"] != 200], [])
        self.assertEqual(sorted(result["kv_events"]), [f"replica-{i}" for i in range(4)])
        for replica, stream in result["kv_events"].items():
            self.assertEqual((stream["healthy"], stream["complete"]), (1.0, 1.0), replica)
        self.assertEqual(result["residency"]["decisions"].get("events"), len(requests), result["residency"])
        self.assertEqual(result["residency"]["prompts"].get("keyed"), len(requests), result["residency"])


if __name__ == "__main__":
    unittest.main()
