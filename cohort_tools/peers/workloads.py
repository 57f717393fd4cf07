"""Workload generators for the peer benchmark (scripts/bench-peers): real data turned into
timed OpenAI chat requests, so every contender (Envoy, sglang-router, vllm-router, Cohort)
is replayed the same, deterministic request list.

Why: a router's prefix-cache hit ratio, TTFT and balance depend on how requests share
prefixes and how they arrive. These generators keep the sharing of the real data (Mooncake
`hash_ids`, ShareGPT conversations, real system prompts) and offer the arrival shapes the
issue asks for. Everything here is Python 3 stdlib, reads only the project's data/ folder
and is deterministic for a seed.

A request (`Request`) is a dict:
  id      int, 0.. in arrival order
  t       float, seconds from the start of the run (arrival time; the harness is open loop)
  body    OpenAI chat request: model "sim-model" (the runner overwrites it), messages,
          max_tokens, stream True, stream_options {"include_usage": True}
  headers dict: "x-prefix-hash" (16 hex digits of SHA-256 of the first 512 bytes of the
          rendered prompt, for the "Envoy ring_hash on a first-block header" contender:
          what a user would do without Cohort) and, for multi-turn, "x-session-id"
  group   str: the prefix group for analysis: Mooncake's first block (or first two blocks
          when the first is the trace-wide root, as in the conversation trace), the
          ShareGPT session, the templated app, the Azure request
  step    str|None: load-step label of the step ramp (see `step_rates`), else None

The rendered prompt (`render`) is engine-sim's: "<role>\\n<content>\\n" per message; the
simulator counts one token per 4 bytes of it (so 16-token cache blocks are 64 bytes).

Workloads (`NAMES`, `describe`):
  mooncake-conv      data/traces/mooncake_conversation_trace.jsonl (Mooncake, Apache-2.0).
  mooncake-synth     data/traces/mooncake_synthetic_trace.jsonl.gz (the whole trace, gzipped:
      3,993 requests over 1,022 s; its reuse grows along the trace: the infinite-cache
      block hit ratio is 0.24 over the first 1,500 rows and 0.64 over all).
      Each hash_id is a 512-token block of the trace; it becomes a deterministic block of
      word-like ASCII text of 512 x 4 x scale_tokens bytes (2,048 bytes at scale 1) that
      starts with a tag naming the id, so two prompts share a text prefix exactly where their
      hash_id lists share a prefix (at scale 1 a block is 32 of the simulator's 64-byte
      cache blocks). The prompt is one user message, the concatenation of its blocks, the
      last one cut so the rendered prompt is input_length x 4 x scale_tokens bytes
      (input_length x scale_tokens simulator tokens). output_length -> max_tokens (capped
      by `max_tokens`). Arrival "trace": timestamp (ms) x time_scale. Pass n or duration_s
      for mooncake-conv: its whole trace is 12,031 requests, about 580 MB of text at scale 1.
  azure-conv         data/traces/azure_llm_inference_2023_conv_first3000.csv (Azure 2023,
      CC-BY-4.0): arrivals and lengths (rendered prompt = ContextTokens x 4 x scale_tokens
      bytes, GeneratedTokens -> max_tokens); the text is unique random words after a tag
      naming the row (no shared prefix beyond chance): it measures load, not caching.
  sharegpt-multiturn data/prompts/sharegpt_v3_multiturn_subset.jsonl (ShareGPT V3,
      Apache-2.0): each conversation is a session replayed turn by turn as a growing prefix
      (turn k = all earlier human+gpt turns + human turn k). The arrival process gives each
      session's start; turn k arrives at start + the sum of k-1 think times (exponential,
      mean THINK_S x time_scale). Sessions interleave. scale_tokens < 1 cuts every message
      to that fraction of its characters (the same cut in every turn, so prefixes still grow).
  templated-app      K = 12 apps: the real system prompts of data/bench/system_prompts_long.jsonl
      (awesome-chatgpt-prompts, CC0-1.0), app i's prompt repeated 2 + i % 3 times (long
      shared prefixes; scale_tokens scales that length) x Banking77 user turns
      (data/intent/banking77_train.csv, CC-BY-4.0). App popularity is Zipf (s = 1.1).

Arrival processes (`arrival=`):
  trace    the data's own timestamps x time_scale (Mooncake, Azure). Workloads without
           timestamps (ShareGPT, templated) use poisson instead.
  poisson  exponential gaps, mean 1/rate (rate in requests/s; default DEFAULT_RATE).
  bursty   bursts: each burst is 1 + Geometric(mean 2) requests of ONE group (the same
           app, Mooncake prefix group, Azure request...; fewer when the group runs out),
           spread uniformly over 100 ms x time_scale; the group is drawn in proportion to
           its remaining requests. Burst epochs are a Gamma renewal process with CV = 3
           (shape 1/9), its gaps rescaled so the request list's mean rate is exactly `rate`.
           For ShareGPT the units are sessions (bursts of session starts).
  step     a step ramp: levels rate x STEP_LEVELS (0.25, 0.5, 0.75, 1.0), one after another.
           Each level is a trapezoid: 10 s linear ramp up from 0, 30 s hold, 10 s linear
           ramp down to 0 (all x time_scale; 200 s x time_scale in all), arrivals a
           non-homogeneous Poisson process (ShareGPT: of session starts). Each request is
           labelled by its own arrival time: "L1".."L4" during the holds, "L1/up",
           "L1/down", ... on the ramps (the report compares the holds); a ShareGPT turn
           that arrives after the ramp's end is labelled "L4/down". The ramp bounds the
           run, so templated-app needs no n here.

`n` caps the number of requests, `duration_s` drops arrivals at or after it. A workload ends
early when its data runs out (no wrap-around: repeating a trace would invent cache hits).
Without n and duration_s, templated-app (unbounded) makes DEFAULT_N requests.
`salt` (optional, default "") goes in front of every prompt's first bytes (Mooncake and
Azure tags, ShareGPT's first user turn, the templated system prompts) and in the session
ids, so runs with different salts on the same engines never hit each other's cache.
"""
import csv
import datetime
import functools
import gzip
import hashlib
import json
import random
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "data"

