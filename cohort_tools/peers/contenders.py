"""The ten routers the peer benchmark compares, each started fresh in front of a given list of
engine replica ports (2, 3, 4 or 8 of them) and stopped after its run.

  envoy-rr              Envoy round-robin (istio/envoy/round-robin.yaml): the baseline
  envoy-ringhash        Envoy ring hash on the client's `x-prefix-hash` header
                        (istio/envoy/ring-hash-prefix.yaml): what a user does without Cohort
  sglang-cache-aware    sglang-router 0.3.2, --policy cache_aware
  vllm-cache-aware      vllm-router 0.1.17, --policy cache_aware
  vllm-consistent-hash  vllm-router 0.1.17, --policy consistent_hash
  cohort-affinity       Envoy + the Cohort filter, ring hash on x-cohort-key (affinity.yaml)
  cohort-assign         Envoy + the filter asking `cohort serve` for a replica (assign.yaml)
  cohort-batch          Envoy + the filter + `cohort serve` with its HTTP front (batch.yaml),
                        wired as scripts/bench-batch and tests/tests/e2e/batch_llama.rs wire it
  cohort-epp            Envoy without the filter: ext_proc to `cohort serve`'s endpoint picker,
                        override_host over the replicas (endpoint-picker.yaml, full-duplex body);
                        decides with the batcher's modelled residency ("Cohort modelled")
  cohort-epp-events     cohort-epp with each replica's KV events followed (`[[replicas]]
                        kv_events`, `kv_events_replay`) and `[kv_events] prompt_tokens` set
                        ("engine-sim" for the simulator, "model" with the model's tokenizer
                        folder for vLLM): decides with the residency the engines publish
                        ("Cohort with events"); the engines must run with events on

Envoy configs come from cohort_tools.envoy_config, which rewrites the endpoint lists and the
per-replica routes and clusters for N replicas. The peers' quirks (see
docs/BENCHMARKS.md): both Rust routers answer /health before their workers are registered, so
start() polls /workers until every replica is listed; a fresh router per run, because their
prefix trees and load counters carry over otherwise.

    c = start("envoy-rr", [port, ...], workdir, engine="sim")
    c = start("cohort-epp-events", ports, workdir, engine="sim",
              events=Events([(pub, replay), ...], "engine-sim", block_size=16))
    c.port          # where clients send
    c.replica_names # {"127.0.0.1:PORT": "replica-i"} for x-served-by
    c.stop()
"""
import json
import os
import time

from cohort_tools import envoy_config, stack

NAMES = ("envoy-rr", "envoy-ringhash", "sglang-cache-aware", "vllm-cache-aware", "vllm-consistent-hash",
         "cohort-affinity", "cohort-assign", "cohort-batch", "cohort-epp", "cohort-epp-events")
# Contenders that need the engines to publish their KV cache events.
NEEDS_EVENTS = ("cohort-epp-events",)
ENVOY_CONFIGS = {"envoy-rr": "round-robin", "envoy-ringhash": "ring-hash-prefix", "cohort-affinity": "affinity"}
VERSIONS = {"sglang-router": "0.3.2", "vllm-router": "0.1.17", "envoy": "1.40.0"}
VENV = os.path.join(stack.ROOT, ".venv/bin")
# As scripts/bench-batch and tests/tests/e2e/batch_llama.rs: a generous assign deadline, because
# the batcher shares two busy cores with the engines (the deadline is a ceiling, not a delay).
ASSIGN_FILTER = '{"mode": "assign", "assign_deadline_ms": 250, "batcher_clusters": ["cohort-batcher-0"]}'
BATCH_FILTER = '{"mode": "batch", "assign_deadline_ms": 250, "batcher_clusters": ["cohort-batcher-0"]}'


