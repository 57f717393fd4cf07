"""Batch-mode benchmark: engine-computed prompt tokens and TTFT for round-robin, affinity only
and batch mode, side by side, on the same bursty same-intent workload and real engines.

Workload (deterministic from --seed): APPS applications, each a real system prompt
(the first 8 of data/bench/system_prompts_long.jsonl, awesome-chatgpt-prompts, 302-496 tokens), receiving
bursts of 3-6 requests within 100 ms, each with its own real user turn (Banking77 test set).
Bursts start at exponentially distributed gaps (mean --gap s), so bursts of different apps
overlap. Every request streams (max_tokens --max-tokens, temperature 0). Arrivals are
open-loop: each request is sent by its own thread at its scheduled time, whatever the
others are doing.

Each mode gets a fresh stack: three llama-server replicas (Gemma 3 270M, 2 slots each, no
host-RAM prompt cache, as in tests/src/llama.rs) and an Envoy:
  round-robin  istio/envoy/round-robin.yaml (no Cohort)
  affinity     istio/envoy/affinity.yaml (the filter, ring hash on x-cohort-key)
  batch        istio/envoy/batch.yaml + `cohort serve` with its HTTP front (target/release/cohort),
               filter {"mode":"batch","assign_deadline_ms":250,...} as tests/tests/e2e/batch_llama.rs

Engine-computed prompt tokens = sum over requests of (prompt_tokens - cached_tokens) from the
engines' own usage, cross-checked with the replicas' llamacpp:prompt_tokens_total deltas
(this llama-server counts only computed tokens there; cached ones go to
llamacpp:prompt_tokens_cached_total). The /metrics figure also includes batch mode's
prefetch warm-ups, which no client sees.

  scripts/bench-batch [--requests 72] [--seed 1] [--gap 4.0] [--max-tokens 16] [--json out.json]

Exits 1 if any request failed. Needs scripts/setup, scripts/build-wasm and
`cargo build --release -p cohort-cli`.
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

APPS = 8
SLOTS = 2
BATCH_FILTER = '{"mode": "batch", "assign_deadline_ms": 250, "batcher_clusters": ["cohort-batcher-0"]}'


def workload(count, seed, gap, max_tokens, apps_n=APPS):
    """[(t_seconds, app_index, body)] sorted by time: bursts of one app, 3-6 requests in 100 ms."""
    apps = [json.loads(line) for line in open(os.path.join(stack.ROOT, "data/bench/system_prompts_long.jsonl"))]
    apps = apps[:apps_n]
    turns = [row["text"] for row in csv.DictReader(open(os.path.join(stack.ROOT, "data/intent/banking77_test.csv")))]
    rng = random.Random(seed)
    schedule, t, burst = [], 0.5, 0
    while len(schedule) < count:
        app = rng.randrange(len(apps))
        size = rng.randint(3, 6)
        for offset in sorted(rng.uniform(0, 0.1) for _ in range(size)):
            body = {
                "model": "gemma-3-270m",
                "messages": [{"role": "system", "content": apps[app]["prompt"]},
                             {"role": "user", "content": rng.choice(turns)}],
                "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True},
            }
            schedule.append({"t": t + offset, "app": app, "burst": burst, "body": body})
        burst += 1
        t += rng.expovariate(1.0 / gap)
    schedule = sorted(schedule[:count], key=lambda r: r["t"])
    return schedule


def replay(port, schedule, label, headers=None):
    """Open loop: one thread per request, started at its scheduled time."""
    results = [None] * len(schedule)
    done = [0]
    lock = threading.Lock()

    def one(i, item):
        try:
            result = stack.stream_chat(port, item["body"], headers)
            if not result["done"]:
                result["error"] = "stream ended without [DONE]"
        except Exception as e:  # noqa: BLE001 — every failure is reported, none stops the run
            result = {"error": f"{type(e).__name__}: {e}"}
        result.update({"app": item["app"], "burst": item["burst"], "t": item["t"]})
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
    return results, time.perf_counter() - start


def warm_engines(ports):
    """One tiny unrelated request per replica, so no mode pays a fresh engine's first-request cost."""
    for port in ports:
        stack.stream_chat(port, {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "Hi"}],
                                 "max_tokens": 1, "stream": True, "stream_options": {"include_usage": True}})


