"""Prefetch benchmark: how much predictive warm-ups narrow the spread of the first request's
TTFT in each burst, batch mode with `x-cohort-prefetch: none` vs `high`.

Trace (deterministic from --seed): conversations (`x-cohort-session`) that each walk their own
recurring sequence of cohorts (apps: real system prompts, data/bench/system_prompts_long.jsonl,
302-341 tokens for the default 7; user turns from Banking77), one burst per step: 1-2 requests of the step's
cohort within 80 ms. The sequences have different lengths (--flows, default "3,4": one
conversation cycles through 3 apps, another through 4 others), so 7 cohorts share the 6
slots of three 2-slot replicas: between two visits of a cohort its slot is often given to
another one, and without prefetch a burst's first request is sometimes warm and sometimes
cold. Steps of a conversation are 2.5-3.0 s apart (uniform), inside the predictor's 3.2 s
horizon, leaving a warm-up (a cold prefill, ~1.5-2.5 s here) time to finish.

Learning phase: the predictor (order-1 Markov per tenant, learned from the session's cohort
sequence) needs to have seen a transition before it can act on it; it sees the last->first
transition of a conversation's cycle only at the first step of the second pass. So the first
pass plus one step of every conversation are sent but not measured, in both runs alike.

Each run gets a fresh stack (three llama-server replicas, `cohort serve` with its front, Envoy
istio/envoy/batch.yaml as tests/tests/e2e/batch_llama.rs wires it), and replays the same trace
with every request carrying `x-cohort-prefetch: none`, then `high`.

  scripts/bench-prefetch [--steps 20] [--seed 1] [--flows 3,4] [--gap 2.5,3.0] [--level high] [--json out.json]

Exits 1 if any request failed.
"""
import argparse
import csv
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time

from cohort_tools import envoy_config, stack

SLOTS = 2
BATCH_FILTER = '{"mode": "batch", "assign_deadline_ms": 250, "batcher_clusters": ["cohort-batcher-0"]}'
# The shorter prompts of the file (289-341 tokens): a cold prefill is ~1.5 s on an idle machine,
# 3-5 s on a loaded one, which a warm-up must finish inside a 2-3 s gap.
APP_ORDER = [0, 1, 3, 5, 6, 2, 7, 11, 10, 9, 4, 8]


def trace(seed, flows, steps, max_tokens, gap_lo, gap_hi):
    """[{t, session, step, cohort, first, measured, body}] sorted by time."""
    apps = [json.loads(line) for line in open(os.path.join(stack.ROOT, "data/bench/system_prompts_long.jsonl"))]
    turns = [row["text"] for row in csv.DictReader(open(os.path.join(stack.ROOT, "data/intent/banking77_test.csv")))]
    if sum(flows) > len(APP_ORDER):
        raise SystemExit(f"at most {len(APP_ORDER)} cohorts in all flows")
    rng = random.Random(seed)
    out, next_app = [], 0
    for s, length in enumerate(flows):
        cohorts = APP_ORDER[next_app:next_app + length]
        next_app += length
        t = 0.5 + s * 1.1  # conversations start out of phase
        for step in range(steps):
            cohort = cohorts[step % length]
            size = rng.randint(1, 2)
            for m in range(size):
                body = {
                    "model": "gemma-3-270m",
                    "messages": [{"role": "system", "content": apps[cohort]["prompt"]},
                                 {"role": "user", "content": rng.choice(turns)}],
                    "max_tokens": max_tokens, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True},
                }
                out.append({"t": t + (0 if m == 0 else rng.uniform(0.03, 0.08)), "session": f"conv-{s}",
                            "step": step, "cohort": cohort, "first": m == 0,
                            "measured": step > length, "body": body})
            t += rng.uniform(gap_lo, gap_hi)
    return sorted(out, key=lambda r: r["t"])


