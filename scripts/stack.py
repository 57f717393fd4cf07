"""Shared helpers for the live scripts (scripts/demo, scripts/bench-batch, scripts/bench-prefetch).

Starts and stops the real parts of a Cohort stack on loopback ports: llama-server replicas,
`cohort serve` (batcher, HTTP front), Envoy from one of istio/envoy/*.yaml with its ports
rewritten; and a streaming chat client that measures the time to first token and reads the
engine's usage. Python 3 standard library only.

    sys.path.insert(0, os.path.dirname(__file__))
    import stack
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, ".cohort/bin")
LLAMA = os.path.join(BIN, "llama-server")
ENVOY = os.path.join(BIN, "envoy")
MODEL = os.path.join(ROOT, ".cohort/models/gemma-3-270m-q4_k_m.gguf")
TEMPLATE = os.path.join(ROOT, "data/engines/gemma_chat_template.jinja")
FILTER = os.path.join(ROOT, "target/wasm/cohort_filter.wasm")
# The batcher built from this checkout (`cargo build --release -p cohort-cli`), not the
# copy scripts/setup installed, which may be stale.
COHORT = os.path.join(ROOT, "target/release/cohort")

# The default engine ports in istio/envoy/*.yaml, in replica order.
DEFAULT_REPLICA_PORTS = (8081, 8082, 8083)

children = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(args, log, env=None):
    """Starts a child in its own session (stdout discarded, stderr to `log`); stop_all() stops it."""
    with open(log, "w") as err:  # the child keeps its own descriptor
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
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
    if `proc` ends first or after `timeout` s."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
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
    """`count` fresh replicas, healthy. Returns (procs, ports)."""
    started = [start_llama(os.path.join(workdir, f"{prefix}-replica{i}.log"), slots, ctx) for i in range(count)]
    for proc, port in started:
        wait_http(port, "/health", proc, "llama-server")
    return [p for p, _ in started], [port for _, port in started]


def _replica_placeholder(i):
    return f"@REPLICA{i}@"


_ENDPOINT = r"- endpoint: \{ address: \{ socket_address: \{ address: 127\.0\.0\.1, port_value: %s \} \} \}\n"


def expand_replicas(text, count):
    """Rewrites a config written for the three default engine ports (8081-8083) for `count`
    replicas, leaving a placeholder (_replica_placeholder(i)) where replica i's port goes:
    every endpoint list of the three becomes a list of `count`; the per-replica route
    (`assigned-replica-2`) and cluster (`replica-2`, `failover-replica-2`) blocks are repeated for replicas 3 and up
    (fewer than three replicas: the extra blocks and endpoints are dropped)."""
    if count < 1:
        raise SystemExit("envoy_config: at least one replica")
    # 1. Lists of all three endpoints (any indentation): one line per replica.
    group = re.compile(r"(?P<i>[ ]*)" + _ENDPOINT % 8081 + r"(?P=i)" + _ENDPOINT % 8082 + r"(?P=i)" + _ENDPOINT % 8083)

    def endpoints(m):
        line = m.group(0).splitlines(keepends=True)[0]
        return "".join(line.replace("port_value: 8081 ", f"port_value: {_replica_placeholder(i)} ") for i in range(count))

    text = group.sub(endpoints, text)

    # 2. Blocks that belong to one replica: `- name: assigned-replica-K` routes and
    # `- name: replica-K` clusters (the list item and every line indented deeper).
    def block(name):
        return re.compile(r"^(?P<i>[ ]*)- name: " + re.escape(name) + r"\n(?:(?P=i)  .*\n|\n)*", re.M)

    for kind in ("assigned-replica-", "failover-replica-", "replica-"):
        last = block(f"{kind}2").search(text)
        if last is None:
            continue
        extra = "".join(last.group(0).replace("replica-2", f"replica-{k}") for k in range(3, count))
        text = text[:last.end()] + extra + text[last.end():]
        for k in range(count, 3):
            text = block(f"{kind}{k}").sub("", text, count=1)
    # 3. What is left of the default ports is each per-replica cluster's single endpoint.
    return _number_single_endpoints(text)


def _number_single_endpoints(text):
    """The per-replica clusters still carry a default port (replica-K with K >= 3 carry
    8083, copied from replica-2): give each cluster `replica-K` its placeholder."""
    def one(m):
        k = int(m.group("k"))
        return re.sub(r"port_value: 808[123] ", f"port_value: {_replica_placeholder(k)} ", m.group(0))

    return re.sub(r"^(?P<i>[ ]*)- name: replica-(?P<k>\d+)\n(?:(?P=i)  .*\n|\n)*", one, text, flags=re.M)


def envoy_config(name, workdir, replica_ports, ports=None, filter_config=None, served_by=True):
    """Writes istio/envoy/<name>.yaml into `workdir` with free admin and listener ports, the
    engines' default ports (8081-8083) replaced by `replica_ports` everywhere they appear (every
    cluster that lists them), other ports replaced as `ports` maps them ({50051: grpc, 8000: front}),
    the built filter's absolute path, and optionally another filter configuration (JSON text).
    With `served_by`, responses carry `x-served-by: <upstream address>`. Returns (path, admin, listen)."""
    with open(os.path.join(ROOT, "istio/envoy", name + ".yaml")) as f:
        text = f.read()
    admin, listen = free_port(), free_port()
    text = re.sub(r"port_value: (9901|9902)\b", f"port_value: {admin}", text)
    text = re.sub(r"port_value: (10000|10001)\b", f"port_value: {listen}", text)
    text = expand_replicas(text, len(replica_ports))
    for i, port in enumerate(replica_ports):
        text = text.replace(f"port_value: {_replica_placeholder(i)} ", f"port_value: {port} ")
    for default, port in (ports or {}).items():
        text = re.sub(rf"port_value: {default}\b", f"port_value: {port}", text)
    text = text.replace("filename: target/wasm/cohort_filter.wasm", f"filename: {FILTER}")
    if filter_config is not None:
        text, n = re.subn(r"value: '\{.*\}'", lambda _: "value: '" + filter_config + "'", text, count=1)
        if n != 1:
            raise SystemExit(f"istio/envoy/{name}.yaml: no filter configuration to replace")
    if served_by:
        # Tell the client which upstream answered (for per-replica tables).
        text = text.replace('domains: ["*"]', 'domains: ["*"]\n              response_headers_to_add:\n'
                            '              - header: { key: x-served-by, value: "%UPSTREAM_REMOTE_ADDRESS%" }')
    path = os.path.join(workdir, name + ".yaml")
    with open(path, "w") as f:
        f.write(text)
    return path, admin, listen


def start_envoy(config, admin, log):
    """Starts Envoy on a config from envoy_config() and waits until its admin says ready.
    One worker thread unless COHORT_ENVOY_WORKERS says how many."""
    workers = os.environ.get("COHORT_ENVOY_WORKERS", "1")
    envoy = spawn([ENVOY, "-c", config, "--use-dynamic-base-id", "--concurrency", workers, "-l", "error"], log)
    wait_http(admin, "/ready", envoy, "envoy")
    return envoy


def start_cohort(workdir, replica_ports, prefix="cohort", front=True, extra_args=(), replica_spec=""):
    """Starts `cohort serve` (target/release/cohort) with replicas replica-0..N-1 at the given
    ports and, with `front`, batch mode's HTTP front. `replica_spec` is the engine adapter
    prefix of each replica's URL ("vllm+"; "" = llama.cpp). Waits for /readyz.
    Returns (proc, {"grpc": p, "http": p, "front": p or None})."""
    ports = {"grpc": free_port(), "http": free_port(), "front": free_port()}
    replicas = ",".join(f"replica-{i}={replica_spec}http://127.0.0.1:{p}" for i, p in enumerate(replica_ports))
    # Replicas with URLs turn the front on; without --front-listen it would take its default
    # 0.0.0.0:8000. It always gets a free loopback port; without `front` nothing routes to it.
    args = [COHORT, "serve", "--grpc-listen", f"127.0.0.1:{ports['grpc']}",
            "--http-listen", f"127.0.0.1:{ports['http']}", "--replica", replicas,
            "--front-listen", f"127.0.0.1:{ports['front']}"]
    if not front:
        ports["front"] = None
    env = dict(os.environ)
    env.pop("COHORT_CONFIG", None)
    proc = spawn(args + list(extra_args), os.path.join(workdir, f"{prefix}-serve.log"), env=env)
    wait_http(ports["http"], "/readyz", proc, "cohort serve", timeout=20)
    return proc, ports


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


def percentile(values, q):
    """Nearest-rank percentile (q in 0-1) of a list; 0.0 when empty."""
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] if values else 0.0
