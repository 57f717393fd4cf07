"""The sketch evaluation table: distilled v2, hashed v1, TF-IDF and MiniLM itself.

Why: the distilled sketch is only worth its table if it groups intents nearly as well as
the sentence-embedding model it imitates, on domains it never saw. Protocol (the
semantic-quality issue's): 1-NN intent accuracy with cosine similarity, the train split as
the store and the test split as queries, on Banking77 (3,080 vs 10,003) and HWU64
(1,031 vs 8,646); clustering of the test split by spherical k-means with k = number of
intents (purity and NMI, best of 3 seeds by inertia); same-template purity on T0 templated
prompts (10 per template; k-means with k = number of templates, and leave-one-out 1-NN).
v1 and v2 are computed by the Rust core (`sketch_tool sketch`), MiniLM by `teacher.py`
(embeddings cached under .cache/distill).
Usage: python -m cohort_tools.distill.evaluate --data DATA --t0 T0_JSONL --model MODEL_DIR --tool SKETCH_TOOL
"""
import argparse
import collections
import csv
import json
import re

import numpy as np

from cohort_tools.distill import embed
from cohort_tools.distill.vectors import grouping, kmeans, rust_sketches, unit


def load_csv(path, split=None):
    with open(path, encoding="utf-8") as f:
        rows = list(csv.reader(f))[1:]
    if split is not None:
        rows = [r for r in rows if r[2] == split]
    return [r[0] for r in rows], [r[1] for r in rows]


WORD = re.compile(r"[a-z0-9']+")


def tfidf(store_texts, query_texts, max_words=8000):
    """TF-IDF of unigrams over the store's vocabulary (its `max_words` most frequent words)."""
    docs = [collections.Counter(WORD.findall(t.lower())) for t in store_texts]
    frequency = collections.Counter(w for d in docs for w in d)
    vocab = {w: i for i, (w, _) in enumerate(frequency.most_common(max_words))}
    docs = [{w: c for w, c in d.items() if w in vocab} for d in docs]
    df = np.zeros(len(vocab))
    for d in docs:
        for w in d:
            df[vocab[w]] += 1
    idf = np.log((1 + len(docs)) / (1 + df)) + 1

    def matrix(texts):
        m = np.zeros((len(texts), len(vocab)), dtype=np.float32)
        for i, t in enumerate(texts):
            for w, c in collections.Counter(WORD.findall(t.lower())).items():
                if w in vocab:
                    m[i, vocab[w]] = c * idf[vocab[w]]
        return m

    return matrix(store_texts), matrix(query_texts)


def one_nn(store, store_labels, queries, query_labels):
    sims = unit(queries) @ unit(store).T
    best = sims.argmax(axis=1)
    return float(np.mean([store_labels[b] == q for b, q in zip(best, query_labels)]))


def purity_nmi(x, labels, k):
    best = min((kmeans(x, k, seed) for seed in range(3)), key=lambda r: r[1])[0]
    _, purity, nmi, _ = grouping(list(best), list(labels))
    return purity, nmi


def loo_one_nn(x, labels):
    s = unit(x) @ unit(x).T
    np.fill_diagonal(s, -np.inf)
    best = s.argmax(axis=1)
    return float(np.mean([labels[b] == label for b, label in zip(best, labels)]))


def t0_set(path, per_template=10):
    seen = collections.Counter()
    texts, labels = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if seen[row["template_id"]] < per_template:
                seen[row["template_id"]] += 1
                texts.append(row["prompt"])
                labels.append(row["template_id"])
    return texts, labels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="the project's data/ directory")
    ap.add_argument("--t0", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--cache", default=".cache/distill")
    ap.add_argument("--modes", action="store_true", help="also v1/v2 in topic and hybrid mode")
    args = ap.parse_args()

    sets = {
        "Banking77": (load_csv(f"{args.data}/intent/banking77_train.csv"),
                      load_csv(f"{args.data}/intent/banking77_test.csv")),
        "HWU64": (load_csv(f"{args.data}/intent/hwu64.csv", "train"),
                  load_csv(f"{args.data}/intent/hwu64.csv", "test")),
    }
    t0_texts, t0_labels = t0_set(args.t0)
    methods = [("distilled v2 (32 int8)", ("rust", 2, "intent")),
               ("hashed v1 (32 int8)", ("rust", 1, "intent"))]
    if args.modes:
        methods += [(f"distilled v2 {m}", ("rust", 2, m)) for m in ("topic", "hybrid")]
        methods += [(f"hashed v1 {m}", ("rust", 1, m)) for m in ("topic", "hybrid")]
    methods += [("TF-IDF unigrams (full dim)", ("tfidf",)), ("MiniLM-L6-v2 (384 float)", ("minilm",))]

    def vectors(method, name, store_texts, query_texts):
        if method[0] == "rust":
            return (rust_sketches(args.tool, store_texts, method[1], method[2]),
                    rust_sketches(args.tool, query_texts, method[1], method[2]))
        if method[0] == "tfidf":
            return tfidf(store_texts, query_texts)
        if name == "Banking77":
            return (embed.texts(args.cache, args.model, "banking77_train", store_texts),
                    embed.texts(args.cache, args.model, "banking77_test", query_texts))
        # HWU64: the whole file is embedded once (train, valid and test rows in file order).
        all_texts, _ = load_csv(f"{args.data}/intent/hwu64.csv")
        all_emb = embed.texts(args.cache, args.model, "hwu64", all_texts)
        with open(f"{args.data}/intent/hwu64.csv", encoding="utf-8") as f:
            splits = [r[2] for r in list(csv.reader(f))[1:]]
        return (all_emb[[s == "train" for s in splits]], all_emb[[s == "test" for s in splits]])

    results = {}
    for label, method in methods:
        row = {}
        for name, ((s_texts, s_labels), (q_texts, q_labels)) in sets.items():
            store, queries = vectors(method, name, s_texts, q_texts)
            row[f"{name} 1-NN"] = one_nn(store, s_labels, queries, q_labels)
            row[f"{name} purity"], row[f"{name} NMI"] = purity_nmi(
                queries, q_labels, len(set(q_labels)))
        if method[0] == "tfidf":
            t0 = tfidf(t0_texts, t0_texts)[0]
        elif method[0] == "rust":
            t0 = rust_sketches(args.tool, t0_texts, method[1], method[2])
        else:
            t0 = embed.texts(args.cache, args.model, "t0", t0_texts)
        row["T0 purity"], _ = purity_nmi(t0, t0_labels, len(set(t0_labels)))
        row["T0 1-NN"] = loo_one_nn(t0, t0_labels)
        results[label] = row
        print(f"done: {label}", flush=True)

    teacher = results["MiniLM-L6-v2 (384 float)"]
    header = ["sketch", "Banking77 1-NN", "ratio", "HWU64 1-NN", "ratio",
              "Banking77 purity / NMI", "HWU64 purity / NMI", "T0 same-template purity / 1-NN"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for label, r in results.items():
        print(f"| {label} | {r['Banking77 1-NN']:.3f} | "
              f"{r['Banking77 1-NN'] / teacher['Banking77 1-NN']:.3f} | {r['HWU64 1-NN']:.3f} | "
              f"{r['HWU64 1-NN'] / teacher['HWU64 1-NN']:.3f} | "
              f"{r['Banking77 purity']:.3f} / {r['Banking77 NMI']:.3f} | "
              f"{r['HWU64 purity']:.3f} / {r['HWU64 NMI']:.3f} | "
              f"{r['T0 purity']:.3f} / {r['T0 1-NN']:.3f} |")


if __name__ == "__main__":
    main()
