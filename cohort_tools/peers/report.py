"""The peer benchmark's report: per-run summaries, the issue's goals as ratios, a markdown
table and PNG plots (scripts/bench-peers calls `write(runs, outdir)`).

Why one module: every number in the table, the goals and the plots comes from the same
`summarise`, so a ratio in the goals table can be traced to the row it came from.

A run dict (made by the runner): contender, replicas, workload, arrival, engine
("sim"|"llama"), calibration (dict|None), pooled_bound (hit ratio of one cache of the same
total capacity, or None), duration_s, records (one per request: id, group, step, t_sched,
t_sent, status, error, ttft_ms, e2e_ms, replica, prompt_tokens, cached_tokens,
completion_tokens, engine_ttft_ms) and engine_metrics {replica: {prompt_tokens, hit_tokens,
requests}} (engine-reported deltas over the run). Optional: time_scale, window_s (see below).

Definitions (`summarise`):
- ok requests: status 200 and no error; latency percentiles and usage use only those.
- hit ratio: sum(hit_tokens) / sum(prompt_tokens) over engine_metrics (engine-reported); when
  the engines reported no prompt tokens, sum(cached_tokens) / sum(prompt_tokens) of the
  responses' usage ("usage"). Computed prompt tokens = prompt - hit (what the engines ran).
- percentiles: linear interpolation between closest ranks (numpy's default), in ms.
- throughput: ok requests / duration_s, completion and prompt tokens / duration_s.
- replica load: the work of a request is its prompt tokens (usage), charged to the replica
  that served it at its scheduled arrival time t_sched. Windowed max/mean = sum over windows
  of (max replica work) / sum over windows of (mean replica work), i.e. the work-weighted
  mean of each window's max/mean, so idle windows weigh nothing. The mean is over all
  replicas (max(run replicas, replicas seen)), idle ones count as 0. Window W = the run's
  window_s if given, else 10 s x the run's time_scale (default 1: the workload clock is
  compressed by it, so W covers the same share of the trace), shrunk to duration_s / 3 for
  runs shorter than three windows. Whole-run max/mean is the same over one window.
- added latency: median of (client TTFT - engine_ttft_ms) where the engine reported its TTFT:
  what the router or filter (and the network hop) add before the first token.
- steps: per step label, n and TTFT/e2e p95. The step ramp's holds are "L1".."L4"; ramps
  carry "/up" and "/down" and are left out of the step goal and plot.

Goals (`goals`), per (workload, arrival, replicas, engine), for each Cohort contender
present (cohort-affinity, cohort-assign, cohort-batch, cohort-epp):
- hit ratio / pooled bound >= 0.99, and hit ratio / sglang-cache-aware's >= 1.1, each met
  only when the contender's windowed max/mean load <= 1.2 too (the issue: "at windowed
  max/mean load <= 1.2"); the load is also its own row;
- TTFT p90 / envoy-rr's <= 0.5 and TTFT p90 / sglang-cache-aware's <= 0.8;
- batch mode (step arrivals): cohort-batch's TTFT p95 within +-10% of its first hold's
  across the holds (value: the largest |p95_i / p95_L1 - 1|), while envoy-rr's at least
  doubles (value: max p95_i / p95_L1).
- exact residency (cohort-epp-events, the picker following the engines' KV events): hit
  ratio / sglang-cache-aware's >= 1.1 and hit ratio / cohort-epp's (the same picker on its
  modelled residency) >= 1.0, without the load condition (the cache-pressure preset's goal
  rows). On real vLLM engines (engine "vllm") these two are the only rows of the sglang and
  pooled kind; instead, for each Cohort contender: cached tokens / envoy-rr's >= 1.3 (the
  engines' prefix-cache hit tokens, the same request list for all), TTFT p50 and p95 /
  envoy-rr's < 1.
A goal whose baseline is missing (no pooled bound, no envoy-rr or sglang run in the group)
is listed as N/A.

Under each group's table a ratios table puts every contender against round-robin,
sglang-cache-aware and cohort-epp (the modelled residency) on hits and TTFT.
Python 3 stdlib; matplotlib only for the plots, imported lazily.
"""
import json
import math
import os
import re
import statistics
import sys
from pathlib import Path

from cohort_tools.stack import percentile

