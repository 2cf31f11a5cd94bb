#!/usr/bin/env python3
"""A real-size speculative decode step on the GPU, with the standard verify and
with FlashSpec's fused verify, in one run.

The target is a PyTorch decoder with random bf16 weights and the shapes of
Llama-3.1-8B or Qwen3-8B (every layer of the real model, a static KV cache).
For each (model, cached context, batch, k):

* verify step  = target forward over k + 1 tokens per sequence (the last
  accepted token and k drafts) + verify of the k drafts, target T = 1, top-p 1:
  - standard: logits GEMM (torch, bf16 logits as the model's LM head gives
    them), then a rejection sampler on materialised probabilities in the
    manner of vLLM's for drafts without draft probabilities: fp32 logits,
    temperature, softmax, acceptance test against float64 uniforms, recovered
    tokens by argmax(p / Exp(1) noise) with the draft token masked out, the
    bonus token from its own softmax and noise, then the accept/reject walk;
  - fused: flashspec verify_and_finalize on the final hidden rows (device
    arrays, no logits written).
* draft       = k greedy drafts of an EAGLE-style draft head (the target's
  embedding and last hidden state → fc → one decoder layer with its own KV
  cache → its own full-vocabulary LM head), one token per sequence a step:
  - standard: logits GEMM + argmax;  fused: flashspec draft (T = 0).
* full step   = draft + verify step, the drafts feeding the target forward.

Each path is captured in a CUDA graph and replayed, the paths interleaved; a
time is the median over replays of CUDA-event time. gain % = (standard time /
fused time − 1) × 100, the tokens/s gain at equal acceptance. Tokens/s is
reported at an assumed per-position acceptance a (default 0.7), i.e.
(1 − a^(k+1)) / (1 − a) expected tokens per sequence and step; the random
weights accept almost nothing, so no acceptance is measured here.

The exactness smoke (--exactness) builds hidden rows at real size whose target
distributions concentrate on a few tokens, repeats the verify of one fixed
batch many times with advancing steps, and compares the emitted tokens of the
standard sampler and of FlashSpec with chi-square tests (two-sample, and each
against the exact law computed in float64); a deliberately wrong sampler
(recovered token from p instead of the residual) shows the tests' power.

Needs torch, the Python binding with the CUDA backend on PYTHONPATH, scipy
for the smoke, and Triton for the standard sampler's two kernels (without
Triton, torch operations stand in and the run says so). --device cpu runs the
same code eagerly on the CPU backend (for checking the code, not for timing).
"""
import argparse
import contextlib
import json
import math
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import flashspec

try:
    import triton
    import triton.language as tl
except ImportError:  # the standard sampler then runs on torch operations
    triton = None

MODELS = {
    "llama3.1-8b": dict(d=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256,
                        qk_norm=False, rope_theta=500000.0),
    "qwen3-8b": dict(d=4096, layers=36, heads=32, kv_heads=8, head_dim=128, ffn=12288, vocab=151936,
                     qk_norm=True, rope_theta=1000000.0),
    # Not a real model: for checking the program quickly (and on the CPU).
    "tiny": dict(d=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512, vocab=5000,
                 qk_norm=True, rope_theta=10000.0),
}
EPS = 1e-6
INIT_STD = 0.02


# ---------------------------------------------------------------------------
# Attention over a static KV cache
# ---------------------------------------------------------------------------
_MASKS = {}


def causal_mask(t, s, device, repeat=1):
    """[repeat·t, s] boolean: query row i (position s − t + i mod t) sees keys
    0..s − t + (i mod t). Kept per shape, so a captured graph reads a tensor
    made before the capture."""
    key = (t, s, str(device), repeat)
    if key not in _MASKS:
        _MASKS[key] = torch.ones(t, s, dtype=torch.bool, device=device).tril(s - t).repeat(repeat, 1)
    return _MASKS[key]


def attention_reference(q, k, v):
    """q [B, H, T, hd] of the last T positions, k/v [B, KV, S, hd]: causal
    (query t sees keys up to S − T + t), grouped-query, fp32 math."""
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, 1).float()
    v = v.repeat_interleave(rep, 1).float()
    scores = q.float() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    return (scores.softmax(-1) @ v).to(q.dtype)


def attention_lower_right(q, k, v):
    from torch.nn.attention.bias import causal_lower_right
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2]),
                                          enable_gqa=True)


def attention_folded(q, k, v):
    """The query heads sharing a KV head folded into the query length, one
    boolean mask: any SDPA kernel that takes a mask, K/V read once."""
    b, h, t, hd = q.shape
    kv = k.shape[1]
    rep = h // kv
    o = F.scaled_dot_product_attention(q.reshape(b, kv, rep * t, hd), k, v,
                                       attn_mask=causal_mask(t, k.shape[2], q.device, rep))
    return o.view(b, h, t, hd)