def run_mode(mode, schedule, workdir):
    _, ports = stack.start_replicas(workdir, mode, count=3, slots=SLOTS, ctx=2048 * SLOTS)
    warm_engines(ports)
    front = None
    if mode == "batch":
        _, front = stack.start_cohort(workdir, ports, prefix=mode)
        _, admin, listen = envoy_config.start("batch", workdir, ports, label=f"{mode}-envoy",
                                              ports={50051: front["grpc"], 8000: front["front"]},
                                              filter_config=BATCH_FILTER)
    else:
        _, admin, listen = envoy_config.start(mode, workdir, ports, label=f"{mode}-envoy")
    if front:
        # The front learns each replica's slot count from /props at its first probe (1 s period).
        time.sleep(2.0)
    before = [stack.engine_tokens(p) for p in ports]
    results, wall = replay(listen, schedule, mode)
    time.sleep(1.5)  # let the front's last metrics scrape and any warm-up finish
    after = [stack.engine_tokens(p) for p in ports]
    names = {f"127.0.0.1:{p}": f"replica-{i}" for i, p in enumerate(ports)}
    for r in results:
        if "batch" in r and r["batch"]:
            r["role"], _, r["replica"] = r["batch"].partition(";replica=")
        elif "replica" in r:
            r["replica"] = names.get(r["replica"], r["replica"])
    out = {"results": results, "wall_s": wall,
           "engine_computed": sum(a[0] - b[0] for a, b in zip(after, before)),
           "engine_cached": sum(a[1] - b[1] for a, b in zip(after, before)),
           "engine_computed_per_replica": [a[0] - b[0] for a, b in zip(after, before)]}
    if front:
        page = stack.metrics(front["http"])
        out["front"] = {name: stack.metric(page, series, labels) for name, series, labels in (
            ("leader", "cohort_front_requests_total", {"role": "leader"}),
            ("follower", "cohort_front_requests_total", {"role": "follower"}),
            ("direct", "cohort_front_requests_total", {"role": "direct"}),
            ("prefetch_issued", "cohort_prefetch_issued_total", None),
            ("prefetch_hit", "cohort_prefetch_hit_total", None),
            ("prefetch_miss", "cohort_prefetch_miss_total", None),
            ("prefetch_wasted", "cohort_prefetch_wasted_total", None),
            ("failovers", "cohort_front_failovers_total", None),
            ("unreachable", "cohort_front_unreachable_total", None),
        )}
        out["front_metrics"] = "\n".join(line for line in page.splitlines()
                                         if line.startswith(("cohort_front", "cohort_prefetch", "cohort_batch")))
        # The Envoy side: how many requests the filter sent to the front.
        try:
            page = stack.get(admin, "/stats?filter=cluster.cohort-front-0.upstream_rq_total$")[1]
            out["envoy_front_rq"] = page.decode().strip()
        except OSError:
            pass
    stack.stop_all()
    return out


def summarise(mode, run):
    results = run["results"]
    ok = [r for r in results if "error" not in r]
    ttft = [r["ttft_ms"] for r in ok]
    row = {
        "requests": len(results), "ok": len(ok), "failed": len(results) - len(ok),
        "computed_usage": sum(r["prompt_tokens"] - r["cached_tokens"] for r in ok),
        "prompt_usage": sum(r["prompt_tokens"] for r in ok),
        "computed_engine": int(run["engine_computed"]),
        "computed_engine_per_replica": [int(x) for x in run["engine_computed_per_replica"]],
        "ttft_p50_ms": stack.percentile(ttft, 0.50) or 0.0, "ttft_p95_ms": stack.percentile(ttft, 0.95) or 0.0,
        "ttft_p99_ms": stack.percentile(ttft, 0.99) or 0.0, "ttft_mean_ms": statistics.mean(ttft) if ttft else 0.0,
        "wall_s": run["wall_s"],
        "per_replica_requests": {name: sum(1 for r in ok if r.get("replica") == name)
                                 for name in sorted({r.get("replica", "?") for r in ok})},
        "errors": sorted({r["error"] for r in results if "error" in r}),
    }
    if "front" in run:
        row["front"] = run["front"]
        roles = {}
        for r in ok:
            roles[r.get("role", "none")] = roles.get(r.get("role", "none"), 0) + 1
        row["roles_seen_by_clients"] = roles
    return row