CONTENDERS = [
    "envoy-rr",
    "envoy-ringhash",
    "sglang-cache-aware",
    "vllm-cache-aware",
    "vllm-consistent-hash",
    "cohort-affinity",
    "cohort-assign",
    "cohort-batch",
    "cohort-epp",
    "cohort-epp-events",
]
COHORT = ["cohort-affinity", "cohort-assign", "cohort-batch", "cohort-epp", "cohort-epp-events"]
RR = "envoy-rr"
SGLANG = "sglang-cache-aware"
BATCH = "cohort-batch"
MODELLED = "cohort-epp"
EVENTS = "cohort-epp-events"

POOLED_MIN = 0.99
SGLANG_HIT_MIN = 1.1
LOAD_MAX = 1.2
RR_TTFT_MAX = 0.5
SGLANG_TTFT_MAX = 0.8
STEP_SPREAD_MAX = 0.10
RR_STEP_GROWTH_MIN = 2.0
DEFAULT_WINDOW_S = 10.0
EVENTS_SGLANG_HIT_MIN = 1.1
EVENTS_MODELLED_HIT_MIN = 1.0
VLLM_RR_CACHED_MIN = 1.3
VLLM_RR_TTFT_BELOW = 1.0


def _ok(rec):
    return rec.get("status") == 200 and not rec.get("error")


def window_s(run):
    """The load window W in seconds (see the module docstring)."""
    if run.get("window_s"):
        return float(run["window_s"])
    w = DEFAULT_WINDOW_S * float(run.get("time_scale") or 1.0)
    d = float(run.get("duration_s") or 0.0)
    if 0 < d < 3 * w:
        return d / 3.0
    return w


def _load_ratios(run, ok):
    """(windowed max/mean, whole-run max/mean) of prompt-token work per replica."""
    seen = {r["replica"] for r in ok if r.get("replica")} | set(run.get("engine_metrics") or {})
    nrep = max(int(run.get("replicas") or 0), len(seen))
    if nrep == 0:
        return None, None
    w = window_s(run)
    windows = {}
    whole = {}
    for r in ok:
        if not r.get("replica") or not r.get("prompt_tokens"):
            continue
        idx = int(math.floor(float(r.get("t_sched") or 0.0) / w))
        per = windows.setdefault(idx, {})
        per[r["replica"]] = per.get(r["replica"], 0) + r["prompt_tokens"]
        whole[r["replica"]] = whole.get(r["replica"], 0) + r["prompt_tokens"]
    if not whole:
        return None, None
    sum_max = sum(max(per.values()) for per in windows.values())
    sum_mean = sum(sum(per.values()) / nrep for per in windows.values())
    windowed = sum_max / sum_mean
    overall = max(whole.values()) / (sum(whole.values()) / nrep)
    return windowed, overall


def _step_order(label):
    m = re.match(r"L(\d+)(?:/(up|down))?$", label)
    if not m:
        return (math.inf, 0, label)
    return (int(m.group(1)), {"up": 0, None: 1, "down": 2}[m.group(2)], label)


