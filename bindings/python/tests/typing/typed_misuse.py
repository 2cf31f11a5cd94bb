"""Misuses of the flashspec API that the stubs must make mypy reject: each
line marked "expect-error" must get an error from mypy --strict, and no
other line may. (Never run: only type-checked.)"""
from __future__ import annotations

import numpy as np

import flashspec

w = np.zeros((4, 2), np.float32)
ctx = flashspec.Context("gpu")  # expect-error: not a backend name
ctx = flashspec.Context("cpu", 1)  # expect-error: seed is keyword-only
head = ctx.lm_head(w, borow=True)  # expect-error: misspelt keyword
head = ctx.lm_head(w)
tokens, scores, extra = ctx.draft(head, w)  # expect-error: draft returns two arrays
size: str = head.vocab_size  # expect-error: an int
batch = flashspec.VerifyBatch([0, 1], [1])  # expect-error: target_hidden is missing
result = ctx.verify_and_finalize(head, flashspec.VerifyBatch([0, 1], [1], w[:2]))
first: int = result.tokens(0)  # expect-error: a list of tokens
controls = flashspec.SamplingControls(40)  # expect-error: the controls are keyword-only
controls = flashspec.SamplingControls(top_k="40")  # expect-error: top-k is an int or ints
controls = flashspec.SamplingControls(logit_bias={"the": -1.0})  # expect-error: bias keys are token ids
batch = flashspec.VerifyBatch([0, 1], [1], w[:2], controls={"top_k": 40})  # expect-error: not a SamplingControls
tokens, scores = ctx.draft(head, w, draft_controls=flashspec.SamplingControls())  # expect-error: verify only
logprob: float = result.token_logprobs(0)  # expect-error: a list, one per emitted token
shard = ctx.lm_head_shard(w, vocab_begin=0)  # expect-error: the global vocabulary size is missing
ctx.verify_shard(head, batch)  # expect-error: the records are missing
count: int = ctx.finalize_shards(batch, w)  # expect-error: a VerifyResult
engine = flashspec.Engine(ctx, head, lambda tokens, num_past: w)  # expect-error: forward takes three arguments
engine = flashspec.Engine(ctx, head, lambda tokens, past, rows: w, policy="greedy")  # expect-error: no such policy
generation = engine.generate([1], temperture=0.0)  # expect-error: misspelt keyword
text: str = generation.steps  # expect-error: an int
rate: int = engine.metrics().acceptance_rate  # expect-error: a float
reason: flashspec.FinishReason = flashspec.FinishReason.DONE  # expect-error: no such member
drafter = flashspec.CallbackDrafter(ctx, lambda seq, k: ([1], None), logits=True)  # expect-error: logits rows missing
status: str = flashspec.FlashSpecError(4).status  # expect-error: an int
version: int = flashspec.version()  # expect-error: a string
flashspec.no_such_function()  # expect-error: not in the package