def print_table(rows):
    rr, aff = rows["round-robin"], rows["affinity"]
    print("\n| mode | requests ok | computed prompt tokens (usage) | (engine /metrics) | vs round-robin "
          "| TTFT p50 (ms) | p95 (ms) | p99 (ms) | p95 vs affinity |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode, row in rows.items():
        ratio = row["computed_engine"] / rr["computed_engine"] if rr["computed_engine"] else 0.0
        p95 = row["ttft_p95_ms"] / aff["ttft_p95_ms"] if aff["ttft_p95_ms"] else 0.0
        print(f"| {mode} | {row['ok']}/{row['requests']} | {row['computed_usage']:,} | {row['computed_engine']:,} | "
              f"{ratio:.2f} | {row['ttft_p50_ms']:.0f} | {row['ttft_p95_ms']:.0f} | {row['ttft_p99_ms']:.0f} | "
              f"{p95:.2f} |")
    b = rows["batch"]
    f = b.get("front", {})
    print(f"\nbatch front: leader {f.get('leader', 0):.0f}, follower {f.get('follower', 0):.0f}, "
          f"direct {f.get('direct', 0):.0f} (clients saw {b.get('roles_seen_by_clients')}); "
          f"prefetch issued {f.get('prefetch_issued', 0):.0f} hit {f.get('prefetch_hit', 0):.0f} "
          f"miss {f.get('prefetch_miss', 0):.0f} wasted {f.get('prefetch_wasted', 0):.0f}")
    for mode, row in rows.items():
        print(f"{mode}: requests per replica {row['per_replica_requests']}, engine-computed per replica "
              f"{row['computed_engine_per_replica']}, replay took {row['wall_s']:.0f} s"
              + (f"; errors: {row['errors']}" if row["errors"] else ""))
    saved = 1 - b["computed_engine"] / rr["computed_engine"] if rr["computed_engine"] else 0.0
    print(f"\ngoal 1 (batch computes >= 40% fewer prompt tokens than round-robin): {saved:.0%} fewer -> "
          f"{'met' if saved >= 0.40 else 'NOT met'}")
    print(f"goal 2 (fewer than affinity only): {b['computed_engine']:,} vs {aff['computed_engine']:,} -> "
          f"{'met' if b['computed_engine'] < aff['computed_engine'] else 'NOT met'}")
    print(f"goal 3 (TTFT p95 no worse than affinity only): {b['ttft_p95_ms']:.0f} ms vs {aff['ttft_p95_ms']:.0f} ms -> "
          f"{'met' if b['ttft_p95_ms'] <= aff['ttft_p95_ms'] else 'NOT met'}")


def main():
    parser = argparse.ArgumentParser(prog="bench-batch", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=72)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gap", type=float, default=4.0, help="mean seconds between burst starts")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--modes", default="round-robin,affinity,batch")
    parser.add_argument("--json", help="write the summary and every request's numbers here")
    args = parser.parse_args()
    for need in (stack.LLAMA, stack.ENVOY, stack.MODEL, stack.FILTER, stack.COHORT):
        if not os.path.exists(need):
            raise SystemExit(f"{need} missing: run scripts/setup, scripts/build-wasm, "
                             "cargo build --release -p cohort-cli")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    workdir = tempfile.mkdtemp(prefix="cohort-bench-batch-")
    schedule = workload(args.requests, args.seed, args.gap, args.max_tokens)
    bursts = len({r["burst"] for r in schedule})
    print(f"workload: {len(schedule)} requests in {bursts} bursts of {APPS} apps over "
          f"{schedule[-1]['t']:.0f} s (seed {args.seed}, mean gap {args.gap} s, max_tokens {args.max_tokens}); "
          f"logs in {workdir}", file=sys.stderr)
    runs, rows = {}, {}
    try:
        for mode in args.modes.split(","):
            runs[mode] = run_mode(mode, schedule, workdir)
            rows[mode] = summarise(mode, runs[mode])
    except KeyboardInterrupt:
        print("\ninterrupted; stopping replicas, batcher and Envoy", file=sys.stderr)
        return 130
    finally:
        stack.stop_all()
    if all(m in rows for m in ("round-robin", "affinity", "batch")):
        print_table(rows)
    else:
        print(json.dumps(rows, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "summary": rows,
                       "requests": {m: [dict(r) for r in run["results"]] for m, run in runs.items()},
                       "front_metrics": runs.get("batch", {}).get("front_metrics")}, f, indent=2)
    failed = sum(row["failed"] for row in rows.values())
    if failed:
        print(f"{failed} requests failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