def summarise(run):
    """The numbers of one run (see the module docstring for each definition)."""
    recs = run.get("records") or []
    ok = [r for r in recs if _ok(r)]
    em = run.get("engine_metrics") or {}
    e_prompt = sum((m.get("prompt_tokens") or 0) for m in em.values())
    e_hit = sum((m.get("hit_tokens") or 0) for m in em.values())
    u_prompt = sum((r.get("prompt_tokens") or 0) for r in ok)
    u_hit = sum((r.get("cached_tokens") or 0) for r in ok)
    if e_prompt > 0:
        prompt, hit, source = e_prompt, e_hit, "engine"
    elif u_prompt > 0:
        prompt, hit, source = u_prompt, u_hit, "usage"
    else:
        prompt, hit, source = 0, 0, None
    hit_ratio = hit / prompt if prompt else None
    pooled = run.get("pooled_bound")
    duration = float(run.get("duration_s") or 0.0)
    ttft = [r.get("ttft_ms") for r in ok]
    e2e = [r.get("e2e_ms") for r in ok]
    added = [
        r["ttft_ms"] - r["engine_ttft_ms"]
        for r in ok
        if r.get("ttft_ms") is not None and r.get("engine_ttft_ms") is not None
    ]
    windowed, overall = _load_ratios(run, ok)
    steps = {}
    for label in sorted({r["step"] for r in ok if r.get("step")}, key=_step_order):
        rs = [r for r in ok if r.get("step") == label]
        steps[label] = {
            "n": len(rs),
            "ttft_p95": percentile([r.get("ttft_ms") for r in rs], 0.95, interpolate=True),
            "e2e_p95": percentile([r.get("e2e_ms") for r in rs], 0.95, interpolate=True),
        }
    completion = sum((r.get("completion_tokens") or 0) for r in ok)
    return {
        "contender": run.get("contender"),
        "workload": run.get("workload"),
        "arrival": run.get("arrival"),
        "replicas": run.get("replicas"),
        "engine": run.get("engine"),
        "calibration": run.get("calibration"),
        "fleet": run.get("fleet"),
        "kv_events": run.get("kv_events") or {},
        "residency": run.get("residency") or {},
        "duration_s": duration,
        "window_s": window_s(run),
        "n": len(recs),
        "ok": len(ok),
        "errors": len(recs) - len(ok),
        "error_rate": (len(recs) - len(ok)) / len(recs) if recs else 0.0,
        "hit_ratio": hit_ratio,
        "hit_source": source,
        "prompt_tokens": prompt,
        "hit_tokens": hit,
        "usage_cached_tokens": u_hit,
        "computed_prompt_tokens": prompt - hit,
        "pooled_bound": pooled,
        "vs_pooled": hit_ratio / pooled if hit_ratio is not None and pooled else None,
        "ttft_p50": percentile(ttft, 0.5, interpolate=True),
        "ttft_p90": percentile(ttft, 0.9, interpolate=True),
        "ttft_p95": percentile(ttft, 0.95, interpolate=True),
        "ttft_p99": percentile(ttft, 0.99, interpolate=True),
        "e2e_p50": percentile(e2e, 0.5, interpolate=True),
        "e2e_p95": percentile(e2e, 0.95, interpolate=True),
        "e2e_p99": percentile(e2e, 0.99, interpolate=True),
        "req_per_s": len(ok) / duration if duration > 0 else None,
        "output_tok_per_s": completion / duration if duration > 0 else None,
        "prompt_tok_per_s": u_prompt / duration if duration > 0 else None,
        "load_max_mean_windowed": windowed,
        "load_max_mean_run": overall,
        "added_ms": statistics.median(added) if added else None,
        "added_n": len(added),
        "steps": steps,
    }


def _group_key(s):
    return (str(s.get("workload")), str(s.get("arrival")), int(s.get("replicas") or 0), str(s.get("engine")))


def _group_label(key):
    workload, arrival, replicas, engine = key
    return f"{workload} · {arrival} · {replicas} replicas · {engine}"


def _ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def _row(goal, key, contender, value, target, met, detail=""):
    return {
        "goal": goal,
        "group": _group_label(key),
        "contender": contender,
        "value": value,
        "target": target,
        "met": met if value is not None else None,
        "detail": detail,
    }


def _holds(s):
    return [(k, v["ttft_p95"]) for k, v in s.get("steps", {}).items() if "/" not in k and v["ttft_p95"] is not None]