NAMES = ["mooncake-conv", "mooncake-synth", "azure-conv", "sharegpt-multiturn", "templated-app"]
ARRIVALS = ["trace", "poisson", "bursty", "step"]

TOKENS_PER_BLOCK = 512  # Mooncake: one hash_id per 512 tokens
BYTES_PER_TOKEN = 4  # the simulator's tokenizer
PREFIX_HASH_BYTES = 512
DEFAULT_RATE = 4.0
DEFAULT_N = 1000
THINK_S = 8.0
BURST_CV = 3.0
BURST_MEAN_EXTRA = 2.0  # a burst has 1 + Geometric(mean 2) = mean 3 requests
BURST_SPREAD_S = 0.1
STEP_LEVELS = (0.25, 0.5, 0.75, 1.0)
STEP_UP_S, STEP_HOLD_S, STEP_DOWN_S = 10.0, 30.0, 10.0
ZIPF_S = 1.1

_DESCRIPTIONS = {
    "mooncake-conv": ("Mooncake conversation trace (1 h real traffic): hash_id blocks -> shared text prefixes, "
                      "real arrivals and lengths"),
    "mooncake-synth": ("Mooncake synthetic trace (3,993 rows): heavy prefix reuse (infinite-cache block hit 0.64 "
                       "over the whole trace), arrivals and lengths"),
    "azure-conv": ("Azure LLM inference 2023 conv (first 3,000 rows): real arrivals and lengths, unique text "
                   "(load, not caching)"),
    "sharegpt-multiturn": ("ShareGPT V3 conversations (100, >= 2 human turns) replayed turn by turn as growing "
                           "prefixes, sessions interleaved"),
    "templated-app": "12 apps (real long system prompts x2-4) x Banking77 user turns, Zipf app popularity",
}


