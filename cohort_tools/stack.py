"""Processes, ports and numbers shared by the live scripts and the benchmarks.

Starts and stops the real parts of a Cohort stack on loopback ports: llama-server replicas,
`cohort serve` (batcher, HTTP front) and Envoy (on a config file; cohort_tools.envoy_config
writes them from istio/envoy/*.yaml); picks the ports they listen on (`free_port`) and
starts a child again on other ports when one was taken meanwhile (`on_free_ports`); a
streaming chat client that measures the time to first token and reads the engine's usage;
Prometheus pages; and the one `percentile` every table uses. Python 3 standard library
only.

    from cohort_tools import stack
"""
import http.client
import itertools
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, ".cohort/bin")
LLAMA = os.path.join(BIN, "llama-server")
ENVOY = os.environ.get("COHORT_ENVOY", os.path.join(BIN, "envoy"))
MODEL = os.path.join(ROOT, ".cohort/models/gemma-3-270m-q4_k_m.gguf")
TEMPLATE = os.path.join(ROOT, "data/engines/gemma_chat_template.jinja")
# The built filter: COHORT_FILTER_WASM, else target/wasm/cohort_filter.wasm (as tests/src/config.rs).
FILTER = os.environ.get("COHORT_FILTER_WASM", os.path.join(ROOT, "target/wasm/cohort_filter.wasm"))
# The batcher built from this checkout: COHORT_BIN (scripts/test sets it to the test build's
# target/debug/cohort), else the release build (`cargo build --release -p cohort-cli`), not
# the copy scripts/setup installed, which may be stale.
COHORT = os.environ.get("COHORT_BIN") or os.path.join(ROOT, "target/release/cohort")

children = []

# Ports come from below the kernel's ephemeral range, never from bind(0): ephemeral ports are
# also the source ports of outgoing connections, so a port learnt from bind(0) can be taken
# by an Envoy, batcher or engine connection before the server binds it. Handed out in turn
# from a per-process start (as tests/src/lib.rs's free_port), each checked free first.
_LOWEST_PORT = 10_000
_next_port = itertools.count()


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768
    return low if low > _LOWEST_PORT + 1_000 else 32_768


def free_port():
    """A TCP port free on loopback at the time of the call, for a server about to start:
    the next of this process's turn below the ephemeral range that binds."""
    ephemeral_low = _ephemeral_low()
    span = ephemeral_low - _LOWEST_PORT
    start = os.getpid() * 7_919 % span
    for _ in range(span):
        port = _LOWEST_PORT + (start + next(_next_port)) % span
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise SystemExit(f"no free loopback port between {_LOWEST_PORT} and {ephemeral_low}")


def free_port_run(count):
    """The first of `count` consecutive TCP ports free on loopback (for a server that binds
    BASE, BASE + 1, …, as `cohort engine-sim serve --kv-events-port BASE` does)."""
    for _ in range(200):
        base = free_port()
        if base + count >= _ephemeral_low():
            continue
        free = True
        for port in range(base + 1, base + count):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    free = False
                    break
        if free:
            for _ in range(count - 1):
                next(_next_port)  # this process's later free_port() calls skip the run
            return base
    raise SystemExit(f"no {count} consecutive free loopback ports")


class PortTaken(SystemExit):
    """A child exited because a port picked for it was taken before it could bind it."""


# What Envoy, `cohort serve`, llama-server and the Rust routers log when a port is taken.
_BIND_FAILED = re.compile(r"address already in use|addrinuse|os error 98|couldn't bind|cannot bind|failed to bind",
                          re.IGNORECASE)


def _bind_failed(proc):
    log = getattr(proc, "log", None)
    if not log:
        return False
    try:
        with open(log, errors="replace") as f:
            return bool(_BIND_FAILED.search(f.read()))
    except OSError:
        return False


def on_free_ports(start, attempts=3):
    """Calls `start()` (which picks its ports with free_port() and waits for its child) again,
    up to `attempts` times in all, while the child fails to bind a port; returns what it returns."""
    for attempt in range(1, attempts + 1):
        try:
            return start()
        except PortTaken as e:
            if attempt == attempts:
                raise
            print(f"{e}; starting it again on other ports", file=sys.stderr)


def spawn(args, log, env=None):
    """Starts a child in its own session (stdout discarded, stderr to `log`); stop_all() stops it."""
    with open(log, "w") as err:  # the child keeps its own descriptor
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
    proc.log = log
    children.append(proc)
    return proc


