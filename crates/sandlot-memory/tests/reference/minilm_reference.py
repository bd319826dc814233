"""Independent reference for all-MiniLM-L6-v2 sentence embeddings (NumPy, no torch).

Implements BERT exactly as Hugging Face's BertModel (post-LN encoder, exact erf GELU, LayerNorm
eps 1e-12, additive attention mask) followed by sentence-transformers' mean pooling over the
attention mask and L2 normalisation. Writes minilm_reference.json next to this file, which
tests/embed.rs compares against the Rust/candle embedder.

Run: pip install numpy tokenizers safetensors && python3 minilm_reference.py [MODEL_DIR]
"""
import json
import math
import os
import sys

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

MODEL_DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get(
    "SANDLOT_MODEL_DIR", os.path.expanduser("~/.cache/sandlot/models/all-MiniLM-L6-v2"))

TEXTS = [
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog.",
    "Customer churn rose sharply in the third quarter after the price increase.",
    "Sandlot keeps agent memory as Markdown files in git.",
    "¿Dónde está la biblioteca? Über naïve café résumé — 東京",
    " ".join(["word"] * 300),  # longer than 256 tokens: truncation
]

w = load_file(os.path.join(MODEL_DIR, "model.safetensors"))
cfg = json.load(open(os.path.join(MODEL_DIR, "config.json")))
tok = Tokenizer.from_file(os.path.join(MODEL_DIR, "tokenizer.json"))
tok.enable_truncation(max_length=256)
tok.no_padding()


def g(name):
    for k in (name, "bert." + name):
        if k in w:
            return w[k].astype(np.float64)
    raise KeyError(name)


def layer_norm(x, p):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + cfg["layer_norm_eps"]) * g(p + ".weight") + g(p + ".bias")


erf = np.vectorize(math.erf)


def gelu(x):
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def embed(text):
    enc = tok.encode(text)
    ids = np.array(enc.ids)
    n = len(ids)
    x = g("embeddings.word_embeddings.weight")[ids] + g("embeddings.position_embeddings.weight")[:n] \
        + g("embeddings.token_type_embeddings.weight")[np.zeros(n, dtype=int)]
    x = layer_norm(x, "embeddings.LayerNorm")
    h = cfg["num_attention_heads"]
    d = cfg["hidden_size"] // h
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        lin = lambda t, name: t @ g(p + name + ".weight").T + g(p + name + ".bias")
        q = lin(x, "attention.self.query").reshape(n, h, d).transpose(1, 0, 2)
        k = lin(x, "attention.self.key").reshape(n, h, d).transpose(1, 0, 2)
        v = lin(x, "attention.self.value").reshape(n, h, d).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(n, h * d)
        x = layer_norm(lin(a, "attention.output.dense") + x, p + "attention.output.LayerNorm")
        inter = gelu(lin(x, "intermediate.dense"))
        x = layer_norm(lin(inter, "output.dense") + x, p + "output.LayerNorm")
    pooled = x.mean(0)  # single sequence, no padding: every token is attended
    return pooled / np.linalg.norm(pooled), n


cases = []
for t in TEXTS:
    vec, n = embed(t)
    cases.append({"text": t, "tokens": n, "vector": [round(float(v), 7) for v in vec]})
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "minilm_reference.json")
json.dump({"model": "all-MiniLM-L6-v2", "generator": "minilm_reference.py (NumPy float64)", "cases": cases},
          open(out, "w"), indent=0)
print("wrote", out, [c["tokens"] for c in cases])
