"""Cohort grouping: what the codebook's cohort ids make of labelled intents, beside MiniLM.

Why: a cohort id is only worth routing on if requests of one intent share it. For each
codebook level (the batch threshold that selects it) this prints, on Banking77 and HWU64
test prompts (domains the corpus never saw): the number of cohorts, purity (the share of
prompts in their cohort's majority intent), NMI against the intents, and the share of
same-intent pairs that share an id. Beside it, the same codebook procedure run on MiniLM's
own embeddings (all-MiniLM-L6-v2, 384 floats, `teacher.py`): spherical k-means of the same
corpus at the same k (best of three seeds by inertia, as the sketch's codebook), nearest
centroid by cosine. The cohort ids are the Rust core's (`sketch_tool cohort <threshold>`, the
filter's code).

    python -m cohort_tools.distill.grouping --data DATA --corpus SHARED_DATA --model MODEL --tool SKETCH_TOOL
"""
import argparse
import json
import subprocess
import time

import numpy as np

from cohort_tools.distill import codebook, corpus, embed
from cohort_tools.distill.evaluate import load_csv
from cohort_tools.distill.vectors import grouping, unit


def cohort_codes(tool, texts, threshold):
    stdin = "".join(json.dumps(t) + "\n" for t in texts)
    out = subprocess.run([tool, "cohort", f"{threshold:.6f}"], input=stdin,
                         capture_output=True, text=True, check=True).stdout
    return out.split()[: len(texts)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="the project's data/ directory")
    ap.add_argument("--corpus", required=True, help="the shared data directory (the corpus)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--cache", default=".cache/distill")
    ap.add_argument("--minilm-levels", default="4,8,16,32,64,128,256,512,1024",
                    help="the k at which MiniLM's own codebook is fitted (the slow part)")
    args = ap.parse_args()
    started = time.time()
    sets = {"Banking77": load_csv(f"{args.data}/intent/banking77_test.csv"),
            "HWU64": load_csv(f"{args.data}/intent/hwu64.csv", "test")}
    sizes = codebook.LEVELS
    thresholds = [0.1 + 0.8 * i / (len(sizes) - 1) for i in range(len(sizes))]
    parts = [("corpus", "base"), ("corpus_more", "more")]
    teacher_corpus = None
    minilm_ks = {int(k) for k in args.minilm_levels.split(",") if k}
    centroids = {}
    rows = []
    for name, (texts, labels) in sets.items():
        emb = None
        for k, threshold in zip(sizes, thresholds):
            sketch = grouping(cohort_codes(args.tool, texts, threshold), labels)
            minilm = None
            if k in minilm_ks:
                if teacher_corpus is None:
                    teacher_corpus = np.vstack([
                        embed.texts(args.cache, args.model, cache_name,
                                    [t for _, t in corpus.part(args.corpus, which)])
                        for cache_name, which in parts])
                if k not in centroids:
                    centroids[k] = codebook.fit(teacher_corpus, k)
                    print(f"MiniLM codebook k = {k} after {time.time() - started:.0f} s", flush=True)
                if emb is None:
                    emb = embed.texts(args.cache, args.model, f"{name.lower()}_test", texts)
                minilm = grouping(list((unit(emb) @ centroids[k].T).argmax(axis=1)), labels)
            rows.append((name, threshold, k, sketch, minilm))
    print("| set | batch threshold | k | sketch: cohorts | purity | NMI | pairs sharing | "
          "MiniLM: cohorts | purity | NMI | pairs sharing | NMI ÷ MiniLM's |")
    print("|" + "---|" * 12)
    for name, threshold, k, s, m in rows:
        mini = (f"{m[0]} | {m[1]:.3f} | {m[2]:.3f} | {m[3]:.3f} | {s[2] / m[2]:.2f}"
                if m else "– | – | – | – | –")
        print(f"| {name} | {threshold:.2f} | {k} | {s[0]} | {s[1]:.3f} | {s[2]:.3f} | {s[3]:.3f} | {mini} |")


if __name__ == "__main__":
    main()