def pick_attention(cfg, device):
    """The first implementation that matches the fp32 reference on a small
    case of the model's head shape: lower-right causal SDPA (flash attention
    with grouped-query heads where torch allows), else SDPA with a boolean
    mask over folded query heads, else the reference itself."""
    gen = torch.Generator(device).manual_seed(1)
    h, kv, hd = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    q = torch.randn(2, h, 5, hd, generator=gen, device=device).to(torch.bfloat16)
    k = torch.randn(2, kv, 70, hd, generator=gen, device=device).to(torch.bfloat16)
    v = torch.randn(2, kv, 70, hd, generator=gen, device=device).to(torch.bfloat16)
    for name, fn in (("sdpa lower-right causal, grouped-query heads", attention_lower_right),
                     ("sdpa boolean mask, query heads folded per KV head", attention_folded)):
        try:
            ok = all((fn(q[:, :, -t:], k, v).float() - attention_reference(q[:, :, -t:], k, v).float())
                     .abs().max().item() < 3e-2 for t in (1, 5))
        except Exception as e:  # not available in this torch / on this device
            print(f"attention: {name} unavailable ({type(e).__name__}: {e})")
            continue
        if ok:
            return name, fn
        print(f"attention: {name} differs from the reference; not used")
    return "fp32 reference (repeat_interleave)", attention_reference


# ---------------------------------------------------------------------------
# The decoder (random weights)
# ---------------------------------------------------------------------------
def _normal(shape, gen, device, std=INIT_STD):
    return torch.empty(shape, device=device, dtype=torch.bfloat16).normal_(0.0, std, generator=gen)


class Layer:
    def __init__(self, cfg, gen, device):
        d, h, kv, hd, ffn = cfg["d"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["ffn"]
        self.cfg = cfg
        self.wqkv = _normal(((h + 2 * kv) * hd, d), gen, device)
        self.wo = _normal((d, h * hd), gen, device)
        self.wgu = _normal((2 * ffn, d), gen, device)
        self.wdown = _normal((d, ffn), gen, device)
        ones = lambda n: torch.ones(n, device=device, dtype=torch.bfloat16)  # noqa: E731
        self.ln1, self.ln2 = ones(d), ones(d)
        self.q_norm, self.k_norm = (ones(hd), ones(hd)) if cfg["qk_norm"] else (None, None)

    def forward(self, x, k_cache, v_cache, start, rope, attention):
        """x [B, T, d] at positions start..start+T−1; the layer's cache slices
        k_cache/v_cache [B, KV, S, hd] receive the T new keys and values."""
        cfg = self.cfg
        b, t, d = x.shape
        h, kv, hd = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
        y = F.rms_norm(x, (d,), self.ln1, EPS)
        q, k, v = F.linear(y, self.wqkv).split([h * hd, kv * hd, kv * hd], -1)
        q, k, v = q.view(b, t, h, hd), k.view(b, t, kv, hd), v.view(b, t, kv, hd)
        if self.q_norm is not None:
            q = F.rms_norm(q, (hd,), self.q_norm, EPS)
            k = F.rms_norm(k, (hd,), self.k_norm, EPS)
        q, k = rope(q), rope(k)
        k_cache[:, :, start:start + t].copy_(k.transpose(1, 2))
        v_cache[:, :, start:start + t].copy_(v.transpose(1, 2))
        o = attention(q.transpose(1, 2), k_cache[:, :, :start + t], v_cache[:, :, :start + t])
        x = x + F.linear(o.transpose(1, 2).reshape(b, t, h * hd), self.wo)
        gate, up = F.linear(F.rms_norm(x, (d,), self.ln2, EPS), self.wgu).chunk(2, -1)
        return x + F.linear(F.silu(gate) * up, self.wdown)


class Rope:
    """cos/sin tables for positions [0, max_pos); rotate-half convention."""

    def __init__(self, cfg, max_pos, device):
        hd = cfg["head_dim"]
        inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))
        ang = torch.arange(max_pos, device=device, dtype=torch.float32)[:, None] * inv[None]
        ang = torch.cat([ang, ang], -1)
        self.cos, self.sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)

    def at(self, start, t):
        cos = self.cos[start:start + t][:, None]  # [T, 1, hd] against [B, T, H, hd]
        sin = self.sin[start:start + t][:, None]

        def apply(x):
            half = x.shape[-1] // 2
            rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
            return x * cos + rotated * sin
        return apply


class Target:
    def __init__(self, cfg, gen, device, max_batch, max_pos, attention):
        self.cfg, self.attention = cfg, attention
        d, v = cfg["d"], cfg["vocab"]
        self.embed = _normal((v, d), gen, device, std=1.0)
        self.layers = [Layer(cfg, gen, device) for _ in range(cfg["layers"])]
        self.norm = torch.ones(d, device=device, dtype=torch.bfloat16)
        self.lm_head = _normal((v, d), gen, device)
        shape = (max_batch, cfg["kv_heads"], max_pos, cfg["head_dim"])
        self.k_cache = [torch.zeros(shape, device=device, dtype=torch.bfloat16) for _ in self.layers]
        self.v_cache = [torch.zeros(shape, device=device, dtype=torch.bfloat16) for _ in self.layers]
        self.rope = Rope(cfg, max_pos, device)

    def forward(self, ids, start):
        """ids [B, T] at positions start..start+T−1 (the cache holds start
        tokens): the final-norm hidden rows, [B·T, d], request-major."""
        b, t = ids.shape
        x = F.embedding(ids, self.embed)
        rope = self.rope.at(start, t)
        for layer, kc, vc in zip(self.layers, self.k_cache, self.v_cache):
            x = layer.forward(x, kc[:b], vc[:b], start, rope, self.attention)
        return F.rms_norm(x, (self.cfg["d"],), self.norm, EPS).view(b * t, -1)


