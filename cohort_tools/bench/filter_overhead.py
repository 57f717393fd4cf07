"""Envoy + buffer filter vs Envoy + Cohort filter (affinity mode): what the filter costs.

Three Envoys on loopback, one worker each: an upstream (buffer filter + direct_response: a
chat completion with its usage, as an engine answers),
a baseline front (buffer filter -> router) and a Cohort front (cohort filter -> router).
wrk POSTs the same OpenAI chat body to each front in alternating runs (baseline, cohort,
baseline, ...), same connections, threads and duration; the table reports the medians
and the ratios. Bodies: 2 KB and 32 KB chat requests (system prompt, tools, turns).

Each row also gives the front Envoy's CPU time per request served (all its threads, from
/proc/<pid>/task/*/schedstat) and its difference to the baseline: on a 2-core machine where
wrk, the upstream and the front share the cores, rps ratios move with how the scheduler
shares them, while CPU per request is what the filter itself costs.

A second table measures the latency the filter adds below saturation: oha at a fixed rate
(--rate: by default half the baseline front's saturated rps for that body, from the first
table) against each front, alternating, medians of p50 and p99.

With --floor, a third table gives the unit of the filter's cost goal: Cohort's own CPU per
request over the read-body floor (Cohort's CPU added minus the floor's).

With --tokenizer, a last table times the engine's own tokenizer on the same bodies:
llama-server's /tokenize (Gemma 3 270M, as scripts/setup installs it) on the text of the
body's messages, the median round trip minus that of an empty text, for comparison with
what the filter adds per request.

  python3 -m cohort_tools.bench.filter_overhead [--duration 10] [--rounds 3] [--connections 16] [--rate auto|N]
                           [--sizes 2048,32768] [--compare-wasm OLD.wasm ...] [--floor]
                           [--floor-extra CONFIG ...] [--perf] [--tokenizer] [--paired RATE]

--compare-wasm adds a front with another build of the filter (e.g. the main branch's,
copied aside before rebuilding), measured in the same alternating rounds: rows "before";
repeat it to compare several builds (rows named after the files).
--floor adds two fronts with `cohort_wasm_floor.wasm` (bench/wasm-floor), the least a
proxy-wasm filter can do: "wasm floor: no-op" (buffer filter + a wasm filter that only
answers Continue) and "wasm floor: read body" (pause, read the buffered body, write one
header, clear the route cache). They show what any wasm filter costs in this Envoy, apart
from Cohort's own work. --floor-extra CONFIG adds a floor front with another plugin
configuration, e.g. `body+clock:20` or `body+header:10` (the read-body floor and 20 clock
reads, or 10 more header writes): its CPU over "read body" prices one call out of the VM.

With --paired RATE, instead of the tables above, every front takes oha's fixed-rate load
at RATE requests/s *at the same time* (one oha per front, --rounds runs of --duration), and
the table gives each front's CPU per request over those same seconds. These shared boxes
move between a fast and a slow state from one second to the next, which moves the
sequential runs above by more than a filter change; fronts loaded together see the same
states, so their differences (Cohort's own CPU over the read-body floor, a build against
another) hold where the absolute figures do not. Pick RATE so that all fronts together
stay well below saturation (about 800 with six fronts on two cores).

With --perf, after the rounds each front serves one more wrk run under `perf record` (as
scripts/setup installs it), and a table splits its CPU per request by where it ran: the
wasm code V8 compiled (perf's `[JIT]`), Envoy's own code (with V8's runtime: the calls in and
out of the VM are there), the kernel and libc. Envoy's V8 takes no flags, so it writes no
perf map and the wasm functions have no names here (bench/wasm-profile names them, in node).

Needs scripts/setup (Envoy, wrk, oha, the filter, and llama-server for --tokenizer).
Prints markdown tables.
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from cohort_tools import stack
from cohort_tools.stack import ENVOY, FILTER, LLAMA, MODEL, ROOT

FLOOR = os.path.join(ROOT, "target/wasm/cohort_wasm_floor.wasm")

# What the upstream answers: an engine's non-streamed chat completion with its usage (the
# filter reads the cached tokens from the end of every response it counts).
ANSWER = json.dumps({
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "Your refund was issued on Monday."}}],
    "usage": {"prompt_tokens": 512, "completion_tokens": 9, "total_tokens": 521,
              "prompt_tokens_details": {"cached_tokens": 448}},
})

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


def chat_body(target):
    system = ("You are a support agent for an online bank. Answer briefly, ask for the account "
              "number only when needed, and escalate fraud to a human at once. ")
    asks = ["I ordered a new card on 12/03/2024 but it has not arrived, ref AB12CD9.",
            "Why was my payment of $1,299.50 declined yesterday?",
            "How do I change my e-mail from jane.doe@example.org?",
            "Mary Ann sent me 250 EUR last week but I still don't see it."]
    messages = [{"role": "system", "content": system * 3}]
    body = {"model": "gemma-3-270m", "messages": messages,
            "tools": [{"type": "function", "function": {"name": "lookup_card", "parameters": {"type": "object"}}}]}
    # Each message appended adds ", " and its own JSON to the body: count instead of
    # re-encoding the whole body per message (512 KB bodies have thousands).
    size = len(json.dumps(body).encode())
    i = 0
    while size < target:
        message = {"role": "user" if i % 2 == 0 else "assistant", "content": asks[i % len(asks)]}
        messages.append(message)
        size += len(json.dumps(message).encode()) + 2
        i += 1
    data = json.dumps(body).encode()
    assert len(data) == size
    return data


def start_envoy(workdir, name, route, filters, upstream=None):
    """One Envoy (one worker) on TEMPLATE with free admin and listener ports, ready; its
    cluster `upstream` points at port `upstream` (None: its own listener). Returns (proc,
    admin, port)."""
    def config(admin, port):
        return TEMPLATE.format(admin=admin, port=port, route=route, filters=filters, upstream=upstream or port)

    return stack.start_envoy_on_free_ports(workdir, name, config, workers=1)


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


PERF_PARTS = ["jit", "envoy", "kernel", "other"]


def perf_split(port, body_file, args, pid, workdir):
    """(CPU µs per request, {part: µs per request}) of one wrk run under perf record, the
    samples split by DSO into PERF_PARTS."""
    data = os.path.join(workdir, f"perf-{pid}.data")
    perf = subprocess.Popen(["perf", "record", "-F", "2999", "-o", data, "-p", str(pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    total = run_wrk(port, body_file, args, pid)[3]
    perf.send_signal(signal.SIGINT)
    perf.wait(timeout=30)
    report = subprocess.run(["perf", "report", "-i", data, "--stdio", "--sort", "dso"],
                            capture_output=True, text=True).stdout
    shares = {part: 0.0 for part in PERF_PARTS}
    for line in report.splitlines():
        match = re.match(r"\s*([\d.]+)%\s+(.+?)\s*$", line)
        if not match:
            continue
        share, dso = float(match.group(1)) / 100, match.group(2)
        part = ("jit" if dso.startswith("[JIT]") else "envoy" if dso == "envoy"
                else "kernel" if dso.startswith("[kernel") else "other")
        shares[part] += share
    os.remove(data)
    return total, {part: share * total for part, share in shares.items()}


def oha_binary():
    """oha, installed on first use by scripts/install-bench-tools (None if it cannot build)."""
    candidates = [os.path.join(ROOT, ".cohort/bin/oha"), os.path.expanduser("~/.cargo/bin/oha")]
    found = shutil.which("oha") or next((p for p in candidates if os.path.exists(p)), None)
    if found is None:
        subprocess.run([os.path.join(ROOT, "scripts/install-bench-tools"), "oha"], check=False)
        found = next((p for p in candidates if os.path.exists(p)), None)
    return found


def write_body(workdir, size):
    """The chat body of about `size` bytes, and the file it was written to."""
    body = chat_body(size)
    body_file = os.path.join(workdir, f"body-{size}.json")
    with open(body_file, "wb") as f:
        f.write(body)
    return body, body_file


def oha_command(oha, port, body_file, duration, rate):
    """oha POSTing `body_file` at a fixed `rate` for `duration` seconds, a JSON report."""
    return [oha, "-z", f"{duration}s", "-q", str(rate), "-c", "8", "--no-tui", "--output-format", "json",
            "-m", "POST", "-H", "content-type: application/json", "-D", body_file,
            f"http://127.0.0.1:{port}/v1/chat/completions"]


def run_oha(oha, port, body_file, args, rate):
    """Fixed-rate latency (ms): p50, p99, and the success rate."""
    out = subprocess.run(oha_command(oha, port, body_file, args.duration, rate),
                         capture_output=True, text=True, check=True).stdout
    report = json.loads(out)
    latency = report["latencyPercentiles"]
    return latency["p50"] * 1e3, latency["p99"] * 1e3, report["summary"]["successRate"]


def tokenizer_times(sizes, workdir):
    """(body bytes, tokens, text bytes, µs) per size: llama-server's /tokenize on the text of
    the body's messages, median round trip of 20 calls minus the median for an empty text."""
    for need in (LLAMA, MODEL):
        if not os.path.exists(need):
            sys.exit(f"{need} missing: run scripts/setup")
    def llama():
        port = stack.free_port()
        proc = stack.spawn([LLAMA, "-m", MODEL, "--host", "127.0.0.1", "--port", str(port), "-c", "2048",
                            "-np", "1", "-t", "1"], os.path.join(workdir, "llama.log"))
        stack.wait_http(port, "/health", proc, f"llama-server (see its log in {workdir})", timeout=120)
        return proc, port

    proc, port = stack.on_free_ports(llama)
    try:
        def tokenize(text):
            data = json.dumps({"content": text}).encode()
            started = time.perf_counter()
            request = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize", data=data,
                                             headers={"content-type": "application/json"})
            reply = json.loads(urllib.request.urlopen(request, timeout=30).read())
            return time.perf_counter() - started, len(reply["tokens"])

        def median_us(text):
            tokenize(text)
            return statistics.median(tokenize(text)[0] for _ in range(20)) * 1e6

        empty = median_us("")
        out = []
        for size in sizes:
            body = json.loads(chat_body(size))
            text = "\n".join(m["content"] for m in body["messages"])
            tokens = tokenize(text)[1]
            out.append((len(chat_body(size)), tokens, len(text.encode()), median_us(text) - empty))
        return out
    finally:
        stack.stop([proc])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rate", default="auto",
                        help="fixed rate of the latency table, requests/s, or auto: half the baseline's saturation")
    parser.add_argument("--tokenizer", action="store_true",
                        help="time llama-server's /tokenize on the same bodies")
    parser.add_argument("--compare-wasm", action="append", default=[], metavar="WASM",
                        help="another filter build, measured as one more front (repeatable)")
    parser.add_argument("--floor", action="store_true", help="add the two wasm-floor fronts")
    parser.add_argument("--floor-extra", action="append", default=[], metavar="CONFIG",
                        help="a wasm-floor front with this plugin configuration (repeatable), e.g. body+clock:20")
    parser.add_argument("--perf", action="store_true",
                        help="split each front's CPU per request by DSO with perf record")
    parser.add_argument("--sizes", default="2048,32768", help="chat body sizes, bytes (comma-separated)")
    parser.add_argument("--paired", type=int, metavar="RATE",
                        help="load every front at once at RATE req/s and compare CPU per request")
    args = parser.parse_args()
    if args.perf and not shutil.which("perf"):
        sys.exit("perf missing: scripts/setup installs linux-perf")
    for need in [ENVOY, FILTER] + [FLOOR] * bool(args.floor or args.floor_extra) + args.compare_wasm:
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
    for i, config in enumerate(args.floor_extra):
        fronts[f"floor-extra-{i}"] = (f"wasm floor: {config}", COHORT.format(wasm=FLOOR, plugin=config))
    direct = f"direct_response: {{ status: 200, body: {{ inline_string: {json.dumps(ANSWER)} }} }}"
    hashed = "route: { cluster: upstream, hash_policy: [ { header: { header_name: x-cohort-key } } ] }"
    procs, ports = {}, {}  # name -> Envoy, name -> (admin, listener)
    try:
        procs["upstream"], admin, upstream = start_envoy(workdir, "upstream", direct, BUFFER)
        ports["upstream"] = (admin, upstream)
        for name, (_, filters) in fronts.items():
            procs[name], admin, port = start_envoy(workdir, name, hashed, filters, upstream=upstream)
            ports[name] = (admin, port)
        rows, fixed_rate, perf_rows = [], [], []
        oha = oha_binary()
        if args.paired:
            paired_table(fronts, ports, procs, args, oha, workdir)
            return
        for size in [int(s) for s in args.sizes.split(",")]:
            body, body_file = write_body(workdir, size)
            results = {name: [] for name in fronts}
            for _ in range(args.rounds):
                for name in fronts:
                    results[name].append(run_wrk(ports[name][1], body_file, args, procs[name].pid))
            med = {name: [statistics.median(r[i] for r in runs) for i in range(4)] + [sum(r[4] for r in runs)]
                   for name, runs in results.items()}
            rows.append((len(body), med))
            if oha:
                rate = int(med["baseline"][0] / 2) if args.rate == "auto" else int(args.rate)
                latencies = {name: [] for name in fronts}
                for _ in range(args.rounds):
                    for name in fronts:
                        latencies[name].append(run_oha(oha, ports[name][1], body_file, args, rate))
                fixed_rate.append((len(body), rate, {name: [statistics.median(r[i] for r in runs) for i in range(2)]
                                                     + [min(r[2] for r in runs)] for name, runs in latencies.items()}))
            if args.perf:
                perf_rows.append((len(body), {
                    name: perf_split(ports[name][1], body_file, args, procs[name].pid, workdir) for name in fronts}))
        stats = urllib.request.urlopen(f"http://127.0.0.1:{ports['cohort'][0]}/stats?filter=cohort_(fingerprinted_total|bypass_total|fingerprint_us|sketch_us)").read().decode()
    finally:
        stack.stop_all()

    print(f"\nEnvoy 1.40, 1 worker per Envoy, wrk -t1 -c{args.connections} -d{args.duration}s, "
          f"{args.rounds} alternating rounds, medians. CPU/req: the front Envoy's CPU time (all "
          "threads) per request served, µs; 'added' is the difference to the baseline front.\n")
    print("| body | front | rps | rps ratio | CPU/req (µs) | CPU added (µs) | p50 / p99 (ms) | added p50 / p99 (ms) "
          "| non-2xx |")
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
        rate_note = "half the baseline's saturated rps" if args.rate == "auto" else f"{args.rate} requests/s"
        print(f"\nFixed rate ({rate_note}): oha -c 8 -z {args.duration}s, {args.rounds} alternating rounds, medians\n")
        print("| body | rate (req/s) | front | p50 / p99 (ms) | added p50 / p99 (ms) | success |")
        print("|---|---|---|---|---|---|")
        for size, rate, med in fixed_rate:
            b = med["baseline"]
            print(f"| {size:,} B | {rate:,} | baseline (buffer filter) | {b[0]:.3f} / {b[1]:.3f} | — | {b[2]:.0%} |")
            for name, (label, _) in list(fronts.items())[1:]:
                c = med[name]
                print(f"| {size:,} B | {rate:,} | {label} | {c[0]:.3f} / {c[1]:.3f} | "
                      f"{c[0] - b[0]:+.3f} / {c[1] - b[1]:+.3f} | {c[2]:.0%} |")
    else:
        print("\n(oha not found: scripts/setup installs it, for the fixed-rate latency table)")
    if args.floor:
        print("\nCohort's own CPU per request over the read-body floor (CPU added by the front minus the floor's), "
              "µs:\n")
        print("| body | " + " | ".join(label for name, (label, _) in fronts.items()
                                       if name == "cohort" or name.startswith("compare-")) + " |")
        print("|---|" + "---|" * sum(1 for n in fronts if n == "cohort" or n.startswith("compare-")))
        for size, med in rows:
            floor = med["floor-body"][3]
            own = [f"{med[name][3] - floor:+.1f}" for name in fronts if name == "cohort" or name.startswith("compare-")]
            print(f"| {size:,} B | " + " | ".join(own) + " |")
    if perf_rows:
        print("\nWhere each front's CPU per request runs (one more wrk run under perf record -F 2999), µs:\n")
        print("| body | front | total | wasm (V8 JIT) | Envoy and V8 runtime | kernel | libc and other |")
        print("|---|---|---|---|---|---|---|")
        for size, split in perf_rows:
            for name, (label, _) in fronts.items():
                total, parts = split[name]
                cells = " | ".join(f"{parts[k]:.1f}" for k in PERF_PARTS)
                print(f"| {size:,} B | {label} | {total:.1f} | {cells} |")
    if args.tokenizer:
        print("\nThe engine's own tokenizer on the same bodies: llama-server /tokenize (Gemma 3 270M) on the "
              "messages' text, median round trip of 20 minus that of an empty text:\n")
        print("| body | text bytes | tokens | tokenize (µs) | Cohort's CPU added (µs) |")
        print("|---|---|---|---|---|")
        for size, tokens, text_bytes, us in tokenizer_times([int(s) for s in args.sizes.split(",")], workdir):
            cohort = next(med["cohort"][3] - med["baseline"][3] for body_size, med in rows if body_size == size)
            print(f"| {size:,} B | {text_bytes:,} | {tokens:,} | {us:,.0f} | {cohort:+.1f} |")
    print("\ncohort filter stats:\n" + stats)