class Events:
    """What cohort-epp-events is told of the engines' KV events: per replica (in port order)
    the PUB and replay endpoints (`tcp://127.0.0.1:PORT`), how the batcher turns a request
    into the engine's token ids (`prompt_tokens`: "engine-sim" or "model"), the engines'
    block size in tokens and, for "model", the folder with tokenizer.json,
    tokenizer_config.json and chat_template.jinja."""

    def __init__(self, endpoints, prompt_tokens, block_size=16, model_dir=None):
        self.endpoints = list(endpoints)
        self.prompt_tokens, self.block_size, self.model_dir = prompt_tokens, block_size, model_dir


class Contender:
    def __init__(self, name, port, procs, replica_names, admin=None, metrics_port=None):
        self.name, self.port, self.procs = name, port, procs
        self.replica_names = replica_names
        self.admin, self.metrics_port = admin, metrics_port

    def stop(self):
        stack.stop(self.procs)


def _workers_listed(body, count):
    """True once GET /workers lists `count` workers (both routers answer /health before their
    workers register; sglang-router and vllm-router shape the list differently)."""
    data = json.loads(body)
    workers = data.get("workers", data) if isinstance(data, dict) else data
    urls = data.get("urls") if isinstance(data, dict) else None
    n = len(urls) if isinstance(urls, list) else (len(workers) if isinstance(workers, list) else 0)
    if isinstance(data, dict) and "total" in data and not n:
        n = data["total"]
    return n >= count


def _engine_spec(engine):
    # The sim speaks vLLM's /metrics; llama-server is the front's default adapter.
    return "vllm+" if engine in ("sim", "vllm") else ""


def _batcher_config(workdir, name, cache_bytes):
    """`cohort serve --config` telling the policy each replica's prefix-cache size (in the
    filter's 256-byte blocks), as an operator configures it for their engines; None when unknown."""
    if not cache_bytes:
        return []
    path = os.path.join(workdir, f"{name}-serve.toml")
    with open(path, "w") as f:
        f.write(f"[policy]\nkv_blocks_per_replica = {max(1, cache_bytes // 256)}\n")
    return ["--config", path]


def picker_toml(cache_bytes, replica_ports=None, engine_spec="", events=None):
    """The text of `cohort serve --config` for the endpoint picker: the assign deadline the
    filter gets (ASSIGN_FILTER), the replicas' cache size as _batcher_config gives it and,
    with `events`, the `[kv_events]` section and one `[[replicas]]` per port with its
    endpoints (the replicas then come from the file, not from `--replica`)."""
    lines = ["[picker]", "assign_deadline_ms = 250"]
    if cache_bytes:
        lines += ["[policy]", f"kv_blocks_per_replica = {max(1, cache_bytes // 256)}"]
    if events is not None:
        if len(events.endpoints) != len(replica_ports):
            raise SystemExit(f"{len(events.endpoints)} KV events endpoints for {len(replica_ports)} replicas")
        lines += ["[kv_events]", f"block_size = {events.block_size}",
                  f"prompt_tokens = {json.dumps(events.prompt_tokens)}",
                  # A replica that served nothing for a while publishes nothing: not a fault here.
                  "silence_s = 3600"]
        if events.model_dir:
            lines.append(f"model_dir = {json.dumps(events.model_dir)}")
        engine = engine_spec.rstrip("+")
        for i, (port, (pub, replay)) in enumerate(zip(replica_ports, events.endpoints)):
            lines += ["[[replicas]]", f'name = "replica-{i}"', f'url = "http://127.0.0.1:{port}"']
            if engine:
                lines.append(f'engine = "{engine}"')
            lines.append(f'kv_events = "{pub}"')
            if replay:
                lines.append(f'kv_events_replay = "{replay}"')
    return "\n".join(lines) + "\n"


def _picker_config(workdir, name, cache_bytes, replica_ports=None, engine_spec="", events=None):
    """`cohort serve --config` for the endpoint picker (picker_toml), written under workdir."""
    path = os.path.join(workdir, f"{name}-serve.toml")
    with open(path, "w") as f:
        f.write(picker_toml(cache_bytes, replica_ports, engine_spec, events))
    return ["--config", path]


