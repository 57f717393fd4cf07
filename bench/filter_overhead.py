#!/usr/bin/env python3
"""Envoy + buffer filter vs Envoy + Cohort filter (affinity mode): what the filter costs.

Three Envoys on loopback, one worker each: an upstream (buffer filter + direct_response),
a baseline front (buffer filter -> router) and a Cohort front (cohort filter -> router).
wrk POSTs the same OpenAI chat body to each front in alternating runs (baseline, cohort,
baseline, ...), same connections, threads and duration; the table reports the medians
and the ratios. Bodies: 2 KB and 32 KB chat requests (system prompt, tools, turns).

A second table measures the latency the filter adds below saturation: oha at a fixed rate
(--rate, default 500 requests/s) against each front, alternating, medians of p50 and p99.

  bench/filter_overhead.py [--duration 10] [--rounds 3] [--connections 16] [--rate 500]
                           [--compare-wasm OLD.wasm] [--floor]

--compare-wasm adds a third front with another build of the filter (e.g. the main branch's,
copied aside before rebuilding), measured in the same alternating rounds: rows "before".
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
LABELS = {"cohort": "", "before": " (before)", "floor-noop": " (wasm floor: no-op)",
          "floor-body": " (wasm floor: read body)"}

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


def run_wrk(port, body_file, args):
    script = os.path.join(os.path.dirname(body_file), "post.lua")
    with open(script, "w") as f:
        f.write('local f = io.open(os.getenv("BODY_FILE"), "rb")\n'
                'wrk.method = "POST"\nwrk.body = f:read("*a")\nf:close()\n'
                'wrk.headers["content-type"] = "application/json"\n')
    out = subprocess.run(["wrk", "-t1", f"-c{args.connections}", f"-d{args.duration}s", "--latency", "-s", script,
                          f"http://127.0.0.1:{port}/v1/chat/completions"],
                         capture_output=True, text=True, env={**os.environ, "BODY_FILE": body_file}, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    lat = {p: float(v) * UNITS[u] for p, v, u in LATENCY.findall(out)}
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = int(non2xx.group(1)) if non2xx else 0
    return rps, lat["50"], lat["99"], errors


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
    parser.add_argument("--compare-wasm", help="another filter build, measured as a third front")
    parser.add_argument("--floor", action="store_true", help="add the two wasm-floor fronts")
    args = parser.parse_args()
    for need in (ENVOY, FILTER) + ((FLOOR,) if args.floor else ()):
        if not os.path.exists(need):
            sys.exit(f"{need} missing: run scripts/setup")

    workdir = tempfile.mkdtemp(prefix="cohort-bench-")
    fronts = (["baseline", "cohort"] + (["before"] if args.compare_wasm else [])
              + (["floor-noop", "floor-body"] if args.floor else []))
    ports = {name: (free_port(), free_port()) for name in ["upstream"] + fronts}
    plugin = os.environ.get("COHORT_PLUGIN_JSON", '{"mode": "affinity"}')
    upstream_port = ports["upstream"][1]
    direct = 'direct_response: { status: 200, body: { inline_string: "{\\"ok\\":true}" } }'
    hashed = "route: { cluster: upstream, hash_policy: [ { header: { header_name: x-cohort-key } } ] }"
    configs = {
        "upstream": TEMPLATE.format(admin=ports["upstream"][0], port=upstream_port, route=direct,
                                    filters=BUFFER, upstream=upstream_port),
        "baseline": TEMPLATE.format(admin=ports["baseline"][0], port=ports["baseline"][1], route=hashed,
                                    filters=BUFFER, upstream=upstream_port),
        "cohort": TEMPLATE.format(admin=ports["cohort"][0], port=ports["cohort"][1], route=hashed,
                                  filters=COHORT.format(wasm=FILTER, plugin=plugin), upstream=upstream_port),
    }
    if args.compare_wasm:
        configs["before"] = TEMPLATE.format(admin=ports["before"][0], port=ports["before"][1], route=hashed,
                                            filters=COHORT.format(wasm=os.path.abspath(args.compare_wasm),
                                                                  plugin=plugin), upstream=upstream_port)
    if args.floor:
        configs["floor-noop"] = TEMPLATE.format(admin=ports["floor-noop"][0], port=ports["floor-noop"][1],
                                                route=hashed, upstream=upstream_port,
                                                filters=BUFFER + COHORT.format(wasm=FLOOR, plugin="noop"))
        configs["floor-body"] = TEMPLATE.format(admin=ports["floor-body"][0], port=ports["floor-body"][1],
                                                route=hashed, upstream=upstream_port,
                                                filters=COHORT.format(wasm=FLOOR, plugin="body"))
    procs = [start_envoy(workdir, name, config) for name, config in configs.items()]
    try:
        for admin, _ in ports.values():
            wait_ready(admin)
        rows, fixed_rate = [], []
        oha = oha_binary()
        for size in (2048, 32768):
            body = chat_body(size)
            body_file = os.path.join(workdir, f"body-{size}.json")
            with open(body_file, "wb") as f:
                f.write(body)
            results = {name: [] for name in fronts}
            for _ in range(args.rounds):
                for name in fronts:
                    results[name].append(run_wrk(ports[name][1], body_file, args))
            med = {name: [statistics.median(r[i] for r in runs) for i in range(3)] + [sum(r[3] for r in runs)]
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
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=10)

    print(f"\nEnvoy 1.40, 1 worker per Envoy, wrk -t1 -c{args.connections} -d{args.duration}s, "
          f"{args.rounds} alternating rounds, medians\n")
    print("| body | baseline rps | cohort rps | rps ratio | baseline p50 / p99 (ms) | cohort p50 / p99 (ms) | added p50 / p99 (ms) | non-2xx |")
    print("|---|---|---|---|---|---|---|---|")
    for size, med in rows:
        for name in fronts[1:]:
            b, c = med["baseline"], med[name]
            label = f"{size:,} B" + LABELS[name]
            print(f"| {label} | {b[0]:,.0f} | {c[0]:,.0f} | {c[0] / b[0]:.2f} | {b[1]:.3f} / {b[2]:.3f} | "
                  f"{c[1]:.3f} / {c[2]:.3f} | {c[1] - b[1]:+.3f} / {c[2] - b[2]:+.3f} | {b[3] + c[3]} |")
    if fixed_rate:
        print(f"\nFixed rate: oha -q {args.rate} -c 8 -z {args.duration}s, {args.rounds} alternating rounds, medians\n")
        print("| body | baseline p50 / p99 (ms) | cohort p50 / p99 (ms) | added p50 / p99 (ms) | success |")
        print("|---|---|---|---|---|")
        for size, med in fixed_rate:
            for name in fronts[1:]:
                b, c = med["baseline"], med[name]
                label = f"{size:,} B" + LABELS[name]
                print(f"| {label} | {b[0]:.3f} / {b[1]:.3f} | {c[0]:.3f} / {c[1]:.3f} | "
                      f"{c[0] - b[0]:+.3f} / {c[1] - b[1]:+.3f} | {min(b[2], c[2]):.0%} |")
    else:
        print("\n(oha not found: `cargo install oha` for the fixed-rate latency table)")
    print("\ncohort filter stats:\n" + stats)


if __name__ == "__main__":
    main()
