#!/usr/bin/env python3
"""Envoy + buffer filter vs Envoy + Cohort filter (affinity mode): what the filter costs.

Three Envoys on loopback, one worker each: an upstream (buffer filter + direct_response),
a baseline front (buffer filter -> router) and a Cohort front (cohort filter -> router).
wrk POSTs the same OpenAI chat body to each front in alternating runs (baseline, cohort,
baseline, ...), same connections, threads and duration; the table reports the medians
and the ratios. Bodies: 2 KB and 32 KB chat requests (system prompt, tools, turns).

Each row also gives the front Envoy's CPU time per request served (all its threads, from
/proc/<pid>/task/*/schedstat) and its difference to the baseline: on a 2-core machine where
wrk, the upstream and the front share the cores, rps ratios move with how the scheduler
shares them, while CPU per request is what the filter itself costs.

A second table measures the latency the filter adds below saturation: oha at a fixed rate
(--rate, default 500 requests/s) against each front, alternating, medians of p50 and p99.

  bench/filter_overhead.py [--duration 10] [--rounds 3] [--connections 16] [--rate 500]
                           [--sizes 2048,32768] [--compare-wasm OLD.wasm ...] [--floor]

--compare-wasm adds a front with another build of the filter (e.g. the main branch's,
copied aside before rebuilding), measured in the same alternating rounds: rows "before";
repeat it to compare several builds (rows named after the files).
--floor adds two fronts with `cohort_wasm_floor.wasm` (bench/wasm-floor), the least a
proxy-wasm filter can do: "wasm floor: no-op" (buffer filter + a wasm filter that only
answers Continue) and "wasm floor: read body" (pause, read the buffered body, write one
header, clear the route cache). They show what any wasm filter costs in this Envoy, apart
from Cohort's own work.

Needs scripts/setup (Envoy, wrk, the filter) and, for the fixed-rate table,
`cargo install oha`. Prints markdown tables.
"""
import argparse
import shutil
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENVOY = os.environ.get("COHORT_ENVOY", os.path.join(ROOT, ".cohort/bin/envoy"))
FILTER = os.environ.get("COHORT_FILTER_WASM", os.path.join(ROOT, "target/wasm/cohort_filter.wasm"))
FLOOR = os.path.join(ROOT, "target/wasm/cohort_wasm_floor.wasm")

BUFFER = """
          - name: envoy.filters.http.buffer
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer
              max_request_bytes: 2097152"""

COHORT = """
          - name: cohort
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: cohort
                root_id: cohort
                allow_on_headers_stop_iteration: true
                failure_policy: FAIL_OPEN
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: '{plugin}'
                vm_config:
                  vm_id: cohort
                  runtime: envoy.wasm.runtime.v8
                  code: {{ local: {{ filename: {wasm} }} }}"""

TEMPLATE = """
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }}
static_resources:
  listeners:
  - name: l
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    per_connection_buffer_limit_bytes: 8388608
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: l
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                {route}
          http_filters:{filters}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    type: STATIC
    connect_timeout: 1s
    lb_policy: RING_HASH
    load_assignment:
      cluster_name: upstream
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {upstream} }} }} }}
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chat_body(target):
    system = ("You are a support agent for an online bank. Answer briefly, ask for the account "
              "number only when needed, and escalate fraud to a human at once. ")
    asks = ["I ordered a new card on 12/03/2024 but it has not arrived, ref AB12CD9.",
            "Why was my payment of $1,299.50 declined yesterday?",
            "How do I change my e-mail from jane.doe@example.org?",
            "Mary Ann sent me 250 EUR last week but I still don't see it."]
    messages = [{"role": "system", "content": system * 3}]
    i = 0
    while True:
        body = {"model": "gemma-3-270m", "messages": messages,
                "tools": [{"type": "function", "function": {"name": "lookup_card", "parameters": {"type": "object"}}}]}
        data = json.dumps(body).encode()
        if len(data) >= target:
            return data
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": asks[i % len(asks)]})
        i += 1


def start_envoy(workdir, name, config):
    path = os.path.join(workdir, name + ".yaml")
    with open(path, "w") as f:
        f.write(config)
    log = open(os.path.join(workdir, name + ".log"), "w")
    proc = subprocess.Popen([ENVOY, "-c", path, "--use-dynamic-base-id", "--concurrency", "1", "-l", "error"],
                            stdout=subprocess.DEVNULL, stderr=log)
    return proc


def wait_ready(admin):
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{admin}/ready", timeout=1).status == 200:
                return
        except Exception:
            time.sleep(0.1)
    sys.exit(f"envoy on admin port {admin} not ready")


LATENCY = re.compile(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", re.M)
UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def cpu_ns(pid):
    """CPU time a process has run so far, ns: the sum of its threads' schedstat run time."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended between listdir and open
    return total


