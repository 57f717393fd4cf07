#!/usr/bin/env python3
"""Fingerprint time inside Envoy for 1 KB prompts, from the filter's own histogram.

Why: the sketch must stay cheap where it runs, in Envoy's V8 wasm runtime, not only in a
native benchmark. One Envoy (one worker) with the Cohort filter in affinity mode routes to
a direct_response upstream; the script POSTs chat bodies whose only message is a ~1 KB
user prompt (ShareGPT-like prose with variables; 64 different prompts, after a warm-up),
then reads `cohort_fingerprint_us` (time of the whole body fingerprint: JSON parse,
canonical prompt, prefix hashes, normalise, mask, sketch) and `cohort_sketch_us` (the
normalise + mask + sketch step alone) from /stats. --wasm runs another build of the filter
(e.g. the main branch's, copied aside) to compare; alternate runs of the two.

  bench/sketch_wasm.py [--requests 2000] [--wasm target/wasm/cohort_filter.wasm] [--body FILE]

Needs Envoy (scripts/setup; COHORT_ENVOY overrides) and scripts/build-wasm.
"""
import argparse
import json
import os
import signal
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from filter_overhead import COHORT, ENVOY, FILTER, TEMPLATE, free_port, start_envoy, wait_ready  # noqa: E402

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
    ap.add_argument("--wasm", default=FILTER)
    ap.add_argument("--body", help="POST this file's bytes instead of the generated 1 KB prompts")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="cohort-sketch-bench-")
    admin, port, up_admin, up_port = free_port(), free_port(), free_port(), free_port()
    direct = 'direct_response: { status: 200, body: { inline_string: "{}" } }'
    hashed = "route: { cluster: upstream, hash_policy: [ { header: { header_name: x-cohort-key } } ] }"
    procs = [
        start_envoy(workdir, "upstream", TEMPLATE.format(admin=up_admin, port=up_port, route=direct,
                                                         filters="", upstream=up_port)),
        start_envoy(workdir, "cohort", TEMPLATE.format(
            admin=admin, port=port, route=hashed, upstream=up_port,
            filters=COHORT.format(wasm=os.path.abspath(args.wasm), plugin='{"mode": "affinity", "histogram_sample_every": 1}'))),
    ]
    try:
        wait_ready(up_admin)
        wait_ready(admin)
        if args.body:
            with open(args.body, "rb") as f:
                bodies = [f.read()]
        else:
            bodies = [json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt(i)}]}).encode()
                      for i in range(64)]
        for n in range(args.requests):
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                             data=bodies[n % len(bodies)],
                                             headers={"content-type": "application/json"})
            urllib.request.urlopen(request, timeout=5).read()
        time.sleep(6)  # histograms reach /stats at the next flush (every 5 s)
        stats = urllib.request.urlopen(
            f"http://127.0.0.1:{admin}/stats?filter=cohort_(fingerprint_us|sketch_us|fingerprinted_total|body_bytes)").read().decode()
        what = args.body or f"a {len(prompt(0))}-byte prompt"
        print(f"{args.requests} requests, {len(bodies[0])}-byte bodies ({what}), wasm {args.wasm}")
        print(stats)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait()


if __name__ == "__main__":
    main()