def replay(port, schedule, label, level):
    results = [None] * len(schedule)
    done = [0]
    lock = threading.Lock()

    def one(i, item):
        headers = {"x-cohort-session": item["session"], "x-cohort-prefetch": level}
        try:
            result = stack.stream_chat(port, item["body"], headers)
            if not result["done"]:
                result["error"] = "stream ended without [DONE]"
        except Exception as e:  # noqa: BLE001
            result = {"error": f"{type(e).__name__}: {e}"}
        result.update({k: item[k] for k in ("t", "session", "step", "cohort", "first", "measured")})
        results[i] = result
        with lock:
            done[0] += 1
            if sys.stderr.isatty() or done[0] == len(schedule):
                print(f"\r{label}: {done[0]}/{len(schedule)} requests", end="", file=sys.stderr, flush=True)

    threads = []
    start = time.perf_counter()
    for i, item in enumerate(schedule):
        delay = item["t"] - (time.perf_counter() - start)
        if delay > 0:
            time.sleep(delay)
        thread = threading.Thread(target=one, args=(i, item), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    print(file=sys.stderr)
    return results


def run(level, schedule, workdir):
    _, ports = stack.start_replicas(workdir, f"prefetch-{level}", count=3, slots=SLOTS, ctx=2048 * SLOTS)
    for port in ports:  # a fresh engine's first request is slower; not part of the trace
        stack.stream_chat(port, {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "Hi"}],
                                 "max_tokens": 1, "stream": True})
    _, front = stack.start_cohort(workdir, ports, prefix=f"prefetch-{level}")
    _, admin, listen = envoy_config.start("batch", workdir, ports, label=f"prefetch-{level}-envoy",
                                          ports={50051: front["grpc"], 8000: front["front"]},
                                          filter_config=BATCH_FILTER)
    time.sleep(2.0)  # the front reads each replica's slot count at its first probe
    before = [stack.engine_tokens(p) for p in ports]
    results = replay(listen, schedule, f"prefetch {level}", level)
    time.sleep(1.5)
    after = [stack.engine_tokens(p) for p in ports]
    page = stack.metrics(front["http"])
    counters = {name: stack.metric(page, f"cohort_prefetch_{name}_total")
                for name in ("issued", "hit", "miss", "wasted", "failed")}
    counters.update({role: stack.metric(page, "cohort_front_requests_total", {"role": role})
                     for role in ("leader", "follower", "direct")})
    stack.stop_all()
    return {"results": results, "counters": counters,
            "engine_computed": sum(a[0] - b[0] for a, b in zip(after, before)),
            "front_metrics": "\n".join(line for line in page.splitlines()
                                        if line.startswith(("cohort_prefetch", "cohort_front")))}


def summarise(out):
    results = out["results"]
    firsts = [r for r in results if r["first"] and r["measured"] and "error" not in r]
    ttft = [r["ttft_ms"] for r in firsts]
    warm = [r for r in firsts if r["prompt_tokens"] and r["cached_tokens"] >= 0.8 * r["prompt_tokens"]]
    return {
        "requests": len(results), "failed": sum(1 for r in results if "error" in r),
        "errors": sorted({r["error"] for r in results if "error" in r}),
        "bursts_measured": len(firsts),
        "first_ttft_mean_ms": statistics.mean(ttft) if ttft else 0.0,
        "first_ttft_stdev_ms": statistics.stdev(ttft) if len(ttft) > 1 else 0.0,
        "first_ttft_p50_ms": stack.percentile(ttft, 0.5) or 0.0,
        "first_ttft_p95_ms": stack.percentile(ttft, 0.95) or 0.0,
        "first_ttft_max_ms": max(ttft) if ttft else 0.0,
        "first_warm": len(warm),
        "first_roles": {role: sum(1 for r in firsts if r.get("batch", "").startswith(role + ";"))
                        for role in ("leader", "follower", "direct")},
        "engine_computed_prompt_tokens": int(out["engine_computed"]),
        "counters": out["counters"],
    }


