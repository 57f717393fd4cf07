"""A codebook fitted on one tenant's own traffic: does it put each intent on one cohort?

Why: the grouping goal asks that 20 paraphrases of each of 5 intents land with >= 80% of each intent
in one cohort (so on one replica in affinity mode). The shipped codebook is fitted on
general prompts and does not (docs/SKETCH.md). This fits the same spherical k-means
(`vectors.kmeans`, best of three seeds by inertia) on Banking77's *training* prompts, as a
tenant would on its past traffic, assigns the *test* prompts to the nearest centroid, and
prints, per k: the least and mean share of an intent's prompts in its largest cohort over
the first 5 intents (20 prompts each, the issue's set) and the mean over all 77.

    .venv/bin/python -m cohort_tools.distill.tenant_codebook \
        --tool target/release/examples/sketch_tool   # cargo build --release -p cohort-fingerprint --example sketch_tool
"""
import argparse
import csv

import numpy as np

from cohort_tools.distill.vectors import kmeans, rust_sketches, unit


def load(path):
    rows = list(csv.reader(open(path, encoding="utf-8")))[1:]
    return [r[0] for r in rows], [r[1] for r in rows]


def largest_share(labels):
    _, counts = np.unique(labels, return_counts=True)
    return counts.max() / len(labels)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", required=True, help="sketch_tool binary")
    parser.add_argument("--data", default="data/intent", help="folder of banking77_{train,test}.csv")
    args = parser.parse_args()
    train, _ = load(f"{args.data}/banking77_train.csv")
    test, truth = load(f"{args.data}/banking77_test.csv")
    x_train = unit(rust_sketches(args.tool, train, 2, "intent"))
    x_test = unit(rust_sketches(args.tool, test, 2, "intent"))
    intents = list(dict.fromkeys(truth))
    first = [[i for i, t in enumerate(truth) if t == label][:20] for label in intents[:5]]
    every = [[i for i, t in enumerate(truth) if t == label] for label in intents]
    print("| k | first 5 intents × 20: least share | mean share | all 77 intents: mean share |")
    print("|---|---|---|---|")
    for k in (4, 8, 16, 32, 64):
        labels, _ = min((kmeans(x_train, k, seed) for seed in range(3)), key=lambda r: r[1])
        centres = unit(np.array([x_train[labels == j].sum(0) for j in range(k)]))
        assigned = (x_test @ centres.T).argmax(axis=1)
        five = [largest_share(assigned[ids]) for ids in first]
        all77 = [largest_share(assigned[ids]) for ids in every]
        print(f"| {k} | {min(five):.2f} | {np.mean(five):.2f} | {np.mean(all77):.2f} |")


if __name__ == "__main__":
    main()
