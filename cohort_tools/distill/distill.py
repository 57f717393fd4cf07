"""Fits the version-2 sketch table: WordPiece token rows whose sums match the teacher.

Why: a sentence-embedding model groups paraphrases of one intent, but costs milliseconds
per prompt; a table lookup per token costs nanoseconds. Method (docs/SKETCH.md):

1. Teacher: all-MiniLM-L6-v2 (numpy, `teacher.py`) embeds the corpus (`corpus.py`: broad
   prompts, no evaluation text) and every vocabulary token alone ([CLS] token [SEP]).
2. Static table (Model2Vec-style): each token's own teacher embedding, centred, times a
   SIF frequency weight a / (a + p(token)) (p counted on the corpus); placeholders start
   from the words "link", "email", "id", "number", "name", "code", "document".
3. Linear map: ridge regression from the mean static vector of each corpus text to the
   PCA-32 projection of its teacher embedding; static table × map = initial 32-dim table.
4. End-to-end fit: the Rust core (`sketch_tool rows`) turns each corpus text into the
   rows the runtime will sum (masking, WordPiece, placeholders). Adam minimises
   1 − cos((sum of rows) · D, teacher embedding) over the corpus, for the table and a
   32 × 384 decoder D started at the PCA basis (reduced-rank regression: the 32
   dimensions kept are the ones tokens can predict, not just the ones of largest
   variance), plus a small pull towards the initial table that keeps rare and unseen
   tokens at their static meaning. Afterwards D = Rᵀ Qᵀ (QR) and R is folded into the
   table, so cosines of 32-dim sketches equal cosines of the decoded embeddings.
5. Quantise: per-row u16 weight × int8 direction (`table_format.py`).

Usage: python -m cohort_tools.distill.distill --data SHARED_DATA --model MODEL_DIR --tool SKETCH_TOOL --out BIN
"""
import argparse
import json
import subprocess
import time

import numpy as np
import scipy.sparse as sp

from cohort_tools.distill import corpus, embed, table_format

MASK_WORDS = ["link", "email", "id", "number", "name", "code", "document"]
SIF_A = 1e-3


def rows_of(tool, texts):
    """Sparse (texts × rows) count matrix of the rows the Rust core selects per text."""
    stdin = "".join(json.dumps(t) + "\n" for t in texts)
    out = subprocess.run([tool, "rows"], input=stdin, capture_output=True, text=True, check=True)
    lines = out.stdout.split("\n")[: len(texts)]
    indptr, indices = [0], []
    for line in lines:
        for field in line.split():
            indices.append(int(field.split(":")[0]))
        indptr.append(len(indices))
    data = np.ones(len(indices), dtype=np.float32)
    n_rows = 30522 + len(table_format.MASKS)
    matrix = sp.csr_matrix((data, indices, indptr), shape=(len(texts), n_rows))
    matrix.sum_duplicates()
    return matrix


def pca(embeddings, dims=32):
    mean = embeddings.mean(axis=0)
    _, _, vt = np.linalg.svd(embeddings - mean, full_matrices=False)
    return mean, vt[:dims].T  # 384 × dims


def unit(x):
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-9)


def initial_table(A, vocab_emb, mask_ids, unk, mean, components, targets, ridge=0.1):
    """Static SIF table (rows × 384) mapped to 32 dims by ridge regression on the corpus."""
    counts = np.asarray(A.sum(axis=0)).ravel()
    sif = SIF_A / (SIF_A + counts / max(counts.sum(), 1.0))
    static = (np.vstack([vocab_emb, vocab_emb[mask_ids]]) - mean) * sif[:, None]
    static[unk] = 0.0
    lengths = np.maximum(np.asarray(A.sum(axis=1)).ravel(), 1)
    X = sp.diags(1 / lengths) @ A @ static
    Y = (targets - mean) @ components
    W = np.linalg.solve(X.T @ X + ridge * np.eye(X.shape[1]), X.T @ Y)
    return static @ W


class Adam:
    def __init__(self, shape, lr):
        self.m = np.zeros(shape)
        self.v = np.zeros(shape)
        self.t = 0
        self.lr = lr

    def step(self, param, grad):
        self.t += 1
        self.m = 0.9 * self.m + 0.1 * grad
        self.v = 0.999 * self.v + 0.001 * grad * grad
        mhat = self.m / (1 - 0.9 ** self.t)
        vhat = self.v / (1 - 0.999 ** self.t)
        param -= self.lr * mhat / (np.sqrt(vhat) + 1e-12)


def fit(A, teacher, E0, D0, epochs, lr, reg, batch=512, seed=0, log=print):
    """Table E (rows × 32) and decoder D (32 × 384) minimising mean 1 − cos(A E D, teacher)."""
    rng = np.random.default_rng(seed)
    E = E0.astype(np.float64).copy()
    D = D0.astype(np.float64).copy()
    scale = np.sqrt((E0 ** 2).sum(1).mean())
    adam_e = Adam(E.shape, lr * scale)
    adam_d = Adam(D.shape, lr / np.sqrt(D.shape[0]))
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
            total += (1 - (U * target).sum(1)).sum()
            dU = -target / len(idx)
            dZ = (dU - U * (U * dU).sum(1, keepdims=True)) / norms
            adam_d.step(D, X.T @ dZ)
            adam_e.step(E, Ab.T @ (dZ @ D.T) + reg * 2 * (E - E0) / scale ** 2)
        log(f"epoch {epoch + 1}: mean 1 - cos {total / A.shape[0]:.4f}")
    _, R = np.linalg.qr(D.T)  # D = Rᵀ Qᵀ with Q orthonormal: fold Rᵀ into the table
    return E @ R.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cache", default=".cache/distill")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--reg", type=float, default=1e-4)
    args = ap.parse_args()
    started = time.time()
    tokens, unk = table_format.vocabulary(f"{args.model}/tokenizer.json")
    parts = [(name, [t for _, t in corpus.part(args.data, which)])
             for name, which in (("corpus", "base"), ("corpus_more", "more"))]
    texts = [t for _, part in parts for t in part]
    print(f"corpus: {len(texts)} texts")
    teacher = np.vstack([embed.texts(args.cache, args.model, name, part) for name, part in parts])
    vocab_emb = embed.vocabulary(args.cache, args.model, len(tokens))
    print(f"teacher embeddings ready after {time.time() - started:.0f} s")
    A = rows_of(args.tool, texts)
    mean, components = pca(teacher)
    mask_ids = [tokens.index(w) for w in MASK_WORDS]
    E0 = initial_table(A, vocab_emb, mask_ids, unk, mean, components, teacher)
    E = fit(A, unit(teacher - mean), E0, components.T, args.epochs, args.lr, args.reg)
    E[unk] = 0.0
    np.save(f"{args.cache}/table_float.npy", E)
    table_format.write(args.out, tokens, unk, E)
    print(f"wrote {args.out} in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
