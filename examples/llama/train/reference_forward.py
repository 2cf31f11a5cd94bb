#!/usr/bin/env python3
"""A plain numpy forward pass of a GGUF file of examples/llama/FORMAT.md, the
reference that the C runtime and the PyTorch model are checked against.

It is written from the format alone, in float64, one head at a time, with
RoPE as a complex rotation of the pairs (x[2i], x[2i+1]), so it shares no
code with model.py. Reading uses the `gguf` package's GGUFReader.

Usage, from the repository root:
  python3 examples/llama/train/reference_forward.py examples/llama/models/target.gguf --tokens 1 450 2038
  python3 examples/llama/train/reference_forward.py examples/llama/models/target.gguf \\
      --prompt examples/llama/models/prompts/bisect.txt --generate 20
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
BOS_ID = 1


class ReferenceModel:
    def __init__(self, path):
        import gguf

        reader = gguf.GGUFReader(path)
        fields = {name: field.contents() for name, field in reader.fields.items()}
        if fields.get("general.architecture") != "llama":
            raise ValueError("%s: general.architecture is %r, not 'llama'" % (path, fields.get("general.architecture")))
        self.d_model = int(fields["llama.embedding_length"])
        self.n_layer = int(fields["llama.block_count"])
        self.n_head = int(fields["llama.attention.head_count"])
        self.n_head_kv = int(fields["llama.attention.head_count_kv"])
        self.d_ff = int(fields["llama.feed_forward_length"])
        self.context_length = int(fields["llama.context_length"])
        self.vocab_size = int(fields["llama.vocab_size"])
        self.rope_base = float(fields["llama.rope.freq_base"])
        self.eps = float(fields["llama.attention.layer_norm_rms_epsilon"])
        self.head_dim = self.d_model // self.n_head
        self.weights = {}
        for tensor in reader.tensors:
            if tensor.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
                raise ValueError("%s: tensor %s has type %s; only F32 and F16 are supported"
                                 % (path, tensor.name, tensor.tensor_type.name))
            # GGUFReader gives the numpy shape (GGUF's dims reversed): [out, in].
            self.weights[tensor.name] = np.asarray(tensor.data, dtype=np.float64)
        if "output.weight" in self.weights:
            raise ValueError("%s: has output.weight; the format ties the LM head to token_embd.weight" % path)

    def rms_norm(self, x, weight):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

    def rope(self, x):
        """x: [T, n, head_dim] at positions 0..T-1."""
        T = x.shape[0]
        freqs = self.rope_base ** (-np.arange(0, self.head_dim, 2) / self.head_dim)
        rotation = np.exp(1j * np.arange(T)[:, None] * freqs[None, :])  # [T, head_dim/2]
        z = (x[..., 0::2] + 1j * x[..., 1::2]) * rotation[:, None, :]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = z.real, z.imag
        return out

    def logits(self, tokens):
        """tokens: sequence of ids, position 0 first -> logits [T, vocab] (float64)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        T = tokens.shape[0]
        if T > self.context_length:
            raise ValueError("%d tokens exceed the context length %d" % (T, self.context_length))
        if T and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            raise ValueError("token ids must lie in [0, %d)" % self.vocab_size)
        w = self.weights
        hd, group = self.head_dim, self.n_head // self.n_head_kv
        causal = np.triu(np.full((T, T), -np.inf), k=1)
        x = w["token_embd.weight"][tokens]
        for i in range(self.n_layer):
            p = "blk.%d." % i
            h = self.rms_norm(x, w[p + "attn_norm.weight"])
            q = self.rope((h @ w[p + "attn_q.weight"].T).reshape(T, self.n_head, hd))
            k = self.rope((h @ w[p + "attn_k.weight"].T).reshape(T, self.n_head_kv, hd))
            v = (h @ w[p + "attn_v.weight"].T).reshape(T, self.n_head_kv, hd)
            heads = []
            for head in range(self.n_head):
                kv = head // group
                scores = q[:, head, :] @ k[:, kv, :].T / np.sqrt(hd) + causal
                scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
                heads.append((scores / scores.sum(axis=-1, keepdims=True)) @ v[:, kv, :])
            x = x + np.concatenate(heads, axis=-1) @ w[p + "attn_output.weight"].T
            h = self.rms_norm(x, w[p + "ffn_norm.weight"])
            gate = h @ w[p + "ffn_gate.weight"].T
            up = h @ w[p + "ffn_up.weight"].T
            x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
        return self.rms_norm(x, w["output_norm.weight"]) @ w["token_embd.weight"].T


def main(argv=None):
    parser = argparse.ArgumentParser(description="numpy reference forward of an examples/llama GGUF file")
    parser.add_argument("gguf_file")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--tokens", type=int, nargs="+", help="token ids (bos is not added)")
    source.add_argument("--prompt", help="text file, tokenized with --tokenizer after a bos")
    parser.add_argument("--tokenizer", default=os.path.join(HERE, "..", "models", "tokenizer.model"))
    parser.add_argument("--generate", type=int, default=0, help="greedy tokens to append")
    args = parser.parse_args(argv)

    model = ReferenceModel(args.gguf_file)
    sp = None
    if args.prompt is not None:
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=args.tokenizer)
        with open(args.prompt, encoding="utf-8") as f:
            tokens = [BOS_ID] + sp.encode(f.read())
    else:
        tokens = list(args.tokens)
    prompt_len = len(tokens)
    for _ in range(args.generate):
        tokens.append(int(np.argmax(model.logits(tokens)[-1])))  # ties: smallest id
    logits = model.logits(tokens[:prompt_len])
    print("tokens:", " ".join(map(str, tokens[:prompt_len])))
    print("last position: argmax %d, logit %.6f, logsumexp %.6f" % (
        int(np.argmax(logits[-1])), logits[-1].max(),
        logits[-1].max() + np.log(np.exp(logits[-1] - logits[-1].max()).sum())))
    if args.generate:
        print("greedy:", " ".join(map(str, tokens[prompt_len:])))
        if sp is not None:
            print("greedy text: %r" % sp.decode(tokens[prompt_len:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
