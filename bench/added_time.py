#!/usr/bin/env python3
"""What the Cohort filter adds to time to first token on large bodies, on a quiet box.

One simulated replica (`cohort engine-sim`), Envoy round-robin, Envoy with the Cohort filter
(affinity) and Envoy with the filter asking `cohort serve` (assign), 60 sequential streamed
requests per body size (3, 30, 100 KB). Per
config and size it prints the median of (client TTFT - the simulator's own TTFT) and the
median of Envoy's access-log stages (ms): request received, request sent upstream, first
response byte, whole exchange.

    .venv/bin/python bench/added_time.py [round-robin] [affinity] [assign]

Needs scripts/setup, scripts/build-wasm and target/release/cohort.
"""
import asyncio
import os
import random
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "bench", "peers"))
import client  # noqa: E402  (bench/peers/client.py: the streaming client)
import run  # noqa: E402  (bench/peers/run.py: the simulator)
import stack  # noqa: E402  (scripts/stack.py: processes and Envoy configs)

SIZES = (3_000, 30_000, 100_000)
REQUESTS = 60
STAGES = "%REQUEST_DURATION% %REQUEST_TX_DURATION% %RESPONSE_DURATION% %DURATION% %REQ(content-length)%"
WORDS = ["alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta"]


ASSIGN_FILTER = '{"mode": "assign", "assign_deadline_ms": 250, "batcher_clusters": ["cohort-batcher-0"]}'


def start_envoy(name, workdir, ports):
    """istio/envoy/<name>.yaml with an access log of the stages (for `assign`, with `cohort
    serve` deciding); returns (procs, listen, log)."""
    procs, mapping, filter_config = [], {}, None
    if name == "assign":
        cohort, cports = stack.start_cohort(workdir, ports, prefix="added", front=False, replica_spec="vllm+")
        procs.append(cohort)
        mapping = {50051: cports["grpc"], 50052: cports["grpc"]}
        filter_config = ASSIGN_FILTER
    path, admin, listen = stack.envoy_config(name, workdir, ports, ports=mapping, filter_config=filter_config)
    log = os.path.join(workdir, f"{name}-access.log")
    access_log = ("          access_log:\n          - name: envoy.access_loggers.file\n"
                  "            typed_config:\n"
                  "              \"@type\": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog\n"
                  f"              path: {log}\n"
                  f"              log_format: {{ text_format_source: {{ inline_string: \"{STAGES}\\n\" }} }}\n")
    with open(path) as f:
        text = f.read().replace("          stat_prefix: ", access_log + "          stat_prefix: ", 1)
    with open(path, "w") as f:
        f.write(text)
    procs.append(stack.start_envoy(path, admin, os.path.join(workdir, f"{name}-envoy.log")))
    return procs, listen, log


def body(size, i, rng):
    text = f"conversation {i} " + " ".join(rng.choice(WORDS) for _ in range(size // 6))
    return {"model": "m", "messages": [{"role": "user", "content": text[:size]}], "max_tokens": 4,
            "stream": True, "stream_options": {"include_usage": True}}


def measure(name, workdir, ports):
    procs, listen, log = start_envoy(name, workdir, ports)
    rng = random.Random(1)
    try:
        for size in SIZES:
            added = []
            for i in range(REQUESTS):
                record = asyncio.run(client.send(listen, {"body": body(size, i, rng)}))
                if record["error"] is None and record["engine_ttft_ms"] is not None:
                    added.append(record["ttft_ms"] - record["engine_ttft_ms"])
            print(f"{name:12} {size // 1000:>4} KB  added median {statistics.median(added):6.2f} ms"
                  f"  ({len(added)} of {REQUESTS} ok)")
    finally:
        stack.stop(procs)
    stages = {}
    with open(log) as f:
        for line in f:
            fields = line.split()
            try:
                stages.setdefault(int(fields[4]) // 10_000, []).append([float(x) for x in fields[:4]])
            except (ValueError, IndexError):
                pass
    for bucket, rows in sorted(stages.items()):
        medians = [statistics.median(r[j] for r in rows) for j in range(4)]
        print(f"{name:12} ~{bucket * 10:>3} KB  Envoy stages (median ms): request received {medians[0]:.0f}, "
              f"sent upstream {medians[1]:.0f}, first response byte {medians[2]:.0f}, whole {medians[3]:.0f}")


def main():
    names = sys.argv[1:] or ["round-robin", "affinity", "assign"]
    workdir = tempfile.mkdtemp(prefix="cohort-added-")
    procs, ports = run.start_sim(workdir, 1, 0.003, 20480, "sim")
    try:
        for name in names:
            measure(name, workdir, ports)
    finally:
        stack.stop(procs)


if __name__ == "__main__":
    main()