def stop(procs, grace=10):
    """SIGTERM to these children, SIGKILL after `grace` s; they leave the list stop_all() stops."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.time() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc in children:
            children.remove(proc)


def stop_all():
    """SIGTERM to every child started here, SIGKILL after 10 s."""
    stop(children)


def get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def wait_http(port, path, proc, what, timeout=60, ready=None):
    """Polls GET `path` until it answers 200 (and `ready(body)` is true, when given); exits
    if `proc` ends first (PortTaken when it could not bind its port) or after `timeout` s."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            if _bind_failed(proc):
                raise PortTaken(f"{what} exited with {proc.returncode}: a port was taken (see {proc.log})")
            raise SystemExit(f"{what} exited with {proc.returncode}")
        try:
            status, body = get(port, path)
            if status == 200 and (ready is None or ready(body)):
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise SystemExit(f"{what} not ready after {timeout} s")


def start_llama(log, slots=4, ctx=8192, port=None):
    """Starts one llama-server replica (Gemma 3 270M) with `slots` slots and no host-RAM prompt
    cache (a prefix is reused only from the slot that computed it), `--swa-full` so any shared
    prefix is reusable, `--metrics`. Returns (proc, port); wait for it with wait_http(port, "/health", …)."""
    port = port or free_port()
    proc = spawn([LLAMA, "-m", MODEL, "--host", "127.0.0.1", "--port", str(port), "-c", str(ctx),
                  "-np", str(slots), "-t", "1", "--cache-ram", "0", "--swa-full", "--metrics",
                  "--chat-template-file", TEMPLATE, "-a", "gemma-3-270m"], log)
    return proc, port


def start_replicas(workdir, prefix, count=3, slots=4, ctx=8192):
    """`count` fresh replicas, healthy (started together, each again on another port if its
    port was taken). Returns (procs, ports)."""
    logs = [os.path.join(workdir, f"{prefix}-replica{i}.log") for i in range(count)]

    def healthy(started):
        wait_http(started[1], "/health", started[0], "llama-server")
        return started

    started = [start_llama(log, slots, ctx) for log in logs]
    for i, log in enumerate(logs):
        try:
            healthy(started[i])
        except PortTaken as e:
            print(f"{e}; starting it again on another port", file=sys.stderr)
            started[i] = on_free_ports(lambda log=log: healthy(start_llama(log, slots, ctx)))
    return [p for p, _ in started], [port for _, port in started]


def start_envoy(config, admin, log, workers=None):
    """Starts Envoy on a config file whose admin listens on `admin` and waits until it says
    ready. One worker thread unless `workers`, else COHORT_ENVOY_WORKERS, says how many.
    ENVOY is .cohort/bin/envoy unless COHORT_ENVOY names another binary."""
    workers = str(workers or os.environ.get("COHORT_ENVOY_WORKERS", "1"))
    envoy = spawn([ENVOY, "-c", config, "--use-dynamic-base-id", "--concurrency", workers, "-l", "error"], log)
    wait_http(admin, "/ready", envoy, "envoy")
    return envoy


def start_envoy_on_free_ports(workdir, label, make_config, workers=None):
    """Starts Envoy on the YAML text `make_config(admin, listen)` returns for two free ports,
    written to `workdir/<label>.yaml` (its log: `<label>.log`); again on other ports while
    one is taken. Returns (proc, admin, listen)."""
    def attempt():
        admin, listen = free_port(), free_port()
        path = os.path.join(workdir, label + ".yaml")
        with open(path, "w") as f:
            f.write(make_config(admin, listen))
        return start_envoy(path, admin, os.path.join(workdir, label + ".log"), workers), admin, listen

    return on_free_ports(attempt)