def goals(summaries):
    """Goal rows {goal, group, contender, value, target, met (True/False/None=N/A), detail}."""
    groups = {}
    for s in summaries:
        groups.setdefault(_group_key(s), {})[s["contender"]] = s
    rows = []
    for key in sorted(groups):
        by = groups[key]
        rr, sg = by.get(RR), by.get(SGLANG)
        rows += _events_goals(key, by)
        if key[3] == "vllm":
            rows += _vllm_goals(key, by)
            continue
        for c in COHORT:
            s = by.get(c)
            if s is None:
                continue
            load = s["load_max_mean_windowed"]
            load_ok = load is not None and load <= LOAD_MAX
            lt = f"load {_fmt(load, 2)}"
            pooled = s.get("pooled_bound")
            v = _ratio(s["hit_ratio"], pooled)
            rows.append(
                _row(
                    "prefix hit ratio vs pooled-cache bound",
                    key,
                    c,
                    v,
                    f">= {POOLED_MIN} (at load <= {LOAD_MAX})",
                    v is not None and v >= POOLED_MIN and load_ok,
                    f"hit {_fmt(s['hit_ratio'])} / bound {_fmt(pooled)}; {lt}" if pooled else "no pooled bound",
                )
            )
            v = _ratio(s["hit_ratio"], sg and sg["hit_ratio"])
            rows.append(
                _row(
                    "prefix hit ratio vs sglang-cache-aware",
                    key,
                    c,
                    v,
                    f">= {SGLANG_HIT_MIN} (at load <= {LOAD_MAX})",
                    v is not None and v >= SGLANG_HIT_MIN and load_ok,
                    (f"hit {_fmt(s['hit_ratio'])} / {_fmt(sg['hit_ratio'])}; {lt}" if sg
                     else "no sglang-cache-aware run"),
                )
            )
            rows.append(
                _row("windowed max/mean replica load", key, c, load, f"<= {LOAD_MAX}", load_ok,
                     f"W = {_fmt(s['window_s'], 2)} s")
            )
            v = _ratio(s["ttft_p90"], rr and rr["ttft_p90"])
            rows.append(
                _row(
                    "TTFT p90 vs round-robin",
                    key,
                    c,
                    v,
                    f"<= {RR_TTFT_MAX}",
                    v is not None and v <= RR_TTFT_MAX,
                    f"{_fmt(s['ttft_p90'], 1)} / {_fmt(rr['ttft_p90'], 1)} ms" if rr else "no envoy-rr run",
                )
            )
            v = _ratio(s["ttft_p90"], sg and sg["ttft_p90"])
            rows.append(
                _row(
                    "TTFT p90 vs sglang-cache-aware",
                    key,
                    c,
                    v,
                    f"<= {SGLANG_TTFT_MAX}",
                    v is not None and v <= SGLANG_TTFT_MAX,
                    f"{_fmt(s['ttft_p90'], 1)} / {_fmt(sg['ttft_p90'], 1)} ms" if sg else "no sglang-cache-aware run",
                )
            )
        b = by.get(BATCH)
        if b is not None and _holds(b):
            holds = _holds(b)
            base = holds[0][1]
            v = max(abs(p / base - 1.0) for _, p in holds) if base else None
            rows.append(
                _row(
                    "batch TTFT p95 flat across load steps",
                    key,
                    BATCH,
                    v,
                    f"<= {STEP_SPREAD_MAX} (max abs(p95/p95_L1 - 1))",
                    v is not None and v <= STEP_SPREAD_MAX,
                    ", ".join(f"{k} {_fmt(p, 1)}" for k, p in holds) + " ms",
                )
            )
            rh = _holds(rr) if rr else []
            v = max(p for _, p in rh) / rh[0][1] if rh and rh[0][1] else None
            rows.append(
                _row(
                    "round-robin TTFT p95 grows across load steps",
                    key,
                    RR,
                    v,
                    f">= {RR_STEP_GROWTH_MIN} (max p95/p95_L1)",
                    v is not None and v >= RR_STEP_GROWTH_MIN,
                    ", ".join(f"{k} {_fmt(p, 1)}" for k, p in rh) + " ms" if rh else "no envoy-rr step run",
                )
            )
    return rows


def _events_goals(key, by):
    """The exact-residency rows: cohort-epp-events against sglang-cache-aware and cohort-epp."""
    s = by.get(EVENTS)
    if s is None:
        return []
    rows = []
    for goal, base_name, target in (("exact residency: hit ratio vs sglang-cache-aware", SGLANG, EVENTS_SGLANG_HIT_MIN),
                                    ("exact residency: hit ratio vs modelled (cohort-epp)", MODELLED,
                                     EVENTS_MODELLED_HIT_MIN)):
        base = by.get(base_name)
        v = _ratio(s["hit_ratio"], base and base["hit_ratio"])
        rows.append(_row(goal, key, EVENTS, v, f">= {target}", v is not None and v >= target,
                         f"hit {_fmt(s['hit_ratio'])} / {_fmt(base['hit_ratio'])}" if base else f"no {base_name} run"))
    return rows


def _vllm_goals(key, by):
    """The real vLLM fleet's rows: cached tokens and TTFT p50/p95 against round-robin's."""
    rr = by.get(RR)
    rows = []
    for c in COHORT:
        s = by.get(c)
        if s is None:
            continue
        v = _ratio(s["hit_tokens"], rr and rr["hit_tokens"])
        rows.append(_row("cached tokens vs round-robin", key, c, v, f">= {VLLM_RR_CACHED_MIN}",
                         v is not None and v >= VLLM_RR_CACHED_MIN,
                         f"{s['hit_tokens']:.0f} / {rr['hit_tokens']:.0f} tokens" if rr else "no envoy-rr run"))
        for q in ("p50", "p95"):
            v = _ratio(s[f"ttft_{q}"], rr and rr[f"ttft_{q}"])
            rows.append(_row(f"TTFT {q} vs round-robin", key, c, v, f"< {VLLM_RR_TTFT_BELOW}",
                             v is not None and v < VLLM_RR_TTFT_BELOW,
                             f"{_fmt(s[f'ttft_{q}'], 1)} / {_fmt(rr[f'ttft_{q}'], 1)} ms" if rr else "no envoy-rr run"))
    return rows


