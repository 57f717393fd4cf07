"""The cohort codebook: centroids of the sketch space, coarse to fine, fitted on the corpus.

Why: a request's cohort id must group same-intent requests with no batcher, in the filter.
The sign signature of the sketch did not (one flipped sign made a new cohort: 3,002 ids for
Banking77's 3,080 test prompts). The id is now the nearest centroid of a shipped codebook at
a level chosen by `x-cohort-batch-threshold` (fingerprint/src/sketch/codebook.rs).

How: the corpus of `corpus.py` (never the evaluation sets) through the Rust sketch (version 2,
intent mode, the exact code the filter runs: `sketch_tool sketch 2 intent`), then spherical
k-means per level (k-means++ seeding, best of three seeds by inertia, deterministic), each
level on its own. Centroids are unit vectors quantised to int8 with one scale per level, so
the nearest centroid by integer dot product is the nearest by cosine up to rounding, and
the filter and this script agree exactly (they compare the same int8 centroids).

Format (little-endian): magic `CCBK`, u32 format 1, u32 dimensions 32, u32 levels L; per
level: u32 k, then k × 32 int8.

    python -m cohort_tools.distill.codebook --data SHARED_DATA --tool sketch_tool --out codebook_v1.bin
"""
import argparse
import struct
import time

import numpy as np

from cohort_tools.distill import corpus
from cohort_tools.distill.vectors import kmeans, rust_sketches, unit

LEVELS = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
SEEDS = 3


def fit(x, k, seeds=SEEDS):
    """Unit centroids (k × dimensions) of the best of `seeds` spherical k-means runs."""
    best = None
    for seed in range(seeds):
        labels, inertia = kmeans(x, k, seed)
        if best is None or inertia < best[1]:
            best = (labels, inertia)
    labels = best[0]
    xs = unit(x)
    centres = np.zeros((k, x.shape[1]))
    for j in range(k):
        members = xs[labels == j]
        if len(members):
            centres[j] = members.sum(0)
        else:
            centres[j] = xs[j]  # an empty cluster (not seen at these sizes) keeps a point
    return unit(centres)


def quantise(centres):
    """int8 centroids with one scale for the level: the largest magnitude becomes 127."""
    scale = 127.0 / np.abs(centres).max()
    return np.clip(np.rint(centres * scale), -127, 127).astype(np.int8)


def write(path, levels):
    with open(path, "wb") as f:
        f.write(b"CCBK" + struct.pack("<III", 1, 32, len(levels)))
        for q in levels:
            f.write(struct.pack("<I", len(q)))
            f.write(q.astype(np.int8).tobytes())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    started = time.time()
    texts = [t for which in ("base", "more") for _, t in corpus.part(args.data, which)]
    x = rust_sketches(args.tool, texts, 2, "intent")
    x = x[np.abs(x).sum(1) > 0]  # texts with no intent (empty sketches) have no direction
    print(f"codebook: {len(x)} corpus sketches after {time.time() - started:.0f} s")
    levels = []
    for k in LEVELS:
        levels.append(quantise(fit(x, k)))
        print(f"  k = {k}: fitted after {time.time() - started:.0f} s")
    write(args.out, levels)
    print(f"codebook: wrote {args.out}")


if __name__ == "__main__":
    main()
