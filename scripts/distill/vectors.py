"""Vectors for the distillation scripts: the Rust sketch of texts, unit rows, spherical k-means.

Shared by `evaluate.py` (the sketch table's scores) and `codebook.py` (the cohort codebook);
numpy only, so the codebook can be fitted without the teacher's packages.
"""
import json
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
