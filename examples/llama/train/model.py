"""The Llama model of examples/llama/FORMAT.md in PyTorch: RMSNorm, RoPE on
adjacent pairs (llama.cpp's NORM rope type), GQA attention, SwiGLU, tied
embeddings, no biases.

Module names follow llama.cpp's tensor names, so the GGUF export is a fixed
renaming (gguf_tensor_names) and nothing is permuted.
"""
import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int
    n_layer: int
    n_head: int
    n_head_kv: int
    d_ff: int
    context_length: int
    norm_eps: float = 1e-5
    rope_base: float = 10000.0

    @property
    def head_dim(self):
        return self.d_model // self.n_head

    def validate(self):
        if self.d_model % self.n_head:
            raise ValueError("d_model %d is not a multiple of n_head %d" % (self.d_model, self.n_head))
        if self.n_head % self.n_head_kv:
            raise ValueError("n_head %d is not a multiple of n_head_kv %d" % (self.n_head, self.n_head_kv))
        if self.head_dim % 2:
            raise ValueError("head_dim %d is odd: RoPE rotates pairs" % self.head_dim)
        return self


# The pair of FORMAT.md.
TARGET = ModelConfig(vocab_size=16000, d_model=512, n_layer=6, n_head=8, n_head_kv=2,
                     d_ff=1280, context_length=512)
DRAFT = ModelConfig(vocab_size=16000, d_model=256, n_layer=2, n_head=4, n_head_kv=2,
                    d_ff=640, context_length=512)
# Scaled-down pair for a CPU smoke run of the training loop (same vocabulary).
SMOKE_TARGET = ModelConfig(vocab_size=16000, d_model=64, n_layer=2, n_head=4, n_head_kv=2,
                           d_ff=160, context_length=128)
SMOKE_DRAFT = ModelConfig(vocab_size=16000, d_model=32, n_layer=1, n_head=2, n_head_kv=1,
                          d_ff=80, context_length=128)


def rope_angles(n_positions, head_dim, base, device=None):
    """cos and sin, [n_positions, head_dim/2]: pair i at position p turns by
    p * base^(-2i/head_dim)."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    angles = torch.arange(n_positions, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
    return torch.cos(angles).float(), torch.sin(angles).float()


def apply_rope(x, cos, sin):
    """Rotates the adjacent pairs (x[2i], x[2i+1]) of the last dimension.
    x: [..., T, head_dim]; cos, sin: [T, head_dim/2]."""
    pairs = x.float().unflatten(-1, (-1, 2))
    x_even, x_odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).type_as(x)


class Block(nn.Module):
    def __init__(self, cfg, dropout):
        super().__init__()
        self.cfg = cfg
        self.dropout = dropout
        hd = cfg.head_dim
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn_q = nn.Linear(cfg.d_model, cfg.n_head * hd, bias=False)
        self.attn_k = nn.Linear(cfg.d_model, cfg.n_head_kv * hd, bias=False)
        self.attn_v = nn.Linear(cfg.d_model, cfg.n_head_kv * hd, bias=False)
        self.attn_output = nn.Linear(cfg.n_head * hd, cfg.d_model, bias=False)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn_gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.ffn_up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.ffn_down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def attention(self, x, cos, sin):
        cfg = self.cfg
        B, T, _ = x.shape
        q = self.attn_q(x).view(B, T, cfg.n_head, cfg.head_dim).transpose(1, 2)
        k = self.attn_k(x).view(B, T, cfg.n_head_kv, cfg.head_dim).transpose(1, 2)
        v = self.attn_v(x).view(B, T, cfg.n_head_kv, cfg.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # Query head h reads kv head h // (n_head / n_head_kv).
        group = cfg.n_head // cfg.n_head_kv
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        # The default scale is 1/sqrt(head_dim), the one FORMAT.md asks for.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                             dropout_p=self.dropout if self.training else 0.0)
        return self.attn_output(out.transpose(1, 2).reshape(B, T, cfg.n_head * cfg.head_dim))

    def forward(self, x, cos, sin):
        residual_dropout = self.dropout if self.training else 0.0
        x = x + F.dropout(self.attention(self.attn_norm(x), cos, sin), residual_dropout)
        h = self.ffn_norm(x)
        return x + F.dropout(self.ffn_down(F.silu(self.ffn_gate(h)) * self.ffn_up(h)), residual_dropout)


class Llama(nn.Module):
    def __init__(self, cfg, dropout=0.0):
        """dropout: on the attention weights and on both residual branches, in
        training mode only (a regulariser for the many passes over a small
        corpus; it is no part of the model the runtime computes)."""
        super().__init__()
        self.cfg = cfg.validate()
        self.token_embd = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, dropout) for _ in range(cfg.n_layer))
        self.output_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        cos, sin = rope_angles(cfg.context_length, cfg.head_dim, cfg.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self):
        # GPT-2 style: N(0, 0.02), the residual outputs scaled by 1/sqrt(2 n_layer).
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(("attn_output.weight", "ffn_down.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * self.cfg.n_layer))
            else:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens):
        """tokens [B, T] (T <= context_length), positions 0..T-1 -> logits [B, T, vocab]."""
        T = tokens.shape[1]
        if T > self.cfg.context_length:
            raise ValueError("sequence of %d tokens exceeds the context length %d" % (T, self.cfg.context_length))
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        x = self.token_embd(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        # Tied LM head: the token embedding is the output matrix.
        return F.linear(self.output_norm(x), self.token_embd.weight)


def gguf_tensor_names(cfg):
    """{PyTorch parameter name: llama.cpp tensor name}, every parameter once."""
    names = {"token_embd.weight": "token_embd.weight", "output_norm.weight": "output_norm.weight"}
    for i in range(cfg.n_layer):
        for part in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                     "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"):
            names["blocks.%d.%s.weight" % (i, part)] = "blk.%d.%s.weight" % (i, part)
    return names


def storage_dtype(tensor):
    """How the pair stores a tensor (FORMAT.md): matrices in float16, the
    one-dimensional norm weights in float32. Checkpoints use the same rule, so
    exporting one to GGUF loses nothing more."""
    return torch.float16 if tensor.dim() >= 2 else torch.float32


def count_parameters(model):
    return sum(p.numel() for p in model.parameters())
