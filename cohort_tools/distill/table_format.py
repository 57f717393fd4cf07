"""Writes the sketch table binary that fingerprint/src/sketch/table.rs embeds.

Why: the Rust core reads one compact file (vocabulary + per-row u16 weight + int8
direction); this is the only writer of that format (layout in table.rs's module doc).
"""
import json
import struct

import numpy as np

MAGIC = b"CSKT"
FORMAT = 1
MASKS = ["<url>", "<email>", "<id>", "<num>", "<name>", "<code>", "<doc>"]


def vocabulary(tokenizer_json):
    """The WordPiece vocabulary in id order, and the id of [UNK]."""
    model = json.load(open(tokenizer_json, encoding="utf-8"))["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    assert [i for _, i in vocab] == list(range(len(tokens)))
    assert all("\n" not in t for t in tokens)
    return tokens, model["vocab"][model["unk_token"]]


def quantise(matrix):
    """Float rows → (u16 weights, int8 directions), so weight × direction ≈ row × const."""
    norms = np.abs(matrix).max(axis=1)
    directions = np.zeros(matrix.shape, dtype=np.int8)
    nonzero = norms > 0
    directions[nonzero] = np.clip(np.rint(matrix[nonzero] / norms[nonzero, None] * 127), -127, 127)
    peak = norms.max() if norms.max() > 0 else 1.0
    weights = np.clip(np.rint(norms / peak * 65535), 0, 65535).astype("<u2")
    return weights, directions


def write(path, tokens, unk, matrix):
    """`matrix`: (len(tokens) + len(MASKS)) × 32 float rows."""
    assert matrix.shape == (len(tokens) + len(MASKS), 32)
    weights, directions = quantise(np.asarray(matrix, dtype=np.float64))
    text = "\n".join(tokens).encode("utf-8")
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<6I", FORMAT, 32, len(tokens), len(MASKS), unk, len(text)))
        f.write(text)
        f.write(weights.tobytes())
        f.write(directions.tobytes())


def read(path):
    """(tokens, unk, matrix) as `write` stored them (matrix dequantised, up to scale)."""
    data = open(path, "rb").read()
    assert data[:4] == MAGIC
    _, dims, n, extra, unk, text_len = struct.unpack("<6I", data[4:28])
    tokens = data[28:28 + text_len].decode("utf-8").split("\n")
    rows = n + extra
    at = 28 + text_len
    weights = np.frombuffer(data[at:at + 2 * rows], dtype="<u2").astype(np.float64)
    at += 2 * rows
    directions = np.frombuffer(data[at:at + dims * rows], dtype=np.int8).reshape(rows, dims)
    return tokens, unk, weights[:, None] * directions
