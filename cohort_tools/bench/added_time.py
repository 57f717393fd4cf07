"""What the Cohort filter adds to time to first token on large bodies, on a quiet box.

One simulated replica (`cohort engine-sim`), Envoy round-robin, Envoy with the Cohort filter
(affinity) and Envoy with the filter asking `cohort serve` (assign), 60 sequential streamed
requests per body size (3, 30, 100 KB). Per
config and size it prints the median of (client TTFT - the simulator's own TTFT) and the
median of Envoy's access-log stages (ms): request received, request sent upstream, first
response byte, whole exchange.

    .venv/bin/python -m cohort_tools.bench.added_time [round-robin] [affinity] [assign]

`--burst K` measures what arrivals in bursts do instead (Mooncake's trace arrives so): four
simulated replicas, requests of `--size` bytes sent K at a time, `--rate` requests a second,
open loop, for `--seconds`; per config it prints the median added time and Envoy's medians of
the filter's fingerprint, sketch and Assign round trip. One Envoy worker runs the filter for
every request of a burst before it flushes any Assign, so a burst's fingerprints add to each
of its Assigns (docs/BENCHMARKS.md, "Where the added time goes"):

    .venv/bin/python -m cohort_tools.bench.added_time --burst 8 --rate 60 --size 12000 [names]

Names: round-robin, affinity, assign, floor-grpc (the wasm floor making one gRPC call
to `cohort serve` per request, bench/wasm-floor: the least a filter that asks a service
pays), epp (no filter: Envoy's ext_proc streaming each request to `cohort serve`'s
endpoint picker, istio/envoy/endpoint-picker.yaml), and epp-request-only (the same with
the response path off, `response_header_mode: SKIP`: what the picker's answer to the
response headers adds to the first byte), and epp-floor (the picker with every request in
the rollout's hold-out: it answers the headers at once with the least-loaded endpoint and
echoes the body, no fingerprint and no decision: what the ext_proc exchange itself costs).

Needs scripts/setup, scripts/build-wasm and target/release/cohort.
"""
import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time

from cohort_tools import envoy_config, stack
from cohort_tools.peers import client, run

SIZES = (3_000, 30_000, 100_000)
REQUESTS = 60
STAGES = "%REQUEST_DURATION% %REQUEST_TX_DURATION% %RESPONSE_DURATION% %DURATION% %REQ(content-length)%"
WORDS = ["alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta"]


ASSIGN_FILTER = '{"mode": "assign", "assign_deadline_ms": 250, "batcher_clusters": ["cohort-batcher-0"]}'
# `floor-grpc`: assign.yaml's Envoy with the wasm floor in place of the filter, reading the
# body and making one gRPC call to `cohort serve` per request (bench/wasm-floor): what any
# filter that asks a service per request pays, to set beside `assign`.
FLOOR = os.path.join(stack.ROOT, "target/wasm/cohort_wasm_floor.wasm")
FLOOR_GRPC = "body+grpc:cohort-batcher-0"


def start_envoy(name, workdir, ports):
    """istio/envoy/<name>.yaml with an access log of the stages (for `assign`, with `cohort
    serve` deciding); returns (procs, listen, log, admin, the picker's batcher metrics port
    or None)."""
    procs, mapping, filter_config, metrics_port = [], {}, None, None
    config_name = "endpoint-picker" if name.startswith("epp") else {"floor-grpc": "assign"}.get(name, name)
    if name.startswith("epp"):
        extra = []
        if name == "epp-floor":
            path = os.path.join(workdir, "epp-floor-filter.json")
            with open(path, "w") as f:
                f.write('{"rollout": {"share": 0}}')
            extra = ["--picker-filter-config", path]
        cohort, cports = stack.start_cohort(workdir, ports, prefix="added", front=False, replica_spec="vllm+",
                                            picker=True, extra_args=extra)
        procs.append(cohort)
        mapping = {9002: cports["picker"]}
        metrics_port = cports["http"]
    elif name in ("assign", "floor-grpc"):
        cohort, cports = stack.start_cohort(workdir, ports, prefix="added", front=False, replica_spec="vllm+")
        procs.append(cohort)
        mapping = {50051: cports["grpc"], 50052: cports["grpc"]}
        filter_config = ASSIGN_FILTER if name == "assign" else FLOOR_GRPC
    log = os.path.join(workdir, f"{name}-access.log")

    def access_log(doc):
        if name == "epp-request-only":
            for node in envoy_config.http_connection_manager(doc)["http_filters"]:
                if node["name"] == "envoy.filters.http.ext_proc":
                    node["typed_config"]["processing_mode"]["response_header_mode"] = "SKIP"
                    node["typed_config"]["processing_mode"]["response_trailer_mode"] = "SKIP"
        envoy_config.http_connection_manager(doc)["access_log"] = [{
            "name": "envoy.access_loggers.file",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": log,
                "log_format": {"text_format_source": {"inline_string": STAGES + "\n"}},
            },
        }]

    envoy, admin, listen = envoy_config.start(config_name, workdir, ports, label=f"{name}-envoy", edit=access_log,
                                              ports=mapping, filter_config=filter_config,
                                              wasm=FLOOR if name == "floor-grpc" else None)
    procs.append(envoy)
    return procs, listen, log, admin, metrics_port


