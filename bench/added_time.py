#!/usr/bin/env python3
"""What the Cohort filter adds to time to first token on large bodies, on a quiet box.

One simulated replica (`cohort engine-sim`), Envoy round-robin and Envoy with the Cohort
filter (affinity), 60 sequential streamed requests per body size (3, 30, 100 KB). Per
config and size it prints the median of (client TTFT - the simulator's own TTFT) and the
median of Envoy's access-log stages (ms): request received, request sent upstream, first
response byte, whole exchange.

    .venv/bin/python bench/added_time.py [round-robin] [affinity]

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


def start_envoy(name, workdir, ports):
    """istio/envoy/<name>.yaml with an access log of the stages; returns (proc, listen, log)."""
    path, admin, listen = stack.envoy_config(name, workdir, ports)
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
    return stack.start_envoy(path, admin, os.path.join(workdir, f"{name}-envoy.log")), listen, log


def body(size, i, rng):
    text = f"conversation {i} " + " ".join(rng.choice(WORDS) for _ in range(size // 6))
    return {"model": "m", "messages": [{"role": "user", "content": text[:size]}], "max_tokens": 4,
            "stream": True, "stream_options": {"include_usage": True}}


def measure(name, workdir, ports):
    proc, listen, log = start_envoy(name, workdir, ports)
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
        stack.stop([proc])
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
    names = sys.argv[1:] or ["round-robin", "affinity"]
    workdir = tempfile.mkdtemp(prefix="cohort-added-")
    procs, ports = run.start_sim(workdir, 1, 0.003, 20480, "sim")
    try:
        for name in names:
            measure(name, workdir, ports)
    finally:
        stack.stop(procs)


if __name__ == "__main__":
    main()