class DraftHead:
    """EAGLE-style: fc([embedding(token), feature]) → one decoder layer (own
    KV cache) → feature; norm → its own full-vocabulary LM head."""

    def __init__(self, cfg, target, gen, device, max_batch, max_pos):
        d = cfg["d"]
        self.cfg, self.target = cfg, target
        self.fc = _normal((d, 2 * d), gen, device)
        self.layer = Layer(cfg, gen, device)
        self.norm = torch.ones(d, device=device, dtype=torch.bfloat16)
        self.lm_head = _normal((cfg["vocab"], d), gen, device)
        shape = (max_batch, cfg["kv_heads"], max_pos, cfg["head_dim"])
        self.k_cache = torch.zeros(shape, device=device, dtype=torch.bfloat16)
        self.v_cache = torch.zeros(shape, device=device, dtype=torch.bfloat16)

    def hidden(self, token, feature, position):
        """token [B], feature [B, d] → (normed row for the LM head, next feature)."""
        b, d = feature.shape
        x = F.linear(torch.cat([F.embedding(token, self.target.embed), feature], -1), self.fc).view(b, 1, d)
        x = self.layer.forward(x, self.k_cache[:b], self.v_cache[:b], position, self.target.rope.at(position, 1),
                               self.target.attention).view(b, d)
        return F.rms_norm(x, (d,), self.norm, EPS), x

    def draft(self, token, feature, k, start, pick):
        """k greedy drafts [B, k] int32; pick(rows, step) → token ids [B]."""
        tokens = []
        for i in range(k):
            rows, feature = self.hidden(token, feature, start + i)
            token = pick(rows, i)
            tokens.append(token)
        return torch.stack(tokens, 1).to(torch.int32)


