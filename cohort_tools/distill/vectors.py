"""Vectors for the distillation scripts: the Rust sketch of texts, unit rows, spherical k-means,
and how a labelling groups (purity, NMI, shared pairs).

Shared by `evaluate.py` (the sketch table's scores) and `codebook.py` (the cohort codebook);
numpy only, so the codebook can be fitted without the teacher's packages.
"""
import collections
import json
import math
import subprocess

import numpy as np


def rust_sketches(tool, texts, version, mode):
    stdin = "".join(json.dumps(t) + "\n" for t in texts)
    out = subprocess.run([tool, "sketch", str(version), mode], input=stdin,
                         capture_output=True, text=True, check=True).stdout
    return np.array([[int(v) for v in line.split()] for line in out.split("\n")[: len(texts)]],
                    dtype=np.float64)


def unit(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def kmeans(x, k, seed, iterations=30):
    """Spherical k-means with k-means++ seeding; returns (labels, inertia)."""
    x = unit(x)
    rng = np.random.default_rng(seed)
    centres = [x[rng.integers(len(x))]]
    dist = 1 - x @ centres[0]
    for _ in range(1, k):
        p = np.maximum(dist, 0)
        p = p / p.sum() if p.sum() > 0 else np.full(len(x), 1 / len(x))
        centres.append(x[rng.choice(len(x), p=p)])
        dist = np.minimum(dist, 1 - x @ centres[-1])
    c = np.array(centres)
    for _ in range(iterations):
        labels = (x @ c.T).argmax(axis=1)
        for j in range(k):
            members = x[labels == j]
            if len(members):
                c[j] = members.sum(0)
        c = unit(c)
    sims = x @ c.T
    labels = sims.argmax(axis=1)
    return labels, float((1 - sims.max(axis=1)).sum())


def grouping(pred, truth):
    """(cohorts, purity, NMI, same-intent pairs sharing an id)."""
    n = len(truth)
    table = collections.Counter(zip(pred, truth))
    pc, pt = collections.Counter(pred), collections.Counter(truth)
    purity = sum(max(v for (c, _), v in table.items() if c == cl) for cl in pc) / n
    mi = sum(v / n * math.log(v * n / (pc[c] * pt[t])) for (c, t), v in table.items())
    h = lambda counts: -sum(v / n * math.log(v / n) for v in counts.values())  # noqa: E731
    nmi = 2 * mi / (h(pc) + h(pt)) if h(pc) + h(pt) > 0 else 0.0
    same = sum(v * (v - 1) / 2 for v in table.values())
    pairs = sum(v * (v - 1) / 2 for v in pt.values())
    return len(pc), purity, nmi, same / pairs