class WorkloadError(ValueError):
    """An unknown workload or arrival name, or arguments that cannot make a request list."""


def describe(name):
    """One line saying what workload `name` is."""
    if name not in _DESCRIPTIONS:
        raise WorkloadError(f"unknown workload {name!r}; known: {', '.join(NAMES)}")
    return _DESCRIPTIONS[name]


def render(messages):
    """The prompt exactly as engine-sim renders it: "<role>\n<content>\n" per message,
    concatenated (engine-sim/src/render.rs); one token per 4 bytes of it, rounded up."""
    return "".join(f"{m['role']}\n{m['content']}\n" for m in messages)


def prompt_tokens(messages):
    """The simulator's prompt token count: ceil(rendered bytes / 4)."""
    return -(-len(render(messages).encode("utf-8")) // BYTES_PER_TOKEN)


USER_FRAME = len(render([{"role": "user", "content": ""}]))  # "user\n" + "\n"


def prefix_hash(messages):
    """16 hex digits of SHA-256 of the first 512 bytes of the rendered prompt."""
    head = render(messages).encode("utf-8")[:PREFIX_HASH_BYTES]
    return hashlib.sha256(head).hexdigest()[:16]


# ---------------------------------------------------------------- text


def _make_vocab():
    """A fixed vocabulary of 1,024 pronounceable pseudo-words (deterministic, not seeded)."""
    rng = random.Random("cohort-bench-vocab")
    cons = "bcdfghjklmnprstvwz"
    vows = "aeiou"
    words = set()
    while len(words) < 1024:
        n = rng.choice((1, 2, 2, 3))
        words.add("".join(rng.choice(cons) + rng.choice(vows) for _ in range(n)))
    return sorted(words)


_VOCAB = _make_vocab()


def _words(rng, nbytes, tag):
    """`tag` then random vocabulary words, exactly `nbytes` bytes (ASCII)."""
    text = tag
    while len(text) < nbytes:
        # words average about 5.5 bytes with their space: draw enough in one call
        text += " " + " ".join(rng.choices(_VOCAB, k=(nbytes - len(text)) // 4 + 4))
    return text[:nbytes]


@functools.lru_cache(maxsize=65536)
def block_text(trace, hash_id, nbytes, salt=""):
    """The text of Mooncake block `hash_id` of `trace`: nbytes bytes of word-like ASCII.

    It starts with a tag naming the trace and id, so different ids differ in their first
    bytes (no accidental shared prefix), and the same id is always the same text.
    """
    rng = random.Random(f"{salt}|{trace}|{hash_id}")
    return _words(rng, nbytes, f"[{salt}{trace} block {hash_id}]")


def _unique_text(rng, nbytes, tag):
    return _words(rng, nbytes, tag)


def _cut(text, scale):
    if scale >= 1.0:
        return text
    return text[: max(1, int(len(text) * scale))]


# ---------------------------------------------------------------- sources
# A source yields "units" in data order. A unit is a list of items sharing one arrival
# start (one item, or a ShareGPT session's turns); an item is a dict with messages,
# max_tokens, group, optional headers, optional "t_trace" (s) and "gap" (s after the
# previous item of the unit, the think time).


def _read_jsonl(path):
    """Rows of a JSON-lines file, gzipped when its name ends in .gz."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                yield json.loads(line)


def _mooncake_units(name, path, *, scale_tokens, max_tokens, salt, **_):
    block_bytes = max(1, round(TOKENS_PER_BLOCK * BYTES_PER_TOKEN * scale_tokens))
    short = "mc" if name == "mooncake-conv" else "ms"
    common = _common_roots(path)
    for row in _read_jsonl(path):
        ids = row["hash_ids"]
        # the rendered prompt ("user\n" + text + "\n") is input_length x 4 x scale bytes
        want = max(1, round(row["input_length"] * BYTES_PER_TOKEN * scale_tokens) - USER_FRAME)
        parts = []
        size = 0
        for h in ids:
            if size >= want:
                break
            b = block_text(short, h, block_bytes, salt)
            parts.append(b[: want - size])
            size += len(parts[-1])
        text = "".join(parts)
        yield [
            {
                "messages": [{"role": "user", "content": text}],
                "max_tokens": max(1, min(int(row["output_length"]), max_tokens)),
                "group": _mooncake_group(short, ids, common),
                "t_trace": row["timestamp"] / 1000.0,
            }
        ]


@functools.lru_cache(maxsize=4)
def _common_roots(path):
    """First blocks shared by at least half the trace (the conversation trace's system prompt)."""
    counts = {}
    rows = 0
    for row in _read_jsonl(path):
        rows += 1
        if row["hash_ids"]:
            counts[row["hash_ids"][0]] = counts.get(row["hash_ids"][0], 0) + 1
    return frozenset(h for h, c in counts.items() if c * 2 >= rows)


def _mooncake_group(short, ids, common):
    """The prefix group: the first block, or the first two when the first is a trace-wide root."""
    if not ids:
        return f"{short}-"
    if ids[0] in common and len(ids) > 1:
        return f"{short}{ids[0]}.{ids[1]}"
    return f"{short}{ids[0]}"


def _azure_units(path, *, scale_tokens, max_tokens, salt, seed, **_):
    t0 = None
    with open(path, newline="", encoding="utf-8") as f:
        for i, row in enumerate(csv.DictReader(f)):
            ts = datetime.datetime.fromisoformat(row["TIMESTAMP"][:26])
            t0 = t0 or ts
            rng = random.Random(f"{salt}|az|{seed}|{i}")
            nbytes = max(1, round(int(row["ContextTokens"]) * BYTES_PER_TOKEN * scale_tokens) - USER_FRAME)
            text = _unique_text(rng, nbytes, f"[{salt}az {seed} {i}]")
            yield [
                {
                    "messages": [{"role": "user", "content": text}],
                    "max_tokens": max(1, min(int(row["GeneratedTokens"]), max_tokens)),
                    "group": f"az{i}",
                    "t_trace": (ts - t0).total_seconds(),
                }
            ]


def _sharegpt_units(path, *, scale_tokens, max_tokens, salt, seed, time_scale, **_):
    rng = random.Random(f"think|{seed}")
    for conv in _read_jsonl(path):
        turns = conv["conversations"]
        sid = f"{salt}sg-{conv['id']}"
        history = []
        unit = []
        for k in range(0, len(turns) - 1, 2):
            human, gpt = turns[k], turns[k + 1]
            if human["from"] != "human" or gpt["from"] != "gpt":
                break
            text = _cut(human["value"], scale_tokens)
            if salt and not history:
                text = f"[{salt}] {text}"
            history.append({"role": "user", "content": text})
            reply_tokens = max(1, len(gpt["value"].encode("utf-8")) // BYTES_PER_TOKEN)
            unit.append(
                {
                    "messages": [dict(m) for m in history],
                    "max_tokens": max(1, min(reply_tokens, max_tokens)),
                    "group": sid,
                    "headers": {"x-session-id": sid},
                    "gap": 0.0 if not unit else rng.expovariate(1.0 / (THINK_S * time_scale)),
                }
            )
            history.append({"role": "assistant", "content": _cut(gpt["value"], scale_tokens)})
        if unit:
            yield unit


def _zipf_weights(k, s=ZIPF_S):
    return [1.0 / (i + 1) ** s for i in range(k)]


def _templated_units(path_prompts, path_turns, *, scale_tokens, max_tokens, salt, seed, **_):
    apps = list(_read_jsonl(path_prompts))
    with open(path_turns, newline="", encoding="utf-8") as f:
        turns = [row["text"] for row in csv.DictReader(f)]
    systems = []
    for i, app in enumerate(apps):
        text = "\n\n".join([app["prompt"]] * (2 + i % 3))
        text = f"{salt}{text}" if salt else text
        if scale_tokens != 1.0:
            whole = (text + "\n\n") * (int(scale_tokens) + 1)
            text = whole[: max(1, int(len(text) * scale_tokens))]
        systems.append(text)
    weights = _zipf_weights(len(apps))
    rng = random.Random(f"templated|{seed}")
    while True:
        i = rng.choices(range(len(apps)), weights)[0]
        yield [
            {
                "messages": [
                    {"role": "system", "content": systems[i]},
                    {"role": "user", "content": rng.choice(turns)},
                ],
                "max_tokens": max_tokens,
                "group": f"app{i}",
            }
        ]


_TRACED = ("mooncake-conv", "mooncake-synth", "azure-conv")


def has_trace(name):
    """Whether workload `name` has its own timestamps (arrival "trace"); the others replace
    "trace" by poisson."""
    describe(name)
    return name in _TRACED


def _source(name, **kw):
    if name == "mooncake-conv":
        units = _mooncake_units(name, DATA / "traces/mooncake_conversation_trace.jsonl", **kw)
    elif name == "mooncake-synth":
        units = _mooncake_units(name, DATA / "traces/mooncake_synthetic_trace.jsonl.gz", **kw)
    elif name == "azure-conv":
        units = _azure_units(DATA / "traces/azure_llm_inference_2023_conv_first3000.csv", **kw)
    elif name == "sharegpt-multiturn":
        units = _sharegpt_units(DATA / "prompts/sharegpt_v3_multiturn_subset.jsonl", **kw)
    elif name == "templated-app":
        units = _templated_units(DATA / "bench/system_prompts_long.jsonl", DATA / "intent/banking77_train.csv", **kw)
    else:
        raise WorkloadError(f"unknown workload {name!r}; known: {', '.join(NAMES)}")
    return units, has_trace(name)


# ---------------------------------------------------------------- arrivals


def step_rates(rate, time_scale=1.0):
    """The step ramp as pieces (label, t0, t1, rate_at_t0, rate_at_t1), in order."""
    pieces = []
    t = 0.0
    up, hold, down = STEP_UP_S * time_scale, STEP_HOLD_S * time_scale, STEP_DOWN_S * time_scale
    for i, level in enumerate(STEP_LEVELS):
        r = rate * level
        label = f"L{i + 1}"
        pieces.append((f"{label}/up", t, t + up, 0.0, r))
        pieces.append((label, t + up, t + up + hold, r, r))
        pieces.append((f"{label}/down", t + up + hold, t + up + hold + down, r, 0.0))
        t += up + hold + down
    return pieces


def step_label(pieces, t):
    """The label of the step-ramp piece holding time t ("L4/down" past the end)."""
    for label, t0, t1, _, _ in pieces:
        if t0 <= t < t1:
            return label
    return pieces[-1][0] if pieces and t >= pieces[-1][2] else None


def _step_times(rng, rate, time_scale):
    """Non-homogeneous Poisson arrivals over the step ramp (thinning), as (t, label)."""
    out = []
    for label, t0, t1, r0, r1 in step_rates(rate, time_scale):
        top = max(r0, r1)
        if top <= 0 or t1 <= t0:
            continue
        t = t0
        while True:
            t += rng.expovariate(top)
            if t >= t1:
                break
            r = r0 + (r1 - r0) * (t - t0) / (t1 - t0)
            if rng.random() * top < r:
                out.append((t, label))
    return out


def _poisson_times(rng, rate):
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        yield t


def _burst_size(rng):
    # 1 + Geometric with mean BURST_MEAN_EXTRA (failures before a success, p = 1/(1+mean))
    p = 1.0 / (1.0 + BURST_MEAN_EXTRA)
    k = 1
    while rng.random() > p:
        k += 1
    return k


# ---------------------------------------------------------------- build


def _take_units(units, want_items, cap_units=None):
    """Up to `want_items` items worth of units from a generator (all if want_items is None)."""
    out = []
    count = 0
    for u in units:
        out.append(u)
        count += len(u)
        if want_items is not None and count >= want_items:
            break
        if cap_units is not None and len(out) >= cap_units:
            break
    return out


def build(
    name,
    *,
    n=None,
    duration_s=None,
    rate=None,
    arrival="trace",
    seed=1,
    time_scale=1.0,
    max_tokens=16,
    scale_tokens=1.0,
    salt="",
):
    """The request list of workload `name`, sorted by arrival time `t`, deterministic for a seed.

    See the module docstring for the workloads and arrival shapes. Raises WorkloadError on
    an unknown name or arrival, or a non-positive rate, time_scale or scale_tokens.
    """
    if arrival not in ARRIVALS:
        raise WorkloadError(f"unknown arrival {arrival!r}; known: {', '.join(ARRIVALS)}")
    if time_scale <= 0 or scale_tokens <= 0 or max_tokens < 1:
        raise WorkloadError("time_scale and scale_tokens must be > 0 and max_tokens >= 1")
    if rate is not None and rate <= 0:
        raise WorkloadError("rate must be > 0")
    if n is not None and n < 0:
        raise WorkloadError("n must be >= 0")
    units, has_trace = _source(
        name,
        scale_tokens=scale_tokens,
        max_tokens=max_tokens,
        salt=salt,
        seed=seed,
        time_scale=time_scale,
    )
    if arrival == "trace" and not has_trace:
        arrival = "poisson"
    if n is None and duration_s is None and name == "templated-app" and arrival != "step":
        n = DEFAULT_N
    rate = DEFAULT_RATE if rate is None else rate
    rng = random.Random(f"arrival|{name}|{arrival}|{seed}")
    timed = []  # (t, step, item)

    def place(start, unit, step):
        t = start
        for item in unit:
            t += item.get("gap", 0.0)
            timed.append((t, step, item))

    def done(start):
        if duration_s is not None and start >= duration_s:
            return True
        return n is not None and len(timed) >= n

    if arrival == "trace":
        for unit in units:
            start = unit[0]["t_trace"] * time_scale
            if done(start):
                break
            place(start, unit, None)
    elif arrival == "poisson":
        # requests/s -> units/s: a unit (session) holds several requests
        times = None
        for unit in units:
            if times is None:
                times = _poisson_times(rng, rate / _mean_unit_len(name))
            start = next(times)
            if done(start):
                break
            place(start, unit, None)
    elif arrival == "step":
        starts = _step_times(rng, rate / _mean_unit_len(name), time_scale)
        for (start, _label), unit in zip(starts, units):
            if done(start):
                break
            place(start, unit, "step")
    else:  # bursty
        _bursty(rng, name, units, rate, time_scale, n, duration_s, place, done)

    if arrival == "step":
        # label by the request's own arrival (a session's later turns may fall in a later piece)
        pieces = step_rates(rate / _mean_unit_len(name), time_scale)
        timed = [(t, step_label(pieces, t), item) for t, _, item in timed]
    timed.sort(key=lambda x: x[0])
    if duration_s is not None:
        timed = [x for x in timed if x[0] < duration_s]
    if n is not None:
        timed = timed[:n]
    return [_request(i, t, step, item) for i, (t, step, item) in enumerate(timed)]


def _mean_unit_len(name):
    """Mean requests per unit: ShareGPT sessions hold several turns, others one request."""
    if name != "sharegpt-multiturn":
        return 1.0
    return _sharegpt_mean_turns()


@functools.lru_cache(maxsize=1)
def _sharegpt_mean_turns():
    lens = [
        sum(1 for c in conv["conversations"] if c["from"] == "human")
        for conv in _read_jsonl(DATA / "prompts/sharegpt_v3_multiturn_subset.jsonl")
    ]
    return sum(lens) / len(lens)


def _bursty(rng, name, units, rate, time_scale, n, duration_s, place, done):
    """Bursts of one group: each burst is 1 + Geometric(mean 2) units of a group drawn in
    proportion to its remaining units (fewer when the group runs out), spread over
    100 ms x time_scale; burst epochs are a Gamma renewal process with CV 3, its gaps
    rescaled so the whole pool arrives at exactly `rate` requests/s on average."""
    if n is not None:
        pool = _take_units(units, n)
    elif duration_s is not None:
        # enough units for the duration at this rate (x1.5 for bursts of chance), bounded
        pool = _take_units(units, None, cap_units=int(rate * duration_s * 1.5 / _mean_unit_len(name)) + 16)
    else:
        pool = _take_units(units, None)
    if not pool:
        return
    by_group = {}
    for u in pool:
        by_group.setdefault(u[0]["group"], []).append(u)
    heads = {g: 0 for g in by_group}
    live = list(by_group)
    bursts = []
    while live:
        weights = [len(by_group[g]) - heads[g] for g in live]
        g = rng.choices(live, weights)[0]
        take = min(_burst_size(rng), len(by_group[g]) - heads[g])
        bursts.append(by_group[g][heads[g] : heads[g] + take])
        heads[g] += take
        live = [x for x in live if heads[x] < len(by_group[x])]
    shape = 1.0 / (BURST_CV * BURST_CV)
    gaps = [rng.gammavariate(shape, 1.0) for _ in bursts]
    items = sum(len(u) for u in pool)
    span = items / rate  # seconds the pool should take at `rate`
    k = span / sum(gaps) if sum(gaps) > 0 else 0.0
    spread = BURST_SPREAD_S * time_scale
    start = 0.0
    for gap, burst in zip(gaps, bursts):
        start += gap * k
        if done(start):
            break
        for unit in burst:
            place(start + rng.random() * spread, unit, None)


def _request(i, t, step, item):
    messages = item["messages"]
    headers = {"x-prefix-hash": prefix_hash(messages)}
    headers.update(item.get("headers", {}))
    return {
        "id": i,
        "t": round(t, 6),
        "body": {
            "model": "sim-model",
            "messages": messages,
            "max_tokens": item["max_tokens"],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        "headers": headers,
        "group": item["group"],
        "step": step,
    }


def stats(requests):
    """A few numbers about a request list (count, span, rate, prompt bytes, groups)."""
    if not requests:
        return {"n": 0}
    span = requests[-1]["t"] - requests[0]["t"]
    nbytes = [len(render(r["body"]["messages"]).encode("utf-8")) for r in requests]
    return {
        "n": len(requests),
        "span_s": round(span, 3),
        "rate": round(len(requests) / span, 3) if span > 0 else None,
        "prompt_bytes_mean": round(sum(nbytes) / len(nbytes)),
        "prompt_bytes_max": max(nbytes),
        "groups": len({r["group"] for r in requests}),
    }


def main(argv=None):
    """`python3 -m cohort_tools.peers.workloads [NAME ARRIVAL [n]]`: stats of each workload."""
    import sys

    argv = sys.argv[1:] if argv is None else argv
    names = [argv[0]] if argv else NAMES
    arrivals = [argv[1]] if len(argv) > 1 else ARRIVALS
    n = int(argv[2]) if len(argv) > 2 else 300
    for name in names:
        print(f"{name}: {describe(name)}")
        for arrival in arrivals:
            print(f"  {arrival:8s} {stats(build(name, n=n, arrival=arrival, time_scale=0.2, scale_tokens=0.25))}")


if __name__ == "__main__":
    main()