# ---------------------------------------------------------------------------
# The standard verify: logits, materialised probabilities, rejection sampler
# ---------------------------------------------------------------------------
if triton is not None:
    @triton.jit
    def _recovered_kernel(out_ptr, drafts_ptr, probs_ptr, inv_q_ptr, vocab, K: tl.constexpr,
                          EXCLUDE_DRAFT: tl.constexpr, BLOCK: tl.constexpr):
        # One program per (request, draft position): argmax over the vocabulary
        # of p(v) / E(v) with the request's Exp(1) noise E, the draft token
        # masked out (the residual of a point-mass draft).
        req = tl.program_id(0)
        row = req * K + tl.program_id(1)
        draft = tl.load(drafts_ptr + row)
        probs_row = probs_ptr + row.to(tl.int64) * vocab
        inv_q_row = inv_q_ptr + req.to(tl.int64) * vocab
        best = tl.full((), float("-inf"), tl.float32)
        best_id = tl.full((), 0, tl.int32)
        for start in range(0, vocab, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            valid = offs < vocab
            if EXCLUDE_DRAFT:
                keep = valid & (offs != draft)
            else:
                keep = valid
            p = tl.load(probs_row + offs, mask=keep, other=0.0)
            inv_q = tl.load(inv_q_row + offs, mask=valid, other=0.0)
            score = tl.where(valid, p * inv_q, float("-inf"))
            block_max, block_arg = tl.max(score, axis=0, return_indices=True)
            better = block_max > best
            best_id = tl.where(better, start + block_arg, best_id)
            best = tl.where(better, block_max, best)
        tl.store(out_ptr + row, best_id)

    @triton.jit
    def _accept_kernel(out_ptr, drafts_ptr, probs_ptr, uniform_ptr, recovered_ptr, bonus_ptr, vocab,
                       K: tl.constexpr):
        # One program per request: accept draft j while u_j <= p_j(draft_j);
        # the first rejection emits the recovered token, else the bonus token.
        req = tl.program_id(0)
        alive = tl.full((), 1, tl.int32)
        for pos in tl.static_range(K):
            row = req * K + pos
            draft = tl.load(drafts_ptr + row)
            p = tl.load(probs_ptr + row.to(tl.int64) * vocab + draft)
            accepted = p.to(tl.float64) >= tl.load(uniform_ptr + row)
            token = tl.where(accepted, draft, tl.load(recovered_ptr + row))
            tl.store(out_ptr + req * (K + 1) + pos, token, mask=alive == 1)
            alive = alive * accepted.to(tl.int32)
        tl.store(out_ptr + req * (K + 1) + K, tl.load(bonus_ptr + req).to(tl.int32), mask=alive == 1)


def _recovered_torch(drafts, probs, inv_q, b, k, exclude_draft):
    score = probs.view(b, k, -1) * inv_q.unsqueeze(1)
    if exclude_draft:
        score.scatter_(2, drafts.view(b, k, 1).long(), -1.0)
    return score.argmax(-1).to(torch.int32).view(-1)


def _accept_torch(out, drafts, probs, uniform, recovered, bonus, b, k):
    d = drafts.view(b, k).long()
    accepted = probs.view(b, k, -1).gather(2, d.unsqueeze(2)).squeeze(2).double() >= uniform.view(b, k)
    n = torch.cumprod(accepted.int(), 1).sum(1, keepdim=True)
    tokens = torch.cat([torch.where(accepted, d, recovered.view(b, k).long()), bonus.view(b, 1)], 1)
    position = torch.arange(k + 1, device=out.device)[None]
    out.copy_(torch.where(position <= n, tokens, -1).view(b, k + 1))


class StandardVerify:
    """Target logits for all rows, then the sampler. out: [B, k+1] int32,
    request r's emitted tokens then −1. logits(hidden) gives the logits
    (default: the bf16 GEMM); exclude_draft=False makes the deliberately wrong
    sampler that draws the recovered token from p itself."""

    def __init__(self, weight, b, k, logits=None, exclude_draft=True, use_triton=True):
        dev = weight.device
        self.weight, self.b, self.k, self.v = weight, b, k, weight.shape[0]
        self.logits = logits or (lambda hidden: F.linear(hidden, weight))
        self.exclude_draft = exclude_draft
        self.use_triton = use_triton and triton is not None and dev.type == "cuda"
        rows = torch.arange(b * (k + 1), device=dev).view(b, k + 1)
        self.target_rows = rows[:, :k].reshape(-1)
        self.bonus_rows = rows[:, k].contiguous()
        self.temperature = torch.ones(b, device=dev)
        self.token_temperature = torch.ones(b * k, device=dev)
        self.out = torch.full((b, k + 1), -1, dtype=torch.int32, device=dev)

    def __call__(self, hidden, drafts):
        """hidden [B·(k+1), d] request-major, drafts [B·k] int32."""
        b, k, v = self.b, self.k, self.v
        logits = self.logits(hidden)
        # Bonus tokens: the sampler on the bonus rows (fp32, T, softmax, Exp noise).
        bonus = logits[self.bonus_rows].to(torch.float32)
        bonus.div_(self.temperature.unsqueeze(1))
        bonus_probs = bonus.softmax(-1, dtype=torch.float32)
        bonus_tokens = bonus_probs.div_(torch.empty_like(bonus_probs).exponential_()).argmax(-1)
        # Draft rows: fp32 logits / T, probabilities, uniforms, recovered tokens.
        target = logits[self.target_rows].to(torch.float32)
        target.div_(self.token_temperature.unsqueeze(1))
        probs = target.softmax(-1, dtype=torch.float32)
        uniform = torch.rand(b * k, dtype=torch.float64, device=hidden.device)
        inv_q = torch.empty((b, v), dtype=torch.float32, device=hidden.device).exponential_().reciprocal()
        self.out.fill_(-1)
        if self.use_triton:
            recovered = torch.empty(b * k, dtype=torch.int32, device=hidden.device)
            _recovered_kernel[(b, k)](recovered, drafts, probs, inv_q, v, K=k, EXCLUDE_DRAFT=self.exclude_draft,
                                      BLOCK=8192)
            _accept_kernel[(b,)](self.out, drafts, probs, uniform, recovered, bonus_tokens, v, K=k)
        else:
            recovered = _recovered_torch(drafts, probs, inv_q, b, k, self.exclude_draft)
            _accept_torch(self.out, drafts, probs, uniform, recovered, bonus_tokens, b, k)
        return self.out


class FusedVerify:
    """flashspec verify_and_finalize on the hidden rows; steps advance on the
    device (next_steps is the batch's steps), so graph replays draw fresh noise."""

    def __init__(self, ctx, head, b, k, device):
        self.ctx, self.head, self.b, self.k = ctx, head, b, k
        self.offsets = (torch.arange(b + 1, dtype=torch.int32) * k).to(device)
        self.temperatures = torch.ones(b, dtype=torch.float32, device=device)
        self.steps = torch.zeros(b, dtype=torch.int64, device=device)
        self.accepted = torch.empty(b, dtype=torch.int32, device=device)
        self.emitted = torch.empty(b * (k + 1), dtype=torch.int32, device=device)
        self.result = flashspec.VerifyResult(self.accepted, self.emitted, self.steps)

    def __call__(self, hidden, drafts):
        batch = flashspec.VerifyBatch(self.offsets, drafts, hidden, temperatures=self.temperatures,
                                      steps=self.steps, max_draft_len=self.k)
        self.ctx.verify_and_finalize(self.head, batch, out=self.result)
        return self.accepted, self.emitted


class FusedDraft:
    """flashspec greedy draft into per-step token buffers."""

    def __init__(self, ctx, head, b, k, device):
        self.ctx, self.head = ctx, head
        self.tokens = torch.empty((k, b), dtype=torch.int32, device=device)
        self.scores = torch.empty((k, b), dtype=torch.float32, device=device)

    def __call__(self, rows, step):
        self.ctx.draft(self.head, rows, tokens_out=self.tokens[step], scores_out=self.scores[step])
        return self.tokens[step]


def standard_pick(weight):
    return lambda rows, step: F.linear(rows, weight).argmax(-1)


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------
class Runner:
    """CUDA graphs replayed and timed with events, or (on the CPU) eager calls
    timed with the wall clock."""

    def __init__(self, device, ctx_stream):
        self.device, self.stream = device, ctx_stream
        self.cuda = device.type == "cuda"

    def prepare(self, fns):
        if not self.cuda:
            return dict(fns)
        graphs, pool = {}, torch.cuda.graph_pool_handle()
        self.stream.wait_stream(torch.cuda.current_stream())  # inputs made on the default stream
        for name, fn in fns.items():
            with torch.cuda.stream(self.stream):
                fn()  # lazy allocations, kernel compilation, workspace
                fn()
            self.stream.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool, stream=self.stream):
                fn()
            graphs[name] = g.replay
        torch.cuda.synchronize()
        return graphs

    def time(self, runs, warmup, iters):
        names = list(runs)
        for _ in range(warmup):
            for n in names:
                runs[n]()
        samples = {n: [] for n in names}
        if self.cuda:
            events = {n: [] for n in names}
            for it in range(iters):
                for n in (names if it % 2 == 0 else names[::-1]):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    runs[n]()
                    end.record()
                    events[n].append((start, end))
            torch.cuda.synchronize()
            for n in names:
                samples[n] = [s.elapsed_time(e) for s, e in events[n]]
        else:
            for it in range(iters):
                for n in (names if it % 2 == 0 else names[::-1]):
                    t0 = time.perf_counter()
                    runs[n]()
                    samples[n].append((time.perf_counter() - t0) * 1e3)
        return {n: statistics.median(samples[n]) for n in names}


