"""Fingerprint time inside Envoy for 1 KB prompts, from the filter's own histogram.

Why: the sketch must stay cheap where it runs, in Envoy's V8 wasm runtime, not only in a
native benchmark. One Envoy (one worker) with the Cohort filter in affinity mode routes to
a direct_response upstream; the script POSTs chat bodies whose only message is a ~1 KB
user prompt (ShareGPT-like prose with variables; 64 different prompts, after a warm-up),
then reads `cohort_fingerprint_us` (time of the whole body fingerprint: JSON parse,
canonical prompt, prefix hashes, normalise, mask, sketch) and `cohort_sketch_us` (the
normalise + mask + sketch step alone) from /stats. --wasm runs another build of the filter
(e.g. the main branch's, copied aside). Given twice or more, it starts one Envoy per build
and sends the requests to them in turn, one each, so that every build sees the same moments
of a machine whose speed changes from second to second (these shared boxes move between a
fast and a slow state), and prints the builds' percentiles side by side.

  python3 -m cohort_tools.bench.sketch_wasm [--requests 2000] [--wasm target/wasm/cohort_filter.wasm ...] [--body FILE]

Needs Envoy (scripts/setup; COHORT_ENVOY overrides) and scripts/build-wasm.
"""
import argparse
import json
import os
import re
import tempfile
import time
import urllib.request

from cohort_tools import stack
from cohort_tools.bench.filter_overhead import COHORT, start_envoy
from cohort_tools.stack import FILTER

WORDS = ("I need help with my account because the payment I made on 12/03/2024 to Acme "
         "was declined twice and the card still shows a pending charge of $49.99 ; can you "
         "explain why this happens , how long a refund usually takes , and whether I should "
         "order a new card or contact support at help@example.com about ticket AB12CD9 ? "
         "Also summarise the steps to change my password and enable two factor login .").split()


def prompt(i, size=1024):
    words, n = [], 0
    while n < size:
        word = WORDS[(n * 7 + i) % len(WORDS)] if n % 5 == 0 else WORDS[(len(words) + i) % len(WORDS)]
        words.append(word)
        n += len(word) + 1
    return " ".join(words)[:size]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--wasm", action="append", help="a filter build (repeat to alternate builds)")
    ap.add_argument("--body", help="POST this file's bytes instead of the generated 1 KB prompts")
    args = ap.parse_args()
    builds = args.wasm or [FILTER]
    workdir = tempfile.mkdtemp(prefix="cohort-sketch-bench-")
    direct = 'direct_response: { status: 200, body: { inline_string: "{}" } }'
    hashed = "route: { cluster: upstream, hash_policy: [ { header: { header_name: x-cohort-key } } ] }"
    plugin = '{"mode": "affinity", "histogram_sample_every": 1}'
    try:
        _, _, up_port = start_envoy(workdir, "upstream", direct, "")
        fronts = []  # (admin, port) per build
        for i, wasm in enumerate(builds):
            _, admin, port = start_envoy(workdir, f"cohort-{i}", hashed,
                                         COHORT.format(wasm=os.path.abspath(wasm), plugin=plugin), upstream=up_port)
            fronts.append((admin, port))
        if args.body:
            with open(args.body, "rb") as f:
                bodies = [f.read()]
        else:
            bodies = [json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt(i)}]}).encode()
                      for i in range(64)]
        for n in range(args.requests):
            for _, port in fronts:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                                 data=bodies[n % len(bodies)],
                                                 headers={"content-type": "application/json"})
                urllib.request.urlopen(request, timeout=5).read()
        time.sleep(6)  # histograms reach /stats at the next flush (every 5 s)
        what = args.body or f"a {len(prompt(0))}-byte prompt"
        print(f"{args.requests} requests per build, {len(bodies[0])}-byte bodies ({what})")
        query = "/stats?filter=cohort_(fingerprint_us|sketch_us|fingerprinted_total|body_bytes)"
        stats = [urllib.request.urlopen(f"http://127.0.0.1:{admin}{query}").read().decode() for admin, _ in fronts]
        if len(builds) == 1:
            print(f"wasm {builds[0]}")
            print(stats[0])
            return
        print("\n| histogram | build | P0 | P25 | P50 | P75 | P90 |\n|---|---|---|---|---|---|---|")
        for name in ("cohort_fingerprint_us", "cohort_sketch_us"):
            for wasm, text in zip(builds, stats):
                q = percentiles(text, name)
                cells = " | ".join(f"{q.get(p, float('nan')):.1f}" for p in ("P0", "P25", "P50", "P75", "P90"))
                print(f"| {name} | {os.path.basename(wasm)} | {cells} |")
    finally:
        stack.stop_all()


def percentiles(stats, name):
    """{"P50": value, ...} of histogram `name` in an Envoy /stats text (interval, cumulative
    pairs: the cumulative value is read)."""
    for line in stats.splitlines():
        if line.split(":")[0].endswith(name):
            return {m[0]: float(m[2]) for m in re.findall(r"(P[\d.]+)\(([^,]*),([^)]*)\)", line)}
    return {}


if __name__ == "__main__":
    main()