def ratios(ss):
    """Per contender of one group: its hits and TTFT against round-robin's, sglang-router's and
    the modelled picker's (cohort-epp) in the same group; None where a baseline is missing."""
    by = {s["contender"]: s for s in ss}
    rr, sg, mod = by.get(RR), by.get(SGLANG), by.get(MODELLED)
    out = {}
    for s in ss:
        out[s["contender"]] = {
            "hit_vs_sglang": _ratio(s["hit_ratio"], sg and sg["hit_ratio"]),
            "hit_vs_modelled": _ratio(s["hit_ratio"], mod and mod["hit_ratio"]),
            "cached_vs_rr": _ratio(s["hit_tokens"], rr and rr["hit_tokens"]),
            "ttft_p50_vs_rr": _ratio(s["ttft_p50"], rr and rr["ttft_p50"]),
            "ttft_p90_vs_rr": _ratio(s["ttft_p90"], rr and rr["ttft_p90"]),
            "ttft_p95_vs_rr": _ratio(s["ttft_p95"], rr and rr["ttft_p95"]),
            "ttft_p90_vs_sglang": _ratio(s["ttft_p90"], sg and sg["ttft_p90"]),
        }
    return out


def _fmt(x, digits=3):
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _verdict(met):
    return "N/A" if met is None else ("MET" if met else "**MISSED**")


def _order(contender):
    return (CONTENDERS.index(contender) if contender in CONTENDERS else len(CONTENDERS), str(contender))