def expected_tokens(k, a):
    return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def bench_config(model, target, drafter, ctx, heads, runner, b, k, start, args, device, gen):
    cfg = target.cfg
    v = cfg["vocab"]
    ids = torch.randint(0, v, (b, k + 1), generator=gen, device=device, dtype=torch.int32)
    drafts = ids[:, 1:].contiguous().view(-1)
    last = ids[:, 0].contiguous()
    feature = torch.randn((b, cfg["d"]), generator=gen, device=device).to(torch.bfloat16)
    standard = StandardVerify(target.lm_head, b, k)
    fused = FusedVerify(ctx, heads["target"], b, k, device)
    fused_pick = FusedDraft(ctx, heads["draft"], b, k, device)
    std_pick = standard_pick(drafter.lm_head)

    def verify_step(verify):
        return lambda: verify(target.forward(ids, start), drafts)

    def draft(pick):
        return lambda: drafter.draft(last, feature, k, start, pick)

    def full_step(pick, verify):
        def step():
            d = drafter.draft(last, feature, k, start, pick)
            verify(target.forward(torch.cat([last[:, None], d], 1), start), d.view(-1))
        return step

    fns = {"verify_standard": verify_step(standard), "verify_fused": verify_step(fused),
           "draft_standard": draft(std_pick), "draft_fused": draft(fused_pick),
           "step_standard": full_step(std_pick, standard), "step_fused": full_step(fused_pick, fused)}
    runs = runner.prepare(fns)
    ms = runner.time(runs, args.warmup, args.iters)
    # Sanity of what the last replays wrote: every request emitted tokens.
    runs["step_standard"]()
    runs["step_fused"]()
    if runner.cuda:
        torch.cuda.synchronize()
    counts, std_first, drafted = fused.accepted.cpu(), standard.out[:, 0].cpu(), fused_pick.tokens.cpu()
    ok = bool((counts >= 0).all() and (counts <= k).all() and (std_first >= 0).all() and (std_first < v).all()
              and (drafted >= 0).all() and (drafted < v).all())
    e = expected_tokens(k, args.acceptance)
    rec = {"model": model, "layers": cfg["layers"], "d": cfg["d"], "vocab": v, "context": start,
           "batch": b, "k": k, "target_rows": b * (k + 1), "ms": ms,
           "gain_pct": {p: 100.0 * (ms[f"{p}_standard"] / ms[f"{p}_fused"] - 1.0)
                        for p in ("verify", "draft", "step")},
           "expected_tokens_per_step": e,
           "tokens_per_s": {n: b * e / (ms[n] / 1e3) for n in
                            ("verify_standard", "verify_fused", "step_standard", "step_fused")},
           "outputs_valid": ok}
    del runs, fns
    return rec


# ---------------------------------------------------------------------------
# Exactness smoke
# ---------------------------------------------------------------------------
SUPPORT_P = [0.45, 0.2, 0.12, 0.08, 0.06, 0.04, 0.03, 0.02]
PEAK_LOGIT = 16.0


