"""Calibrates `cohort engine-sim` against a running real llama-server.

Measures, from the client, with streamed /v1/completions (`ignore_eos`, so every request
generates exactly max_tokens):
  - cold prompts of several lengths (a unique nonce first, so nothing is cached): TTFT;
  - warm repeats of the same prompts (llama-server reuses the slot's KV): TTFT;
  - one prompt with several max_tokens: decode time per token;
  - concurrent pairs (distinct prompts sent together): the decode slowdown per extra
    running request and the second request's wait behind the first prefill.
Fits, on the SIMULATOR's token counts of the same prompts (4 bytes per token, the sim's
"cached" = whole 16-token blocks of the repeated prompt, at most prompt-1 tokens):
  prefill_ms_per_token                    (least-squares slope of the cold TTFTs)
  prefill_base_ms                         (median warm TTFT minus its uncached tokens' cost)
  decode_ms_per_token                     (least squares of E2E-TTFT over max_tokens-1)
  decode_batch_slowdown                   (pairs' per-token time while both decode / alone, minus 1)
then predicts every case with the simulator's arithmetic (one FIFO prefill lane, decode
slowed while both run) and prints the absolute % error per case, mean and max, for TTFT and
end-to-end. Writes the constants, the cases, the errors, the engine's version and flags and
the date to --out (the committed default is data/bench/engine_sim_calibration.json).

Start the engine with the recipe of cohort_tools/stack.py (start_llama), e.g.
  .cohort/bin/llama-server -m .cohort/models/gemma-3-270m-q4_k_m.gguf --host 127.0.0.1 \
    --port 18200 -c 8192 -np 2 -t 1 --cache-ram 0 --swa-full --metrics
then: python3 -m cohort_tools.bench.engine_sim_calibrate --url http://127.0.0.1:18200 --out calib.json
Runs in about 1-2 minutes on a 2-core box. Stdlib only.
"""

import argparse
import datetime
import http.client
import json
import random
import socket
import statistics
import sys
import threading
import time
import urllib.parse

BLOCK = 16
WORDS = ("river stone lantern copper meadow violet engine harbor crystal thunder orchard "
         "signal canyon marble falcon ember glacier velvet compass saffron").split()


def sim_tokens(text):
    return (len(text.encode()) + 3) // 4


def sim_cached(text):
    """The simulator's cached tokens for an exact repeat of `text`."""
    n = sim_tokens(text)
    return (n - 1) // BLOCK * BLOCK


def prompt(n_bytes, rng):
    nonce = "%016x " % rng.getrandbits(64)
    words = []
    size = len(nonce)
    while size < n_bytes:
        w = rng.choice(WORDS)
        words.append(w)
        size += len(w) + 1
    return (nonce + " ".join(words))[:n_bytes]


