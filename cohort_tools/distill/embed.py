"""Teacher embeddings, cached: the slow part of distillation and evaluation, done once.

Why: MiniLM in numpy runs at roughly a thousand tokens per second on one dev core, so
every set of texts is embedded once and stored under `.cache/distill/` (gitignored), keyed
by a hash of the texts; a rerun with the same inputs only reads the cache.
"""
import hashlib
import os

import numpy as np

from cohort_tools.distill.teacher import Teacher

_teacher = None


def teacher(model_dir):
    global _teacher
    if _teacher is None:
        _teacher = Teacher(model_dir)
    return _teacher


def _key(items):
    digest = hashlib.sha256()
    for item in items:
        digest.update(repr(item).encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def cached(cache_dir, name, items, compute):
    """`compute(items)` stored as `<cache_dir>/<name>-<hash>.npy`."""
    os.makedirs(cache_dir, exist_ok=True)
    path = f"{cache_dir}/{name}-{_key(items)}.npy"
    if os.path.exists(path):
        return np.load(path)
    value = compute(items)
    np.save(path, value)
    return value


def texts(cache_dir, model_dir, name, items):
    """Teacher embeddings (n × 384, unit length) of texts."""
    return cached(cache_dir, name, items, lambda t: teacher(model_dir).encode(t, 2048))


def vocabulary(cache_dir, model_dir, vocab_size):
    """Each vocabulary token alone through the teacher: [CLS] token [SEP], mean pooled."""
    ids = [[101, i, 102] for i in range(vocab_size)]
    return cached(cache_dir, "vocab", ids, lambda v: teacher(model_dir).encode_ids(v, 8192))