def peaked_rows(weight, k, gen):
    """k + 1 hidden rows (bf16) whose logits put the SUPPORT_P law (up to the
    tail of the other tokens) on 8 random tokens each, and the drafts: the
    most likely token of rows 0 and 2.., the second of row 1. Returns
    (rows, drafts, supports [k+1, 8])."""
    v, d = weight.shape
    rows, supports = [], []
    z = torch.tensor([PEAK_LOGIT + math.log(p) for p in SUPPORT_P], dtype=torch.float64)
    for _ in range(k + 1):
        s = torch.randperm(v, generator=gen)[:len(SUPPORT_P)]
        ws = weight[s.to(weight.device)].double().cpu()  # [m, d]
        h = ws.T @ torch.linalg.solve(ws @ ws.T, z)  # least-norm h with ws·h = z
        rows.append(h)
        supports.append(s)
    hidden = torch.stack(rows).to(torch.bfloat16).to(weight.device)
    supports = torch.stack(supports)
    drafts = torch.tensor([supports[j, 1 if j == 1 else 0] for j in range(k)], dtype=torch.int32)
    return hidden, drafts, supports


def exact_probs(weight, hidden, chunk=16384):
    """softmax(W·h) in float64 for each row of hidden: [rows, V] (on the CPU)."""
    h = hidden.double()
    logits = torch.cat([weight[i:i + chunk].double() @ h.T for i in range(0, weight.shape[0], chunk)], 0)
    return torch.softmax(logits.T.cpu(), -1)


def category_law(p, drafts, supports):
    """Probability of each category (n accepted, bin of the emitted token at
    position n) under Algorithm 1 with point-mass drafts: A_n · p_n(y) for
    y ≠ draft n (n < k), A_k · p_k(y) for the bonus; bins: the 8 support
    tokens of row n, then the rest."""
    k = len(drafts)
    m = supports.shape[1]
    law = np.zeros((k + 1, m + 1))
    reach = 1.0
    for n in range(k + 1):
        pn = p[n].numpy()
        sup = supports[n].numpy()
        probs = pn[sup].copy()
        if n < k:
            probs[sup == int(drafts[n])] = 0.0  # the draft is emitted only as an accepted token
        law[n, :m] = reach * probs
        law[n, m] = reach * (1.0 - pn[sup].sum())
        if n < k:
            reach *= pn[int(drafts[n])]
    return law.ravel()


def categories(n, y, supports):
    """Category index of each sample (n accepted, token y at position n)."""
    m = supports.shape[1]
    sup = supports.to(n.device)[n]  # [samples, m]
    match = sup == y[:, None]
    bin_ = torch.where(match.any(1), match.float().argmax(1), torch.full_like(n, m))
    return n * (m + 1) + bin_


def pooled(observed, expected, minimum=5.0):
    """Pool the categories whose expected count is below minimum into one."""
    small = expected < minimum
    if small.sum() <= 1:
        return observed, expected
    return (np.append(observed[~small], observed[small].sum()), np.append(expected[~small], expected[small].sum()))


def gof_pvalue(counts, law):
    from scipy.stats import chisquare
    total = counts.sum()
    impossible = int(counts[law <= 0].sum())
    if impossible:
        return 0.0, impossible
    keep = law > 0
    obs, exp = pooled(counts[keep].astype(float), law[keep] / law[keep].sum() * total)
    return float(chisquare(obs, exp).pvalue), 0


def two_sample_pvalue(a, b):
    from scipy.stats import chi2_contingency
    total = a + b
    keep = total > 0
    a, b, total = a[keep].astype(float), b[keep].astype(float), total[keep].astype(float)
    small = total < 10
    if small.sum() > 1:
        a = np.append(a[~small], a[small].sum())
        b = np.append(b[~small], b[small].sum())
    return float(chi2_contingency(np.stack([a, b])).pvalue)