def paired_table(fronts, ports, procs, args, oha, workdir):
    """--paired: every front under the same fixed rate at the same time; CPU per request."""
    if not oha:
        sys.exit("oha missing: scripts/setup installs it")
    print(f"\nEnvoy 1.40, 1 worker per Envoy; every front at {args.paired:,} req/s at once (oha -c 8 "
          f"-z {args.duration}s, one per front), {args.rounds} rounds, medians. CPU/req: the front's CPU "
          "time (all threads) over the round, per request answered 200, µs.\n")
    header = "| body | front | CPU/req (µs) | over the baseline (µs) |"
    if "floor-body" in fronts:
        header += " own over the read-body floor (µs) |"
    print(header + "\n|" + "---|" * (header.count("|") - 1))
    for size in [int(s) for s in args.sizes.split(",")]:
        body, body_file = write_body(workdir, size)
        per_request = {name: [] for name in fronts}
        for _ in range(args.rounds):
            before = {name: cpu_ns(procs[name].pid) for name in fronts}
            runs = {name: subprocess.Popen(oha_command(oha, ports[name][1], body_file, args.duration, args.paired),
                                           stdout=subprocess.PIPE, text=True) for name in fronts}
            answered = {name: json.loads(run.communicate()[0])["statusCodeDistribution"].get("200", 0)
                        for name, run in runs.items()}
            for name in fronts:
                per_request[name].append((cpu_ns(procs[name].pid) - before[name]) / 1e3 / max(answered[name], 1))
        med = {name: statistics.median(v) for name, v in per_request.items()}
        for name, (label, _) in fronts.items():
            row = f"| {len(body):,} B | {label} | {med[name]:.1f} | {med[name] - med['baseline']:+.1f} |"
            if "floor-body" in fronts:
                own = name == "cohort" or name.startswith("compare-")
                row += f" {med[name] - med['floor-body']:+.1f} |" if own else " |"
            print(row)


if __name__ == "__main__":
    main()