def stream(url, text, max_tokens):
    """One streamed completion. Returns (ttft_ms, e2e_ms, chunk_times_ms, real_prompt_tokens)."""
    u = urllib.parse.urlparse(url)
    body = json.dumps({"prompt": text, "max_tokens": max_tokens, "stream": True,
                       "ignore_eos": True, "temperature": 0, "cache_prompt": True,
                       "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"content-type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit("engine answered %d: %s" % (resp.status, resp.read()[:300]))
    times, real_prompt = [], None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        for choice in event.get("choices") or []:
            if choice.get("text"):
                times.append((time.perf_counter() - t0) * 1000)
        usage = event.get("usage")
        if usage:
            real_prompt = usage.get("prompt_tokens")
    e2e = (time.perf_counter() - t0) * 1000
    conn.close()
    if not times:
        raise SystemExit("no tokens streamed")
    return times[0], e2e, times, real_prompt


def fit_line(xs, ys):
    """y = a + b x by least squares in milliseconds (absolute, not relative: cold prefills of
    seconds are what a benchmark's time is made of; a warm hit's tens of ms matter less);
    a is kept >= 0 (else the line goes through 0)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    a = my - b * mx
    if a < 0:
        a, b = 0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return a, b


def measure(url, rng):
    """Runs every case against the engine. Returns (cases, bytes per real token samples)."""
    stream(url, prompt(300, rng), 2)  # warm the engine up (first-request overheads)
    cases = []  # dicts: kind, bytes, sim_prompt, sim_cached, max_tokens, ttft, e2e, ...
    real_ratio = []

    def single(kind, text, max_tokens, cached):
        ttft, e2e, times, real = stream(url, text, max_tokens)
        if real:
            real_ratio.append(len(text.encode()) / real)
        cases.append({"kind": kind, "bytes": len(text.encode()), "sim_prompt": sim_tokens(text),
                      "sim_cached": cached, "max_tokens": max_tokens,
                      "ttft_ms": round(ttft, 2), "e2e_ms": round(e2e, 2)})
        print("  %-6s %5d B  %4d sim tok  cached %4d  max_tokens %3d  ttft %8.1f ms  e2e %8.1f ms"
              % (kind, len(text.encode()), sim_tokens(text), cached, max_tokens, ttft, e2e),
              flush=True)

    print("cold and warm prompts:")
    for n_bytes in (256, 1024, 2048, 4096, 6144):
        for _ in range(2):
            text = prompt(n_bytes, rng)
            single("cold", text, 1, 0)
            single("warm", text, 1, sim_cached(text))
    print("decode:")
    for max_tokens in (8, 32, 64):
        single("decode", prompt(400, rng), max_tokens, 0)
    print("concurrent pairs:")
    for n_bytes in (400, 2048):
        for _ in range(2):
            texts = [prompt(n_bytes, rng), prompt(n_bytes, rng)]
            results = [None, None]

            def run(i, texts=texts, results=results):
                results[i] = stream(url, texts[i], 32)
            threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            # Sort by TTFT: the first is the one the engine prefilled first.
            ordered = sorted(results, key=lambda r: r[0])
            # Both decode only between the second's first token and the first's last one:
            # the gaps inside that window are the two-running decode steps.
            lo, hi = ordered[1][0], ordered[0][1]
            both = [b - a for r in ordered for a, b in zip(r[2], r[2][1:]) if a >= lo and b <= hi]
            for order, (ttft, e2e, times, _) in enumerate(ordered):
                gaps = [b - a for a, b in zip(times, times[1:])]
                cases.append({"kind": "pair%d" % order, "bytes": n_bytes,
                              "sim_prompt": sim_tokens(texts[0]), "sim_cached": 0,
                              "max_tokens": 32, "ttft_ms": round(ttft, 2), "e2e_ms": round(e2e, 2),
                              "gap_ms": round(statistics.fmean(gaps), 3),
                              "both_running_gap_ms": round(statistics.fmean(both), 3) if both else None,
                              "both_running_gaps": len(both)})
                print("  pair%d  %5d B  ttft %8.1f ms  e2e %8.1f ms  per token %.2f ms, %d steps "
                      "with both running %.2f ms" % (order, n_bytes, ttft, e2e, statistics.fmean(gaps),
                                                     len(both), statistics.fmean(both) if both else 0),
                      flush=True)

    return cases, real_ratio


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="the real llama-server, http://127.0.0.1:PORT")
    ap.add_argument("--out", help="write the calibration JSON here")
    ap.add_argument("--flags", default="-m .cohort/models/gemma-3-270m-q4_k_m.gguf --host 127.0.0.1 "
                    "-c 8192 -np 2 -t 1 --cache-ram 0 --swa-full --metrics "
                    "--chat-template-file data/engines/gemma_chat_template.jinja -a gemma-3-270m",
                    help="the engine's flags, recorded in the file")
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--cases-from", help="refit the cases of an earlier --out file instead of measuring")
    args = ap.parse_args()
    if not (args.url or args.cases_from):
        ap.error("--url (measure) or --cases-from (refit) is required")
    rng = random.Random(args.seed)
    url = (args.url or "").rstrip("/")
    version = None
    try:
        if not url:
            raise ValueError("no engine to ask")
        u = urllib.parse.urlparse(url)
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        c.request("GET", "/props")
        props = json.loads(c.getresponse().read())
        version = props.get("build_info") or props.get("model_path")
    except Exception:  # noqa: BLE001 - the version is informative only
        pass

    if args.cases_from:
        with open(args.cases_from) as f:
            earlier = json.load(f)
        cases = [{k: v for k, v in c.items() if not k.startswith(("pred_", "err_"))}
                 for c in earlier["cases"]]
        real = earlier["engine"].get("bytes_per_real_token")
        real_ratio = [real] if real else []
        version = earlier["engine"].get("version")
        measured_at = earlier.get("measured", earlier.get("date"))
    else:
        cases, real_ratio = measure(url, rng)
        measured_at = None
    singles = [c for c in cases if c["kind"] in ("cold", "warm", "decode")]
    # Each constant from the cases that isolate it: the per-token cost is the slope of the
    # cold TTFTs (what a benchmark's time is made of); the base is what is left of a warm hit
    # (median over the warm cases), so hits are not overcharged by the cold line's intercept.
    cold = [c for c in singles if c["kind"] == "cold"]
    _, per_token = fit_line([c["sim_prompt"] for c in cold], [c["ttft_ms"] for c in cold])
    warm = [c for c in singles if c["kind"] == "warm"]
    base = max(0.0, statistics.median(
        c["ttft_ms"] - per_token * (c["sim_prompt"] - c["sim_cached"]) for c in warm))
    dec = [c for c in singles if c["max_tokens"] > 1]
    decode = (sum((c["e2e_ms"] - c["ttft_ms"]) * (c["max_tokens"] - 1) for c in dec)
              / sum((c["max_tokens"] - 1) ** 2 for c in dec))
    pairs = [c for c in cases if c["kind"].startswith("pair")]
    # Decode steps taken while both ran (falling back to all of a pair's steps if none).
    both = [c["both_running_gap_ms"] if c.get("both_running_gap_ms") else c["gap_ms"] for c in pairs]
    slowdown = max(0.0, statistics.fmean(both) / decode - 1.0)
    constants = {"prefill_base_ms": round(base, 3), "prefill_ms_per_token": round(per_token, 5),
                 "prefill_attention_ms": 0.0, "decode_ms_per_token": round(decode, 3),
                 "decode_batch_slowdown": round(slowdown, 3)}

    def prefill(c):
        return base + per_token * (c["sim_prompt"] - c["sim_cached"])

    # Predictions with the simulator's arithmetic.
    by_pair = {}
    for c in cases:
        if c["kind"] in ("cold", "warm", "decode"):
            ttft = prefill(c)
            e2e = ttft + (c["max_tokens"] - 1) * decode
        else:
            # FIFO lane: the second waits for the first's prefill; both decode slowed.
            lane = prefill(c) if c["kind"] == "pair0" else 2 * prefill(c)
            ttft = lane
            e2e = ttft + (c["max_tokens"] - 1) * decode * (1 + slowdown)
        c["pred_ttft_ms"], c["pred_e2e_ms"] = round(ttft, 2), round(e2e, 2)
        c["err_ttft_pct"] = round(abs(ttft - c["ttft_ms"]) / c["ttft_ms"] * 100, 1)
        c["err_e2e_pct"] = round(abs(e2e - c["e2e_ms"]) / c["e2e_ms"] * 100, 1)
        by_pair.setdefault(c["kind"], []).append(c)

    def summary(key):
        errs = [c[key] for c in cases]
        return {"mean_abs_pct": round(statistics.fmean(errs), 1), "max_abs_pct": max(errs)}

    fit_error = {"ttft": summary("err_ttft_pct"), "e2e": summary("err_e2e_pct"),
                 "per_kind": {k: {"ttft_mean_abs_pct": round(statistics.fmean(c["err_ttft_pct"] for c in v), 1),
                                  "e2e_mean_abs_pct": round(statistics.fmean(c["err_e2e_pct"] for c in v), 1)}
                              for k, v in by_pair.items()},
                 "cases": len(cases)}
    print("\nper case (measured → predicted, abs % error):")
    for c in cases:
        print("  %-6s %4d sim tok cached %4d n %3d  ttft %8.1f → %8.1f (%5.1f%%)  e2e %8.1f → %8.1f (%5.1f%%)"
              % (c["kind"], c["sim_prompt"], c["sim_cached"], c["max_tokens"], c["ttft_ms"],
                 c["pred_ttft_ms"], c["err_ttft_pct"], c["e2e_ms"], c["pred_e2e_ms"], c["err_e2e_pct"]))
    print("\nconstants:", json.dumps(constants))
    print("fit error: TTFT mean %.1f%% max %.1f%%; end-to-end mean %.1f%% max %.1f%%"
          % (fit_error["ttft"]["mean_abs_pct"], fit_error["ttft"]["max_abs_pct"],
             fit_error["e2e"]["mean_abs_pct"], fit_error["e2e"]["max_abs_pct"]))
    doc = {
        "constants": constants,
        "fit_error": fit_error,
        "engine": {"name": "llama-server", "version": version, "flags": args.flags,
                   "url": url, "bytes_per_real_token": round(statistics.fmean(real_ratio), 3)
                   if real_ratio else None},
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "measured": measured_at or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(["python3", "-m", "cohort_tools.bench.engine_sim_calibrate"] + sys.argv[1:]),
        "model": "tokens are simulator tokens (4 bytes of prompt); TTFT = prefill_base_ms + "
                 "prefill_ms_per_token x uncached; each later token decode_ms_per_token x "
                 "(1 + decode_batch_slowdown x (running-1)); one FIFO prefill lane per replica",
        "cases": cases,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        print("wrote", args.out)


if __name__ == "__main__":
    main()