def exactness(weight, ctx, head, device, args, gen):
    """Standard sampler (fp32 logits), FlashSpec, the wrong sampler and the
    standard sampler on bf16 logits, each repeated on one fixed batch of
    identical requests; returns the JSON record and prints the p-values."""
    k = 3
    hidden1, drafts1, supports = peaked_rows(weight, k, gen)
    p = exact_probs(weight, hidden1)
    law = category_law(p, drafts1, supports)
    weight32 = weight.float()
    fp32_logits = lambda h: F.linear(h.float(), weight32)  # noqa: E731
    record = {"k": k, "vocab": weight.shape[0], "d": weight.shape[1], "support_law": SUPPORT_P,
              "draft_target_probs": [float(p[j, int(drafts1[j])]) for j in range(k)],
              "tail_mass": [float(1.0 - p[j, supports[j]].sum()) for j in range(k + 1)], "batches": []}
    print(f"\nExactness smoke: V = {weight.shape[0]}, d = {weight.shape[1]}, k = {k}, target T = 1; "
          f"p(draft) per position {', '.join(f'{x:.3f}' for x in record['draft_target_probs'])}; "
          f"tail mass per row {', '.join(f'{x:.3f}' for x in record['tail_mass'])}")
    for index, requests in enumerate(args.exactness_requests):
        steps = max(1, args.exactness_samples // requests)
        hidden = hidden1.repeat(requests, 1).contiguous()
        drafts = drafts1.repeat(requests).to(device)
        samplers = {
            "standard": StandardVerify(weight, requests, k, logits=fp32_logits),
            "fused": FusedVerify(ctx, head, requests, k, device),
            "wrong (recovered from p)": StandardVerify(weight, requests, k, logits=fp32_logits, exclude_draft=False),
            "standard, bf16 logits": StandardVerify(weight, requests, k),
        }
        samplers["fused"].steps.fill_(1000000 * index)  # noise independent of the other batch shapes
        counts = {}
        for name, sampler in samplers.items():
            ns, ys, prefix_ok = [], [], True
            for _ in range(steps):
                out = sampler(hidden, drafts)
                if isinstance(out, tuple):
                    n, emitted = out[0].long(), out[1].view(requests, k + 1)
                else:
                    emitted = out
                    n = (out >= 0).sum(1).long() - 1
                ns.append(n.clone())
                ys.append(emitted.gather(1, n.clamp(min=0)[:, None]).squeeze(1).long())
                # The accepted prefix is the drafts themselves.
                prefix = (torch.arange(k, device=device)[None] < n[:, None])
                prefix_ok &= bool(((emitted[:, :k] == drafts.view(requests, k)) | ~prefix).all())
            n, y = torch.cat(ns), torch.cat(ys)
            if (n < 0).any():
                raise RuntimeError(f"exactness: {name} reported a request error")
            if not prefix_ok:
                raise RuntimeError(f"exactness: {name} emitted an accepted prefix that is not the drafts")
            counts[name] = np.bincount(categories(n, y, supports).cpu().numpy(), minlength=law.size)
        entry = {"requests": requests, "target_rows": requests * (k + 1), "samples": int(steps * requests),
                 "counts": {n: c.tolist() for n, c in counts.items()}, "gof_pvalue": {}, "impossible": {},
                 "two_sample_pvalue": {}}
        for name, c in counts.items():
            entry["gof_pvalue"][name], entry["impossible"][name] = gof_pvalue(c, law)
        for name in ("standard", "wrong (recovered from p)", "standard, bf16 logits"):
            entry["two_sample_pvalue"][f"{name} vs fused"] = two_sample_pvalue(counts[name], counts["fused"])
        record["batches"].append(entry)
        print(f"  {requests} requests × {k + 1} rows, {entry['samples']} samples per sampler:")
        for name in ("standard", "wrong (recovered from p)", "standard, bf16 logits"):
            print(f"    two-sample chi-square, {name} vs fused: p = {entry['two_sample_pvalue'][name + ' vs fused']:.3g}")
        for name in counts:
            extra = f" ({entry['impossible'][name]} samples of zero probability)" if entry["impossible"][name] else ""
            print(f"    against the exact law, {name}: p = {entry['gof_pvalue'][name]:.3g}{extra}")
    return record


# ---------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------
def device_info(device):
    info = {"python": platform.python_version(), "torch": torch.__version__, "flashspec": flashspec.version(),
            "triton": getattr(triton, "__version__", None)}
    if device.type == "cuda":
        prop = torch.cuda.get_device_properties(device)
        info.update(card=prop.name, sms=prop.multi_processor_count, memory_mib=prop.total_memory // 2**20,
                    cuda=torch.version.cuda)
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=30).stdout.split("\n")[0].strip()
        except (OSError, subprocess.SubprocessError):
            info["driver"] = None
    else:
        info["card"] = "cpu"
    return info


