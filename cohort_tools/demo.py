"""Live demo: Cohort's routing vs round-robin on three real llama-server replicas.

Each phase starts three fresh `llama-server` replicas (Gemma 3 270M, 4 slots each, host-RAM
prompt cache off so a replica's cache is its slots, like a GPU replica whose KV cache holds
a few long prefixes; `--swa-full` so the sliding-window model reuses any shared prefix as
an engine's prefix cache would), an Envoy in front of them, and replays the same requests:
twelve applications (real system prompts from awesome-chatgpt-prompts) receiving real user
turns (Banking77), arriving in a fixed pseudo-random order, three at a time, streaming.
Phase 1 is Envoy with the Cohort filter: `--mode assign` (default; `istio/envoy/assign.yaml`
and `cohort serve` deciding on prefixes and live load) or `--mode affinity`
(`istio/envoy/affinity.yaml`: ring hash on x-cohort-key with bounded load, no batcher);
phase 2 is Envoy round-robin (`istio/envoy/round-robin.yaml`). Each phase starts with one
warm-up request per replica and one through the router, identical in both and not counted
(a fresh llama-server's first prefill pages the model in; Envoy and the filter make their
first connections). The table shows, per replica, what the engines report: requests, prompt
tokens, cached prompt tokens, and the time to first token.

  scripts/demo [--mode assign|affinity] [--requests 96] [--concurrency 3] [--json results.json]
               [--records requests.json]

Needs scripts/setup. Everything it starts is stopped on exit, error or Ctrl-C.
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
from concurrent.futures import ThreadPoolExecutor

from cohort_tools import envoy_config, stack
from cohort_tools.stack import ENVOY, FILTER, LLAMA, MODEL, ROOT, get, stop_all

REPLICAS = 3
# The batcher's default prefetch level in assign mode (--prefetch); None: its own default.
PREFETCH = None


def requests_to_replay(count):
    apps = [json.loads(line) for line in open(os.path.join(ROOT, "data/prompts/system_prompts.jsonl"))]
    turns = [row["text"] for row in csv.DictReader(open(os.path.join(ROOT, "data/intent/banking77_test.csv")))]
    # Arrivals in a fixed pseudo-random order: a strict rotation would line up with the
    # round-robin rotation and flatter it.
    order = random.Random(7)
    bodies = []
    for i in range(count):
        app = apps[order.randrange(len(apps))]
        bodies.append({
            "model": "gemma-3-270m",
            "messages": [{"role": "system", "content": app["prompt"]},
                         {"role": "user", "content": turns[(i * 41) % len(turns)]}],
            "max_tokens": 4, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
        })
    return bodies


# Assign mode: the filter asks `cohort serve` for a replica (250 ms deadline on this busy
# 2-core box; the decision itself takes microseconds).
ASSIGN_FILTER = '{"mode": "assign", "assign_deadline_ms": 250, "batcher_clusters": ["cohort-batcher-0"]}'


def start_router(config_name, workdir, ports):
    """Envoy on istio/envoy/<config_name>.yaml in front of `ports`; for `assign`, with
    `cohort serve` deciding (replicas with URLs, so its probes see their health and queues).
    Returns Envoy's (admin, listen) ports and `cohort serve`'s HTTP port (None without it)."""
    cohort_http = None
    if config_name != "assign":
        _, admin, listen = envoy_config.start(config_name, workdir, ports)
    else:
        # Each llama-server replica's cache is its 4 slots' last prompts (host-RAM prompt
        # cache off): 4 requests of about 3 of the filter's 256-byte blocks each (a ~500-byte
        # system prompt and a user turn), as an operator configures it for their engines.
        toml = os.path.join(workdir, "serve.toml")
        with open(toml, "w") as f:
            f.write("[policy]\nkv_blocks_per_replica = 12\n")
            if PREFETCH:
                f.write(f"[knobs.global]\nprefetch = \"{PREFETCH}\"\n")
        _, cohort = stack.start_cohort(workdir, ports, prefix="demo", front=False, extra_args=["--config", toml])
        cohort_http = cohort["http"]
        mapping = {50051: cohort["grpc"], 50052: cohort["grpc"]}
        _, admin, listen = envoy_config.start("assign", workdir, ports, ports=mapping, filter_config=ASSIGN_FILTER)
    return admin, listen, cohort_http


# Not part of the replay: one tiny request to each fresh replica (its first prefill pages
# the model in) and one through the router (Envoy's first upstream connections, the filter's
# first run, assign mode's first gRPC call), the same in both phases, so the table compares
# routing rather than cold starts. Its prompt shares nothing with the replayed ones.
WARM_UP = {
    "model": "gemma-3-270m",
    "messages": [{"role": "system", "content": "Warm-up."}, {"role": "user", "content": "Ping."}],
    "max_tokens": 1, "temperature": 0, "stream": True,
}


def warm_up(ports, listen):
    for port in ports:
        stack.stream_chat(port, WARM_UP)
    stack.stream_chat(listen, WARM_UP)


def run_phase(label, config_name, bodies, args, workdir):
    _, ports = stack.start_replicas(workdir, config_name, count=REPLICAS, slots=4, ctx=8192)
    admin, listen, cohort_http = start_router(config_name, workdir, ports)
    warm_up(ports, listen)
    done = [0]
    lock = threading.Lock()

    def send(body):
        result = stack.stream_chat(listen, body)
        with lock:
            done[0] += 1
            if sys.stderr.isatty() or done[0] == len(bodies):
                print(f"\r{label}: {done[0]}/{len(bodies)} requests", end="", file=sys.stderr, flush=True)
        return result

    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        results = list(pool.map(send, bodies))
    print(file=sys.stderr)
    # Every engine cluster's retries (affinity and round-robin have one, assign one per replica).
    clusters = "engines|replica-[0-9]+|failover-replica-[0-9]+|all-replicas"
    stats = get(admin, f"/stats?filter=^cluster\\.({clusters})\\.upstream_rq_retry$")[1].decode()
    retries = sum(int(line.split(":")[-1]) for line in stats.splitlines() if ":" in line)
    names = {f"127.0.0.1:{port}": f"replica {i + 1}" for i, port in enumerate(ports)}
    for result in results:
        result["replica"] = names.get(result["replica"], result["replica"])
    if cohort_http is not None:
        # The batcher's warm-ups of predicted cohorts (x-cohort-prefetch, default medium).
        text = stack.metrics(cohort_http)
        issued = stack.metric(text, "cohort_prefetch_issued_total") or 0
        hits = stack.metric(text, "cohort_prefetch_hit_total") or 0
        print(f"{label}: the batcher sent {issued:.0f} warm-ups of predicted cohorts ({hits:.0f} used)",
              file=sys.stderr)
    stop_all()
    return results, retries


def summarise(phase):
    results, retries = phase
    rows = {"envoy_retries": retries}
    for name in sorted({r["replica"] for r in results}) + ["all"]:
        mine = [r for r in results if name == "all" or r["replica"] == name]
        rows[name] = {
            "requests": len(mine),
            "prompt_tokens": sum(r["prompt_tokens"] for r in mine),
            "cached_tokens": sum(r["cached_tokens"] for r in mine),
            "ttft_p50_ms": statistics.median(r["ttft_ms"] for r in mine) if mine else 0.0,
            "ttft_p95_ms": stack.percentile([r["ttft_ms"] for r in mine], 0.95) or 0.0,
        }
    return rows


def spread(rows):
    """Requests on the busiest replica over the mean per replica (1.00: even)."""
    counts = [row["requests"] for name, row in rows.items() if name not in ("all", "envoy_retries")]
    counts += [0] * (REPLICAS - len(counts))  # a replica that served nothing has no row
    return max(counts) / (sum(counts) / len(counts)) if counts else 0.0


def print_table(phases):
    print("\n| routing | replica | requests | prompt tokens | cached prompt tokens | cached | TTFT p50 (ms) "
          "| TTFT p95 (ms) |")
    print("|---|---|---|---|---|---|---|---|")
    for label, rows in phases.items():
        for name, row in rows.items():
            if name == "envoy_retries":
                continue
            share = row["cached_tokens"] / row["prompt_tokens"] if row["prompt_tokens"] else 0.0
            bold = "**" if name == "all" else ""
            print(f"| {label} | {bold}{name}{bold} | {row['requests']} | {row['prompt_tokens']:,} | "
                  f"{row['cached_tokens']:,} | {share:.0%} | {row['ttft_p50_ms']:.0f} | {row['ttft_p95_ms']:.0f} |")
    (label, cohort), (_, rr) = list(phases.items())
    (a, b) = (cohort["all"], rr["all"])
    print(f"\n{label}: {a['cached_tokens']:,} cached prompt tokens vs {b['cached_tokens']:,} with round-robin "
          f"({a['cached_tokens'] / max(b['cached_tokens'], 1):.2f}x); "
          f"TTFT p50 {a['ttft_p50_ms']:.0f} ms vs {b['ttft_p50_ms']:.0f} ms, "
          f"p95 {a['ttft_p95_ms']:.0f} ms vs {b['ttft_p95_ms']:.0f} ms; "
          f"requests per replica max/mean {spread(cohort):.2f} vs {spread(rr):.2f}")
    print("requests Envoy retried after an engine closed the connection before answering: "
          f"{cohort['envoy_retries']} ({label}), {rr['envoy_retries']} (round-robin)")


def main():
    parser = argparse.ArgumentParser(prog="demo", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--mode", choices=["affinity", "assign"], default="assign",
                        help="Cohort's mode: assign (the batcher decides on prefixes and live load) "
                             "or affinity (ring hash with bounded load on x-cohort-key, no batcher)")
    parser.add_argument("--prefetch", choices=["high", "medium", "low", "none"],
                        help="assign mode: the batcher's default prefetch level (its [knobs]; default medium)")
    parser.add_argument("--json", help="also write the per-replica numbers to this file")
    parser.add_argument("--records", help="also write every request's record (order, application, "
                        "replica, prompt and cached tokens, TTFT) of both phases to this file")
    args = parser.parse_args()
    global PREFETCH
    PREFETCH = args.prefetch
    for need in (LLAMA, ENVOY, MODEL, FILTER):
        if not os.path.exists(need):
            raise SystemExit(f"{need} missing: run scripts/setup")
    # Ctrl-C and SIGTERM both stop everything (SIGINT explicitly: a shell may have started
    # us with it ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    workdir = tempfile.mkdtemp(prefix="cohort-demo-")
    bodies = requests_to_replay(args.requests)
    phases, records = {}, {}
    try:
        for label, config_name in ((f"cohort {args.mode}", args.mode), ("round-robin", "round-robin")):
            phase = run_phase(label, config_name, bodies, args, workdir)
            phases[label] = summarise(phase)
            records[label] = phase[0]
    except KeyboardInterrupt:
        print("\ninterrupted; stopping replicas and Envoy", file=sys.stderr)
        return 130
    finally:
        stop_all()
    print_table(phases)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(phases, f, indent=2)
    if args.records:
        apps = {}
        for results in records.values():
            for i, (body, result) in enumerate(zip(bodies, results)):
                result["order"] = i
                result["app"] = apps.setdefault(body["messages"][0]["content"], len(apps))
        with open(args.records, "w") as f:
            json.dump(records, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