def body(size, i, rng):
    text = f"conversation {i} " + " ".join(rng.choice(WORDS) for _ in range(size // 6))
    return {"model": "m", "messages": [{"role": "user", "content": text[:size]}], "max_tokens": 4,
            "stream": True, "stream_options": {"include_usage": True}}


def measure(name, workdir, ports):
    procs, listen, log, _admin, _metrics = start_envoy(name, workdir, ports)
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


def envoy_medians(admin):
    """Envoy's p50 of the filter's histograms (µs), by name; missing ones are left out."""
    _status, text = stack.get(admin, "/stats?filter=cohort_(fingerprint|sketch|assign)_us")
    medians = {}
    for line in text.decode().splitlines():
        name, _, values = line.partition(": ")
        if "P50(" in values:
            # P50(interval, cumulative): the cumulative one covers the whole run.
            cumulative = values.split("P50(")[1].split(")")[0].split(",")[1]
            if cumulative != "nan":
                medians[name.removeprefix("wasmcustom.cohort_")] = float(cumulative)
    return medians


def measure_bursts(name, workdir, ports, burst, rate, size, seconds):
    """Open-loop bursts of `burst` requests of `size` bytes at `rate` requests a second."""
    procs, listen, _log, admin, metrics_port = start_envoy(name, workdir, ports)
    rng = random.Random(1)
    requests = [{"body": dict(body(size, i, rng), max_tokens=16)} for i in range(int(rate * seconds))]

    async def replay():
        start, sent = time.perf_counter(), []
        for i, request in enumerate(requests):
            delay = start + (i // burst) * burst / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent.append(asyncio.create_task(client.send(listen, request)))
        return await asyncio.gather(*sent)

    try:
        records = asyncio.run(replay())
        medians = envoy_medians(admin)
        _status, calls = stack.get(admin, "/stats?filter=cluster.cohort-batcher-0.upstream_rq_completed")
        if metrics_port:
            # The picker's decision (fingerprint and the brain), mean over the run.
            page = stack.metrics(metrics_port)
            count = stack.metric(page, "cohort_picker_decision_seconds_count")
            if count:
                total = stack.metric(page, "cohort_picker_decision_seconds_sum")
                medians["picker_decision_mean_us"] = 1e6 * total / count
    finally:
        stack.stop(procs)
    added = [r["ttft_ms"] - r["engine_ttft_ms"] for r in records
             if r["error"] is None and r["engine_ttft_ms"] is not None]
    stages = "  ".join(f"{k} {v / 1000:.2f}" for k, v in sorted(medians.items()))
    calls = calls.decode().partition(": ")[2].strip()
    if calls:
        stages += f"  (gRPC calls to the batcher: {calls})"
    print(f"{name:12} burst {burst} at {rate:g}/s, {size // 1000} KB  added median "
          f"{statistics.median(added):6.2f} ms ({len(added)} of {len(records)} ok)  Envoy p50 ms: {stages}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", default=["round-robin", "affinity", "assign"])
    parser.add_argument("--burst", type=int, help="requests per burst (burst mode)")
    parser.add_argument("--rate", type=float, default=60.0, help="requests a second (burst mode)")
    parser.add_argument("--size", type=int, default=12_000, help="body bytes (burst mode)")
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds of arrivals (burst mode)")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="cohort-added-")
    procs, ports = run.start_sim(workdir, 4 if args.burst else 1, 0.003, 20480, "sim")
    try:
        for name in args.names:
            if args.burst:
                measure_bursts(name, workdir, ports, args.burst, args.rate, args.size, args.seconds)
            else:
                measure(name, workdir, ports)
    finally:
        stack.stop(procs)


if __name__ == "__main__":
    main()