def start(name, replica_ports, workdir, engine="sim", cache_bytes=None, events=None):
    """Starts contender `name` in front of 127.0.0.1:replica_ports; returns a Contender once it
    routes (Envoy ready, batcher ready, every worker registered). `cache_bytes`: each replica's
    prefix-cache capacity in prompt bytes, for the batcher's policy (Cohort assign and batch).
    `events` (an Events): the engines' KV events, which cohort-epp-events needs."""
    names = {f"127.0.0.1:{p}": f"replica-{i}" for i, p in enumerate(replica_ports)}
    log = lambda what: os.path.join(workdir, f"{name}-{what}.log")  # noqa: E731
    urls = [f"http://127.0.0.1:{p}" for p in replica_ports]
    if name in ENVOY_CONFIGS:
        envoy, admin, listen = envoy_config.start(ENVOY_CONFIGS[name], workdir, replica_ports, label=f"{name}-envoy")
        return Contender(name, listen, [envoy], names, admin=admin)
    if name in ("cohort-assign", "cohort-batch"):
        batch = name == "cohort-batch"
        spec = _engine_spec(engine) if batch else ""
        cohort, ports = stack.start_cohort(workdir, replica_ports, prefix=name, front=batch, replica_spec=spec,
                                           extra_args=_batcher_config(workdir, name, cache_bytes))
        mapping = {50051: ports["grpc"], 50052: ports["grpc"]}
        if batch:
            mapping[8000] = ports["front"]
        envoy, admin, listen = envoy_config.start("batch" if batch else "assign", workdir, replica_ports,
                                                  label=f"{name}-envoy", ports=mapping,
                                                  filter_config=BATCH_FILTER if batch else ASSIGN_FILTER)
        if batch:
            # The front probes each replica once a second (slot counts, health) before it batches.
            time.sleep(2.0)
        return Contender(name, listen, [envoy, cohort], names, admin=admin, metrics_port=ports["http"])
    if name in ("cohort-epp", "cohort-epp-events"):
        # Simulated replicas are named without an adapter (llama.cpp's, the default), vLLM's with theirs.
        spec = "vllm+" if engine == "vllm" else ""
        if name == "cohort-epp-events" and events is None:
            raise SystemExit("cohort-epp-events needs the engines started with KV events")
        use = events if name == "cohort-epp-events" else None
        cohort, ports = stack.start_cohort(workdir, replica_ports, prefix=name, front=False, picker=True,
                                           replica_spec=spec, replica_flag=use is None,
                                           extra_args=_picker_config(workdir, name, cache_bytes, replica_ports,
                                                                     spec, use))
        envoy, admin, listen = envoy_config.start("endpoint-picker", workdir, replica_ports, label=f"{name}-envoy",
                                                  ports={9002: ports["picker"]})
        return Contender(name, listen, [envoy, cohort], names, admin=admin, metrics_port=ports["http"])
    if name not in ("sglang-cache-aware", "vllm-cache-aware", "vllm-consistent-hash"):
        raise SystemExit(f"unknown contender {name!r}; known: {', '.join(NAMES)}")

    def router():
        port, prom = stack.free_port(), stack.free_port()
        if name == "sglang-cache-aware":
            args = [os.path.join(VENV, "python"), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                    "--port", str(port), "--worker-urls", *urls, "--policy", "cache_aware",
                    "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom), "--log-level", "warn"]
        else:
            policy = "cache_aware" if name == "vllm-cache-aware" else "consistent_hash"
            args = [os.path.join(VENV, "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
                    "--worker-urls", *urls, "--policy", policy, "--prometheus-host", "127.0.0.1",
                    "--prometheus-port", str(prom), "--log-level", "warning"]
        proc = stack.spawn(args, log("router"))
        stack.wait_http(port, "/health", proc, name, timeout=60)
        stack.wait_http(port, "/workers", proc, f"{name}: workers", timeout=60,
                        ready=lambda body: _workers_listed(body, len(replica_ports)))
        return Contender(name, port, [proc], names, metrics_port=prom)

    return stack.on_free_ports(router)