def print_table(records, acceptance):
    print(f"\nms = median step time; gain = standard / fused − 1; tok/s at acceptance {acceptance} per position "
          f"(E tokens per sequence and step = (1 − a^(k+1)) / (1 − a)), full step = draft + verify step")
    for model in dict.fromkeys(r["model"] for r in records):
        rows = [r for r in records if r["model"] == model]
        print(f"\n{model} ({rows[0]['layers']} layers, V = {rows[0]['vocab']})\n")
        print("| ctx | batch | k | verify step std ms | fused ms | gain % | draft std ms | fused ms | gain % "
              "| full step std ms | fused ms | gain % | E | tok/s std | tok/s fused |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            ms, g, t = r["ms"], r["gain_pct"], r["tokens_per_s"]
            print(f"| {r['context']} | {r['batch']} | {r['k']} | {ms['verify_standard']:.3f} | {ms['verify_fused']:.3f} "
                  f"| {g['verify']:+.1f} | {ms['draft_standard']:.3f} | {ms['draft_fused']:.3f} | {g['draft']:+.1f} "
                  f"| {ms['step_standard']:.3f} | {ms['step_fused']:.3f} | {g['step']:+.1f} "
                  f"| {r['expected_tokens_per_step']:.2f} | {t['step_standard']:.0f} | {t['step_fused']:.0f} |")


def int_list(text):
    return [int(x) for x in text.split(",") if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="llama3.1-8b,qwen3-8b", help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--contexts", type=int_list, default=[512, 2048], help="tokens already in the KV cache")
    ap.add_argument("--batches", type=int_list, default=[1, 8, 32, 64])
    ap.add_argument("--ks", type=int_list, default=[3, 4, 8], help="draft lengths")
    ap.add_argument("--warmup", type=int, default=3, help="untimed replays of each graph")
    ap.add_argument("--iters", type=int, default=20, help="timed replays of each graph (median)")
    ap.add_argument("--acceptance", type=float, default=0.7, help="assumed per-position acceptance for tokens/s")
    ap.add_argument("--exactness", choices=["on", "off", "only"], default="on")
    ap.add_argument("--exactness-samples", type=int, default=20000, help="emitted sequences per sampler and batch")
    ap.add_argument("--exactness-requests", type=int_list, default=[4, 64],
                    help="requests of k = 3 per verify call (4: 16 rows, the streaming scan; 64: 256 rows)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    args = ap.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device visible to torch (use --device cpu to check the code on the CPU)")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(args.seed)
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            sys.exit(f"unknown model {m!r}: one of {', '.join(MODELS)}")
    info = device_info(device)
    print(f"device: {info.get('card')}, driver {info.get('driver')}, torch {info['torch']}, "
          f"flashspec {info['flashspec']}, triton {info['triton']}")
    if triton is None and device.type == "cuda":
        print("Triton is missing: the standard sampler's two kernels run as torch operations")
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    ctx = flashspec.Context(args.device, cuda_stream=stream, seed=args.seed + 7, max_rows=1024, max_requests=256)
    runner = Runner(device, stream)
    gen = torch.Generator(device).manual_seed(args.seed)
    cpu_gen = torch.Generator().manual_seed(args.seed)
    borrow = device.type == "cuda"
    records, exact, attention_used = [], None, {}
    start_time = time.time()
    for model in models:
        cfg = MODELS[model]
        attention_name, attention = pick_attention(cfg, device)
        attention_used[model] = attention_name
        max_pos = max(args.contexts) + max(args.ks) + 1
        max_batch = max(args.batches)
        if args.exactness == "only":
            max_batch, max_pos = 1, 1
        t0 = time.time()
        target = Target(cfg, gen, device, max_batch, max_pos, attention)
        drafter = DraftHead(cfg, target, gen, device, max_batch, max_pos)
        heads = {"target": ctx.lm_head(target.lm_head, borrow=borrow),
                 "draft": ctx.lm_head(drafter.lm_head, borrow=borrow)}
        print(f"\n{model}: {cfg['layers']} layers, d {cfg['d']}, {cfg['heads']}/{cfg['kv_heads']} heads, "
              f"FFN {cfg['ffn']}, V {cfg['vocab']}; attention: {attention_name}; built in {time.time() - t0:.1f} s")
        if exact is None and args.exactness != "off":
            # Eager, all on the context's stream (flashspec writes its outputs there).
            if stream is not None:
                stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                exact = exactness(target.lm_head, ctx, heads["target"], device, args, cpu_gen)
            if stream is not None:
                torch.cuda.current_stream().wait_stream(stream)
            exact["model"] = model
        if args.exactness != "only":
            for start in args.contexts:
                for b in args.batches:
                    for k in args.ks:
                        r = bench_config(model, target, drafter, ctx, heads, runner, b, k, start, args, device, gen)
                        records.append(r)
                        ms, g = r["ms"], r["gain_pct"]
                        print(f"  ctx {start:5d} batch {b:3d} k {k}: verify step {ms['verify_standard']:8.3f} → "
                              f"{ms['verify_fused']:8.3f} ms ({g['verify']:+5.1f}%), draft {ms['draft_standard']:7.3f}"
                              f" → {ms['draft_fused']:7.3f} ms ({g['draft']:+5.1f}%), full step "
                              f"{ms['step_standard']:8.3f} → {ms['step_fused']:8.3f} ms ({g['step']:+5.1f}%)"
                              + ("" if r["outputs_valid"] else "  OUTPUTS INVALID"))
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
        for h in heads.values():
            h.close()
        del target, drafter, heads
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if args.exactness == "only":
            break  # the smoke runs on the first model's LM head
    if records:
        print_table(records, args.acceptance)
    elapsed = time.time() - start_time
    print(f"\n{len(records)} configurations in {elapsed:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": info, "date": time.strftime("%Y-%m-%d"), "timing": (
                "CUDA graphs, median of CUDA-event times" if device.type == "cuda" else "eager, wall clock (CPU)"),
                "settings": {k: v for k, v in vars(args).items() if k != "json"},
                "sampler_kernels": "triton" if triton is not None and device.type == "cuda" else "torch",
                "attention": attention_used, "configs": records, "exactness": exact}, f, indent=1)
        print(f"wrote {args.json}")
    ctx.close()
    bad = [r for r in records if not r["outputs_valid"]]
    if bad:
        sys.exit(f"{len(bad)} configurations wrote invalid outputs")


if __name__ == "__main__":
    main()
