#!/usr/bin/env python3
"""A numpy reference of the Llama forward of examples/llama/README.md, reading
the model with the PyPI `gguf` package's GGUFReader (independent of the C
reader). Float64 throughout.

  reference_forward.py --check MODEL.gguf REFERENCE.bin

recomputes the final-norm hidden rows of the tokens in REFERENCE.bin (written
by make_fixtures.py) and compares them with the rows stored there, which the
C test compares the C forward with. Exits 77 (a Meson skip) when numpy or
gguf is missing.
"""
import struct
import sys

try:
    import numpy as np
    from gguf import GGUFReader
except ImportError as missing:  # pragma: no cover - depends on the machine
    print(f"skipped: {missing} (pip install gguf numpy)")
    sys.exit(77)


def field_value(reader, key):
    field = reader.fields[key]
    return field.parts[field.data[0]].tolist()[0] if field.types[0] != 8 else bytes(field.parts[field.data[0]]).decode()


def load(path):
    reader = GGUFReader(path)
    hp = {name: field_value(reader, "llama." + name) for name in (
        "embedding_length", "block_count", "attention.head_count", "attention.head_count_kv",
        "feed_forward_length", "rope.freq_base", "attention.layer_norm_rms_epsilon")}
    # GGUFReader gives numpy shapes (dims reversed), i.e. PyTorch's [out, in].
    tensors = {t.name: np.asarray(t.data, dtype=np.float64).reshape([int(x) for x in reversed(t.shape)])
               for t in reader.tensors}
    return hp, tensors


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope(x, base):
    """GGML NORM rope: adjacent pairs (x[2i], x[2i+1]) of each head rotated by
    pos * base^(-2i/head_dim). x: [n, heads, head_dim]."""
    n, _, head_dim = x.shape
    inv_freq = base ** (-np.arange(0, head_dim, 2) / head_dim)
    angle = np.arange(n)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def forward(path, tokens):
    """Final-norm hidden rows [n, d] of tokens (positions 0..n-1)."""
    hp, w = load(path)
    d, n_head, n_kv = hp["embedding_length"], hp["attention.head_count"], hp["attention.head_count_kv"]
    head_dim, eps, n = d // n_head, hp["attention.layer_norm_rms_epsilon"], len(tokens)
    x = w["token_embd.weight"][np.asarray(tokens)]
    causal = np.tril(np.ones((n, n), dtype=bool))
    for layer in range(hp["block_count"]):
        p = f"blk.{layer}."
        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        q = rope((h @ w[p + "attn_q.weight"].T).reshape(n, n_head, head_dim), hp["rope.freq_base"])
        k = rope((h @ w[p + "attn_k.weight"].T).reshape(n, n_kv, head_dim), hp["rope.freq_base"])
        v = (h @ w[p + "attn_v.weight"].T).reshape(n, n_kv, head_dim)
        group = n_head // n_kv
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # query head h uses kv head h // group
        scores = np.einsum("qhc,khc->hqk", q, k) / np.sqrt(head_dim)
        scores = np.where(causal[None], scores, -np.inf)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        attn = np.einsum("hqk,khc->qhc", scores, v).reshape(n, d)
        x = x + attn @ w[p + "attn_output.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"], eps)
        gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
    return rms_norm(x, w["output_norm.weight"], eps)


def write_reference(path, tokens, hidden):
    """int32 n, int32 d, int32 tokens[n], float32 hidden[n, d] (little-endian)."""
    with open(path, "wb") as out:
        out.write(struct.pack("<ii", len(tokens), hidden.shape[1]))
        out.write(np.asarray(tokens, dtype="<i4").tobytes())
        out.write(np.asarray(hidden, dtype="<f4").tobytes())


def read_reference(path):
    with open(path, "rb") as f:
        n, d = struct.unpack("<ii", f.read(8))
        tokens = np.frombuffer(f.read(4 * n), dtype="<i4")
        hidden = np.frombuffer(f.read(4 * n * d), dtype="<f4").reshape(n, d)
    return tokens, hidden


def main(argv):
    if len(argv) != 4 or argv[1] != "--check":
        print(__doc__)
        return 2
    tokens, stored = read_reference(argv[3])
    hidden = forward(argv[2], tokens.tolist())
    error = float(np.max(np.abs(hidden - stored)))
    print(f"{argv[2]}: {len(tokens)} tokens, max |reference - stored| = {error:.3g}")
    return 0 if error < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