def markdown(runs, summaries=None):
    """One table per (workload, arrival, replicas, engine), a step table where there are load
    steps, then the goals table (MET / MISSED / N/A)."""
    summaries = summaries if summaries is not None else [summarise(r) for r in runs]
    groups = {}
    for s in summaries:
        groups.setdefault(_group_key(s), []).append(s)
    out = []
    for key in sorted(groups):
        ss = sorted(groups[key], key=lambda s: _order(s["contender"]))
        out.append(f"### {_group_label(key)}\n")
        pooled = next((s["pooled_bound"] for s in ss if s.get("pooled_bound") is not None), None)
        out.append(f"Pooled-cache bound (one cache of the same total capacity): {_fmt(pooled)}; "
                   f"load window W = {_fmt(ss[0]['window_s'], 2)} s.\n")
        out.append(
            "| contender | ok / err | hit ratio | ÷ pooled | computed prompt tok | TTFT p50 | p90 | p95 | p99 ms "
            "| e2e p50 | p95 | p99 ms | req/s | out tok/s | load max/mean (windowed / run) | added ms |"
        )
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for s in ss:
            src = f" ({s['hit_source']})" if s["hit_source"] == "usage" else ""
            out.append(
                f"| {s['contender']} | {s['ok']} / {s['errors']} | {_fmt(s['hit_ratio'])}{src} "
                f"| {_fmt(s['vs_pooled'])} "
                f"| {s['computed_prompt_tokens']} | {_fmt(s['ttft_p50'], 1)} | {_fmt(s['ttft_p90'], 1)} "
                f"| {_fmt(s['ttft_p95'], 1)} | {_fmt(s['ttft_p99'], 1)} | {_fmt(s['e2e_p50'], 1)} "
                f"| {_fmt(s['e2e_p95'], 1)} | {_fmt(s['e2e_p99'], 1)} | {_fmt(s['req_per_s'], 2)} "
                f"| {_fmt(s['output_tok_per_s'], 1)} | {_fmt(s['load_max_mean_windowed'], 2)} / "
                f"{_fmt(s['load_max_mean_run'], 2)} | {_fmt(s['added_ms'], 2)} |"
            )
        if len(ss) > 1:
            rt = ratios(ss)
            out.append("\n| contender | hit ÷ pooled | hit ÷ sglang | hit ÷ modelled (cohort-epp) | cached tok "
                       "(engine / usage) | cached ÷ rr | TTFT p50 ÷ rr | p90 ÷ rr | p95 ÷ rr | p90 ÷ sglang |")
            out.append("|---|---|---|---|---|---|---|---|---|---|")
            for s in ss:
                r = rt[s["contender"]]
                out.append(
                    f"| {s['contender']} | {_fmt(s['vs_pooled'])} | {_fmt(r['hit_vs_sglang'])} "
                    f"| {_fmt(r['hit_vs_modelled'])} | {s['hit_tokens']:.0f} / {s['usage_cached_tokens']:.0f} "
                    f"| {_fmt(r['cached_vs_rr'])} | {_fmt(r['ttft_p50_vs_rr'])} | {_fmt(r['ttft_p90_vs_rr'])} "
                    f"| {_fmt(r['ttft_p95_vs_rr'])} | {_fmt(r['ttft_p90_vs_sglang'])} |"
                )
        labels = sorted({k for s in ss for k in s["steps"] if "/" not in k}, key=_step_order)
        if labels:
            out.append("\nTTFT p95 (ms) per load step (holds):\n")
            out.append("| contender | " + " | ".join(labels) + " |")
            out.append("|---|" + "---|" * len(labels))
            for s in ss:
                cells = [_fmt(s["steps"].get(k, {}).get("ttft_p95"), 1) for k in labels]
                out.append(f"| {s['contender']} | " + " | ".join(cells) + " |")
        cals = {}
        for s in ss:
            if s.get("calibration"):
                cals.setdefault(json.dumps(s["calibration"], sort_keys=True), []).append(s["contender"])
        for cal, names in cals.items():
            who = "all contenders" if len(names) == len(ss) else ", ".join(names)
            out.append(f"\nEngine calibration ({who}): `{cal}`")
        for s in ss:
            if s.get("kv_events"):
                cells = []
                for replica, m in sorted(s["kv_events"].items()):
                    state = "healthy" if m.get("healthy") else "DEGRADED"
                    state += "" if m.get("complete", 1) else ", incomplete"
                    cells.append(f"{replica} {state}, {m.get('blocks_held', 0):.0f} blocks held, "
                                 f"{m.get('applied_total', 0):.0f} batches, {m.get('replays_total', 0):.0f} replays, "
                                 f"{m.get('gaps_lost_total', 0):.0f} gaps lost")
                out.append(f"\nKV events at the end of {s['contender']}'s run: " + "; ".join(cells))
                res = s.get("residency") or {}
                if res:
                    parts = [f"{what} {', '.join(f'{k} {v:.0f}' for k, v in sorted(res[what].items()))}"
                             for what in ("decisions", "prompts") if res.get(what)]
                    out.append(f"(residency used: {'; '.join(parts)})")
        fleets = [(s["contender"], s["fleet"]) for s in ss if s.get("fleet")]
        if fleets:
            first = {k: v for k, v in fleets[0][1].items() if k != "memory_mib"}
            out.append(f"\nvLLM fleet: `{json.dumps(first, sort_keys=True)}`; resident memory per replica after "
                       "each run, MiB: " + "; ".join(f"{c} {f.get('memory_mib')}" for c, f in fleets))
        out.append("")
    rows = goals(summaries)
    out.append("## Goals\n")
    if not rows:
        out.append("No Cohort contender ran: no goals to check.\n")
        return "\n".join(out)
    met = sum(1 for r in rows if r["met"] is True)
    missed = sum(1 for r in rows if r["met"] is False)
    na = sum(1 for r in rows if r["met"] is None)
    out.append(f"{met} met, {missed} missed, {na} not measurable (N/A).\n")
    out.append("| goal | group | contender | value | target | result | detail |")
    out.append("|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [r["goal"], r["group"], r["contender"], _fmt(r["value"]), r["target"], _verdict(r["met"]), r["detail"]]
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    out.append("")
    return "\n".join(out)


def _legend(ax):
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def _slug(*parts):
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", "_".join(str(p) for p in parts)).strip("-")


def plots(runs, outdir, summaries=None):
    """Write the PNGs under outdir; returns their paths ([] and a note on stderr without
    matplotlib): ttft_cdf_*.png per (workload, arrival, replicas, engine), hit_vs_replicas_*.png
    per (workload, arrival, engine), p95_vs_step_*.png per group with load steps."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: matplotlib not installed: plots skipped (tables written)", file=sys.stderr)
        return []
    summaries = summaries if summaries is not None else [summarise(r) for r in runs]
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    paths = []

    by_group = {}
    for run in runs:
        by_group.setdefault(_group_key(run), []).append(run)
    for key, rs in sorted(by_group.items()):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        lo, hi = math.inf, 0.0
        for run in sorted(rs, key=lambda r: _order(r["contender"])):
            xs = sorted(r["ttft_ms"] for r in run.get("records") or [] if _ok(r) and r.get("ttft_ms") is not None)
            if not xs:
                continue
            lo, hi = min(lo, xs[0]), max(hi, xs[-1])
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=run["contender"])
        if hi > 0 and lo > 0 and hi / lo > 50:
            ax.set_xscale("log")
        ax.set_xlabel("TTFT (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"TTFT CDF: {_group_label(key)}", fontsize=9)
        ax.grid(alpha=0.3)
        _legend(ax)
        p = outdir / f"ttft_cdf_{_slug(*key)}.png"
        fig.tight_layout()
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(str(p))

    by_wl = {}
    for s in summaries:
        workload, arrival, replicas, engine = _group_key(s)
        by_wl.setdefault((workload, arrival, engine), []).append(s)
    for key, ss in sorted(by_wl.items()):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        per = {}
        for s in ss:
            if s["hit_ratio"] is not None:
                per.setdefault(s["contender"], []).append((s["replicas"], s["hit_ratio"]))
        for c in sorted(per, key=_order):
            pts = sorted(per[c])
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=c)
        bound = sorted({(s["replicas"], s["pooled_bound"]) for s in ss if s.get("pooled_bound") is not None})
        if bound:
            ax.plot([b[0] for b in bound], [b[1] for b in bound], "k--", label="pooled-cache bound")
        ax.set_xlabel("replicas")
        ax.set_ylabel("prefix-cache hit ratio (engine-reported)")
        ax.set_ylim(0, 1)
        ax.set_xticks(sorted({s["replicas"] for s in ss}))
        ax.set_title(f"Hit ratio vs replicas: {' · '.join(map(str, key))}", fontsize=9)
        ax.grid(alpha=0.3)
        _legend(ax)
        p = outdir / f"hit_vs_replicas_{_slug(*key)}.png"
        fig.tight_layout()
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(str(p))

    by_group = {}
    for s in summaries:
        if _holds(s):
            by_group.setdefault(_group_key(s), []).append(s)
    for key, ss in sorted(by_group.items()):
        labels = sorted({k for s in ss for k, _ in _holds(s)}, key=_step_order)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for s in sorted(ss, key=lambda s: _order(s["contender"])):
            h = dict(_holds(s))
            ax.plot(labels, [h.get(k, float("nan")) for k in labels], marker="o", label=s["contender"])
        ax.set_xlabel("load step (hold)")
        ax.set_ylabel("TTFT p95 (ms)")
        ax.set_title(f"TTFT p95 vs load step: {_group_label(key)}", fontsize=9)
        ax.grid(alpha=0.3)
        _legend(ax)
        p = outdir / f"p95_vs_step_{_slug(*key)}.png"
        fig.tight_layout()
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(str(p))
    return paths


def write(runs, outdir):
    """results.json (summaries, goals, runs), table.md and the PNGs under outdir; returns
    {"json", "table", "plots"} paths."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    summaries = [summarise(r) for r in runs]
    rows = goals(summaries)
    jpath = outdir / "results.json"
    tmp = jpath.with_suffix(".json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"summaries": summaries, "goals": rows, "runs": runs}, f, indent=1, default=str)
    os.replace(tmp, jpath)
    tpath = outdir / "table.md"
    tpath.write_text(markdown(runs, summaries), encoding="utf-8")
    return {"json": str(jpath), "table": str(tpath), "plots": plots(runs, outdir, summaries)}


def main(argv=None):
    """`python3 -m cohort_tools.peers.report RESULTS.json [OUTDIR]`: rebuild table.md and the PNGs
    from a results.json (its "runs")."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(main.__doc__, file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        runs = json.load(f)["runs"]
    outdir = argv[1] if len(argv) > 1 else os.path.dirname(os.path.abspath(argv[0]))
    paths = write(runs, outdir)
    print(json.dumps(paths, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