def start_cohort(workdir, replica_ports, prefix="cohort", front=True, extra_args=(), replica_spec="", binary=None,
                 picker=False, replica_flag=True):
    """Starts `cohort serve` (`binary`, else COHORT) with replicas
    replica-0..N-1 at the given ports and, with `front`, batch mode's HTTP front; with
    `picker`, its endpoint picker (Envoy ext_proc) on ports["picker"].
    `replica_spec` is the engine adapter prefix of each replica's URL ("vllm+"; "" =
    llama.cpp). Without `replica_flag` no `--replica` is passed: the replicas are the
    `[[replicas]]` of the config file in `extra_args` (a flag would replace them).
    Waits for /readyz (again on other ports while one is taken).
    Returns (proc, {"grpc": p, "http": p, "front": p or None, "picker": p or None})."""
    replicas = ",".join(f"replica-{i}={replica_spec}http://127.0.0.1:{p}" for i, p in enumerate(replica_ports))
    env = dict(os.environ)
    env.pop("COHORT_CONFIG", None)

    def attempt():
        ports = {"grpc": free_port(), "http": free_port(), "front": free_port()}
        # Replicas with URLs turn the front on; without --front-listen it would take its default
        # 0.0.0.0:8000. It always gets a free loopback port; without `front` nothing routes to it.
        args = [binary or COHORT, "serve", "--grpc-listen", f"127.0.0.1:{ports['grpc']}",
                "--http-listen", f"127.0.0.1:{ports['http']}", "--front-listen", f"127.0.0.1:{ports['front']}"]
        if replica_flag:
            args += ["--replica", replicas]
        if not front:
            ports["front"] = None
        ports["picker"] = None
        if picker:
            ports["picker"] = free_port()
            args += ["--picker-listen", f"127.0.0.1:{ports['picker']}"]
        proc = spawn(args + list(extra_args), os.path.join(workdir, f"{prefix}-serve.log"), env=env)
        wait_http(ports["http"], "/readyz", proc, "cohort serve", timeout=20)
        return proc, ports

    return on_free_ports(attempt)


def metrics(port, path="/metrics"):
    """A Prometheus page as text ('' when it cannot be read)."""
    try:
        status, body = get(port, path)
    except OSError:
        return ""
    return body.decode("utf-8", "replace") if status == 200 else ""


def metric(text, name, labels=None):
    """Sum of the samples of `name` in a Prometheus page; with `labels` ({"role": "leader"})
    only the samples carrying those label values."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        rest = line[len(name):]
        if rest[:1] not in ("{", " "):
            continue
        series, _, value = line.rpartition(" ")
        if labels and not all(f'{k}="{v}"' in series for k, v in labels.items()):
            continue
        try:
            total += float(value)
        except ValueError:
            pass
    return total


def engine_tokens(port):
    """(prompt tokens computed, prompt tokens cached) from one llama-server's /metrics."""
    page = metrics(port)
    return metric(page, "llamacpp:prompt_tokens_total"), metric(page, "llamacpp:prompt_tokens_cached_total")


def stream_chat(port, body, headers=None, timeout=300):
    """Streams one chat completion through `port`; returns the upstream that answered
    (`x-served-by`), the batch front's tag (`x-cohort-batch`), TTFT (first SSE data event) and
    the engine's prompt and cached tokens. Raises RuntimeError on a non-200 answer."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        all_headers = {"content-type": "application/json"}
        all_headers.update(headers or {})
        conn.request("POST", "/v1/chat/completions", json.dumps(body), all_headers)
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"status {response.status}: {response.read()[:200]!r}")
        replica = response.getheader("x-served-by", "?")
        batch = response.getheader("x-cohort-batch", "")
        ttft, prompt, cached, completion, done = None, 0, 0, 0, False
        for raw in response:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            if ttft is None:
                ttft = time.perf_counter() - started
            chunk = json.loads(line[5:])
            usage = chunk.get("usage") or {}
            timings = chunk.get("timings") or {}
            if usage:
                prompt = usage.get("prompt_tokens", prompt)
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", cached)
                completion = usage.get("completion_tokens", completion)
            if "cache_n" in timings:
                cached = timings["cache_n"]
                prompt = timings.get("cache_n", 0) + timings.get("prompt_n", 0)
    finally:
        conn.close()
    return {"replica": replica, "batch": batch, "ttft_ms": (ttft or 0) * 1000, "prompt_tokens": prompt,
            "cached_tokens": cached, "completion_tokens": completion, "done": done,
            "total_ms": (time.perf_counter() - started) * 1000}


def percentile(values, q, interpolate=False):
    """The q-quantile (q in 0-1) of `values`, None entries left out; None when none is left.
    Nearest rank (rank q × (n - 1), rounded) unless `interpolate`: then linear interpolation
    between the two closest ranks (numpy's default)."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    if not interpolate:
        return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