def main():
    parser = argparse.ArgumentParser(prog="bench-prefetch", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="bursts per conversation (learning phase included)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--flows", default="3,4", help="cycle length of each conversation's cohort sequence")
    parser.add_argument("--gap", default="2.5,3.0", help="seconds between a conversation's bursts (uniform lo,hi)")
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--level", default="high", help="x-cohort-prefetch of the prefetch run")
    parser.add_argument("--json", help="write the summary and every request's numbers here")
    args = parser.parse_args()
    for need in (stack.LLAMA, stack.ENVOY, stack.MODEL, stack.FILTER, stack.COHORT):
        if not os.path.exists(need):
            raise SystemExit(f"{need} missing: run scripts/setup, scripts/build-wasm, "
                             "cargo build --release -p cohort-cli")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    flows = [int(x) for x in args.flows.split(",")]
    gap_lo, gap_hi = (float(x) for x in args.gap.split(","))
    schedule = trace(args.seed, flows, args.steps, args.max_tokens, gap_lo, gap_hi)
    workdir = tempfile.mkdtemp(prefix="cohort-bench-prefetch-")
    print(f"trace: {len(schedule)} requests, {len(flows)} conversations (cycles {flows}), {args.steps} bursts each, "
          f"gaps {gap_lo}-{gap_hi} s, over {schedule[-1]['t']:.0f} s; learning phase = first cycle + 1 step "
          f"of each conversation; logs in {workdir}", file=sys.stderr)
    outs, rows = {}, {}
    try:
        for level in ("none", args.level):
            outs[level] = run(level, schedule, workdir)
            rows[level] = summarise(outs[level])
    except KeyboardInterrupt:
        print("\ninterrupted; stopping replicas, batcher and Envoy", file=sys.stderr)
        return 130
    finally:
        stack.stop_all()
    print("\n| x-cohort-prefetch | bursts measured | first-request TTFT mean (ms) | std dev (ms) | p50 (ms) | p95 (ms) "
          "| max (ms) | first requests warm | prefetch issued / hit / miss / wasted | engine-computed prompt tokens |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for level, row in rows.items():
        c = row["counters"]
        print(f"| {level} | {row['bursts_measured']} | {row['first_ttft_mean_ms']:.0f} | "
              f"{row['first_ttft_stdev_ms']:.0f} | "
              f"{row['first_ttft_p50_ms']:.0f} | {row['first_ttft_p95_ms']:.0f} | {row['first_ttft_max_ms']:.0f} | "
              f"{row['first_warm']}/{row['bursts_measured']} | {c['issued']:.0f} / {c['hit']:.0f} / {c['miss']:.0f} / "
              f"{c['wasted']:.0f} | {row['engine_computed_prompt_tokens']:,} |")
    off, on = rows["none"], rows[args.level]
    ratio = off["first_ttft_stdev_ms"] / on["first_ttft_stdev_ms"] if on["first_ttft_stdev_ms"] else float("inf")
    for level, row in rows.items():
        c = row["counters"]
        print(f"{level}: first requests by role {row['first_roles']}, front requests leader {c['leader']:.0f} "
              f"follower {c['follower']:.0f} direct {c['direct']:.0f}, warm-ups failed {c['failed']:.0f}"
              + (f"; errors {row['errors']}" if row["errors"] else ""))
    print(f"\nstd dev of the first request's TTFT: {off['first_ttft_stdev_ms']:.0f} ms without prefetch, "
          f"{on['first_ttft_stdev_ms']:.0f} ms with {args.level}: {ratio:.1f}x narrower -> "
          f"goal (>= 5x) {'met' if ratio >= 5 else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "summary": rows,
                       "requests": {k: [{x: y for x, y in r.items() if x != "body"} for r in o["results"]]
                                    for k, o in outs.items()},
                       "front_metrics": {k: o["front_metrics"] for k, o in outs.items()}}, f, indent=2)
    failed = sum(row["failed"] for row in rows.values())
    if failed:
        print(f"{failed} requests failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