def run_wrk(port, body_file, args, pid):
    script = os.path.join(os.path.dirname(body_file), "post.lua")
    with open(script, "w") as f:
        f.write('local f = io.open(os.getenv("BODY_FILE"), "rb")\n'
                'wrk.method = "POST"\nwrk.body = f:read("*a")\nf:close()\n'
                'wrk.headers["content-type"] = "application/json"\n')
    cpu_before = cpu_ns(pid)
    out = subprocess.run(["wrk", "-t1", f"-c{args.connections}", f"-d{args.duration}s", "--latency", "-s", script,
                          f"http://127.0.0.1:{port}/v1/chat/completions"],
                         capture_output=True, text=True, env={**os.environ, "BODY_FILE": body_file}, check=True).stdout
    cpu = cpu_ns(pid) - cpu_before
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    lat = {p: float(v) * UNITS[u] for p, v, u in LATENCY.findall(out)}
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = int(non2xx.group(1)) if non2xx else 0
    return rps, lat["50"], lat["99"], cpu / 1e3 / max(requests, 1), errors


def oha_binary():
    return shutil.which("oha") or next((p for p in [os.path.expanduser("~/.cargo/bin/oha")] if os.path.exists(p)), None)


def run_oha(oha, port, body_file, args):
    """Fixed-rate latency (ms): p50, p99, and the success rate."""
    out = subprocess.run([oha, "-z", f"{args.duration}s", "-q", str(args.rate), "-c", "8", "--no-tui",
                          "--output-format", "json", "-m", "POST", "-H", "content-type: application/json",
                          "-D", body_file, f"http://127.0.0.1:{port}/v1/chat/completions"],
                         capture_output=True, text=True, check=True).stdout
    report = json.loads(out)
    latency = report["latencyPercentiles"]
    return latency["p50"] * 1e3, latency["p99"] * 1e3, report["summary"]["successRate"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--compare-wasm", action="append", default=[], metavar="WASM",
                        help="another filter build, measured as one more front (repeatable)")
    parser.add_argument("--floor", action="store_true", help="add the two wasm-floor fronts")
    parser.add_argument("--sizes", default="2048,32768", help="chat body sizes, bytes (comma-separated)")
    args = parser.parse_args()
    for need in [ENVOY, FILTER] + [FLOOR] * args.floor + args.compare_wasm:
        if not os.path.exists(need):
            sys.exit(f"{need} missing: run scripts/setup")

    workdir = tempfile.mkdtemp(prefix="cohort-bench-")
    plugin = os.environ.get("COHORT_PLUGIN_JSON", '{"mode": "affinity"}')
    # front name -> (row label, http_filters)
    fronts = {"baseline": ("baseline", BUFFER),
              "cohort": ("Cohort", COHORT.format(wasm=FILTER, plugin=plugin))}
    for i, wasm in enumerate(args.compare_wasm):
        label = os.path.basename(wasm) if len(args.compare_wasm) > 1 else "before"
        fronts[f"compare-{i}"] = (label, COHORT.format(wasm=os.path.abspath(wasm), plugin=plugin))
    if args.floor:
        fronts["floor-noop"] = ("wasm floor: no-op", BUFFER + COHORT.format(wasm=FLOOR, plugin="noop"))
        fronts["floor-body"] = ("wasm floor: read body", COHORT.format(wasm=FLOOR, plugin="body"))
    ports = {name: (free_port(), free_port()) for name in ["upstream", *fronts]}
    upstream_port = ports["upstream"][1]
    direct = 'direct_response: { status: 200, body: { inline_string: "{\\"ok\\":true}" } }'
    hashed = "route: { cluster: upstream, hash_policy: [ { header: { header_name: x-cohort-key } } ] }"
    configs = {"upstream": TEMPLATE.format(admin=ports["upstream"][0], port=upstream_port, route=direct,
                                           filters=BUFFER, upstream=upstream_port)}
    for name, (_, filters) in fronts.items():
        configs[name] = TEMPLATE.format(admin=ports[name][0], port=ports[name][1], route=hashed,
                                        filters=filters, upstream=upstream_port)
    procs = {name: start_envoy(workdir, name, config) for name, config in configs.items()}
    try:
        for admin, _ in ports.values():
            wait_ready(admin)
        rows, fixed_rate = [], []
        oha = oha_binary()
        for size in [int(s) for s in args.sizes.split(",")]:
            body = chat_body(size)
            body_file = os.path.join(workdir, f"body-{size}.json")
            with open(body_file, "wb") as f:
                f.write(body)
            results = {name: [] for name in fronts}
            for _ in range(args.rounds):
                for name in fronts:
                    results[name].append(run_wrk(ports[name][1], body_file, args, procs[name].pid))
            med = {name: [statistics.median(r[i] for r in runs) for i in range(4)] + [sum(r[4] for r in runs)]
                   for name, runs in results.items()}
            rows.append((len(body), med))
            if oha:
                latencies = {name: [] for name in fronts}
                for _ in range(args.rounds):
                    for name in fronts:
                        latencies[name].append(run_oha(oha, ports[name][1], body_file, args))
                fixed_rate.append((len(body), {name: [statistics.median(r[i] for r in runs) for i in range(2)]
                                               + [min(r[2] for r in runs)] for name, runs in latencies.items()}))
        stats = urllib.request.urlopen(f"http://127.0.0.1:{ports['cohort'][0]}/stats?filter=cohort_(fingerprinted_total|bypass_total|fingerprint_us|sketch_us)").read().decode()
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            proc.wait(timeout=10)

    print(f"\nEnvoy 1.40, 1 worker per Envoy, wrk -t1 -c{args.connections} -d{args.duration}s, "
          f"{args.rounds} alternating rounds, medians. CPU/req: the front Envoy's CPU time (all "
          "threads) per request served, µs; 'added' is the difference to the baseline front.\n")
    print("| body | front | rps | rps ratio | CPU/req (µs) | CPU added (µs) | p50 / p99 (ms) | added p50 / p99 (ms) | non-2xx |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size, med in rows:
        b = med["baseline"]
        print(f"| {size:,} B | baseline (buffer filter) | {b[0]:,.0f} | 1 | {b[3]:.1f} | — | "
              f"{b[1]:.3f} / {b[2]:.3f} | — | {b[4]} |")
        for name, (label, _) in list(fronts.items())[1:]:
            c = med[name]
            print(f"| {size:,} B | {label} | {c[0]:,.0f} | {c[0] / b[0]:.2f} | {c[3]:.1f} | {c[3] - b[3]:+.1f} | "
                  f"{c[1]:.3f} / {c[2]:.3f} | {c[1] - b[1]:+.3f} / {c[2] - b[2]:+.3f} | {c[4]} |")
    if fixed_rate:
        print(f"\nFixed rate: oha -q {args.rate} -c 8 -z {args.duration}s, {args.rounds} alternating rounds, medians\n")
        print("| body | front | p50 / p99 (ms) | added p50 / p99 (ms) | success |")
        print("|---|---|---|---|---|")
        for size, med in fixed_rate:
            b = med["baseline"]
            print(f"| {size:,} B | baseline (buffer filter) | {b[0]:.3f} / {b[1]:.3f} | — | {b[2]:.0%} |")
            for name, (label, _) in list(fronts.items())[1:]:
                c = med[name]
                print(f"| {size:,} B | {label} | {c[0]:.3f} / {c[1]:.3f} | "
                      f"{c[0] - b[0]:+.3f} / {c[1] - b[1]:+.3f} | {c[2]:.0%} |")
    else:
        print("\n(oha not found: `cargo install oha` for the fixed-rate latency table)")
    print("\ncohort filter stats:\n" + stats)


if __name__ == "__main__":
    main()
