#!/usr/bin/env python3
"""Writes the seed corpus (corpus/<harness>/) and the hand-made regression
inputs (regressions/<harness>/) of the libFuzzer harnesses.

Each input is the byte sequence the harness reads front to back (Input in
fuzz_common.h: little-endian integers; a read past the end gives 0, and 0
always means the plain valid choice). The writers below follow the order in
which each harness reads; keep them in step with the harnesses.

  make_seeds.py            rewrite corpus/ and the regressions listed here
  make_seeds.py --check    exit 1 if a file differs from what would be written
"""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


class W:
    """An input under construction."""

    def __init__(self):
        self.b = bytearray()

    def u8(self, v):
        self.b += struct.pack('<B', v & 0xff)
        return self

    def u16(self, v):
        self.b += struct.pack('<H', v & 0xffff)
        return self

    def u32(self, v):
        self.b += struct.pack('<I', v & 0xffffffff)
        return self

    def u64(self, v):
        self.b += struct.pack('<Q', v & 0xffffffffffffffff)
        return self

    def f32(self, v):
        self.b += struct.pack('<f', v)
        return self

    def range(self, lo, hi, v):
        """Input::range(lo, hi) reading v."""
        span = hi - lo + 1
        raw = v - lo
        if span <= 0x100:
            return self.u8(raw)
        if span <= 0x10000:
            return self.u16(raw)
        if span <= 0x100000000:
            return self.u32(raw)
        return self.u64(raw)

    def spec(self, dtype=0, extra_stride=0, align=0, mode=0, scale=7, dup=0, seed=1):
        """read_matrix_spec: dtype, extra stride, alignment byte (≥ 224:
        misaligned), value mode (< 160: normal; 160 + k: mode k), scale
        (0.125 (1 + s % 32)), duplicate rows (≥ 192), seed."""
        return self.u8(dtype).u8(extra_stride).u8(align).u8(mode).u8(scale).u8(dup).u64(seed)

    def temperature(self, code):
        """read_temperature: 0 = the call's default; 1: 1.0, 2: 0.5, 3: 2.0,
        4: 0, 5: −0, 6: 1e-3, 7: 1e-38, 8: denorm_min, 9: −1, 10: NaN,
        11: +Inf, 12: −Inf, 13: FLT_MAX, 14: −denorm_min, ≥ 16: (code − 15) / 32."""
        return self.u8(code)

    def bytes(self):
        return bytes(self.b)


# ---------------------------------------------------------------------------
# fuzz_draft
# ---------------------------------------------------------------------------
def draft(ctx_seed=1, threads=(1, 2), max_rows=8, vocab=16, d=8, w=None, rows=2, h=None, params_mode=0,
          temperature=0, arrays=0, row_temps=None, positions=None, plants=None):
    x = W().u64(ctx_seed).range(0, 3, threads[0]).range(0, 3, threads[1]).range(8, 16, max_rows)
    x.range(1, 80, vocab).range(1, 16, d).spec(**(w or {}))
    x.range(1, 8, rows).spec(**(h or {'seed': 2}))
    x.u8(params_mode).temperature(temperature).u8(arrays)
    for r in range(rows):
        x.temperature((row_temps or [1] * rows)[r]).u64(100 + r).u64(7 * r).u64(3).range(0, 1023, (positions or [0] * rows)[r])
    if plants:
        x.u8(255)  # plants ≥ 192: 1 + pick(2) of them
        x.u8(len(plants) - 1)
        for p in plants:
            x.b += bytes(p)
    return x.bytes()


DRAFT_CORPUS = {
    'empty': b'',
    'greedy-f32': draft(),
    'greedy-large': draft(vocab=80, d=16, rows=8, max_rows=8),
    'sampled-bf16-head-fp16-rows': draft(w={'dtype': 1}, h={'dtype': 2, 'seed': 3}, temperature=1, arrays=0x1f,
                                         row_temps=[1, 2], positions=[0, 5]),
    'sampled-per-row': draft(rows=4, arrays=0x01, row_temps=[0, 1, 2, 16]),
    'ties-small-ints': draft(w={'mode': 161, 'dup': 255}, h={'mode': 161, 'seed': 5}, rows=3),
    'zeros': draft(w={'mode': 162}, h={'mode': 162}, temperature=1, arrays=0),
    'strided-misaligned-f32': draft(w={'extra_stride': 2, 'align': 224}, h={'extra_stride': 1, 'align': 225}),
    'params-null': draft(params_mode=240),
    'no-scores': draft(arrays=0x20, temperature=3),
    'huge-logits': draft(w={'mode': 164}, h={'mode': 164}, temperature=7),
    'hidden-nan': draft(plants=[[17, 0, 0, 0]]),
    # fp32 rows at an address 1 mod 4: UNSUPPORTED; bf16 rows at 2 mod 4:
    # aligned, drafted.
    'misaligned-f32-hidden': draft(h={'align': 225}),
    'bf16-hidden-offset-2': draft(h={'dtype': 1, 'align': 226}),
}
DRAFT_REGRESSIONS = {
    # Was: bf16 / fp16 data at an odd address read through misaligned
    # uint16_t loads (UBSan). Now: UNSUPPORTED.
    'misaligned-bf16-hidden': draft(h={'dtype': 1, 'align': 224, 'seed': 9}),
    'misaligned-fp16-head': draft(w={'dtype': 2, 'align': 225}),
}


# ---------------------------------------------------------------------------
# fuzz_verify
# ---------------------------------------------------------------------------
def verify(ctx_seed=1, threads=(1, 2), vocab=16, d=6, w=None, h=None, drafts=(2, 0, 3), token_mode=0,
           stochastic=0, q=None, arrays=0, temps=None, dtemps=None, uniforms=None, mdl=0, out_mode=0, extra_rows=0,
           extra_requests=0, mismatch=0, follow_up=0, plants=None):
    x = W().u64(ctx_seed).range(0, 3, threads[0]).range(0, 3, threads[1]).range(1, 64, vocab).range(1, 12, d)
    x.spec(**(w or {})).spec(**(h or {'seed': 2}))
    x.range(1, 6, len(drafts))
    for n in drafts:
        x.u8(n)
    x.u8(token_mode).u64(77).u8(stochastic).spec(**(q or {'seed': 4}))
    x.u8(arrays)
    for r in range(len(drafts)):
        x.temperature((temps or [0] * len(drafts))[r]).temperature((dtemps or [0] * len(drafts))[r])
        x.u64(1000 + r).u64(r * 11).u8(0).u64(5 + r)
    for k in range(sum(drafts)):
        x.u8((uniforms or [0] * sum(drafts))[k])
    x.u8(mdl).u8(out_mode).u8(extra_rows).u8(extra_requests).u8(mismatch).u8(follow_up)
    if plants:
        x.u8(255).u8(len(plants) - 1)
        for p in plants:
            x.b += bytes(p)
    else:
        x.u8(0)
    return x.bytes()


VERIFY_CORPUS = {
    'empty': b'',
    'greedy-accepted': verify(),
    'greedy-random-drafts': verify(token_mode=200),
    'sampled-point-mass': verify(arrays=0x01, temps=[1, 2, 16], follow_up=0x0f, mismatch=2),
    'stochastic-q-is-p': verify(stochastic=1, arrays=0x03, temps=[1, 1, 2], dtemps=[1, 1, 2], follow_up=0x05),
    'stochastic-random-q-bf16': verify(stochastic=129, q={'dtype': 1, 'seed': 8}, arrays=0x3f, temps=[1, 0, 2],
                                       uniforms=[16, 128, 250, 40, 7]),
    'all-arrays-fp16': verify(w={'dtype': 2}, h={'dtype': 2, 'seed': 3}, arrays=0x3f, temps=[1, 1, 1],
                              uniforms=[100] * 5, mdl=130, out_mode=0),
    'next-steps-alias': verify(arrays=0x10, out_mode=2, temps=[0, 0, 0]),
    'ties': verify(w={'mode': 161, 'dup': 255}, h={'mode': 161, 'seed': 3}, drafts=(1, 1)),
    'mismatch-offsets': verify(drafts=(2, 1, 1, 0), mismatch=1, follow_up=1),
    'mismatch-token': verify(mismatch=0, follow_up=3),
    'six-requests': verify(drafts=(6, 0, 1, 5, 2, 3), arrays=0x01, temps=[0, 1, 16, 0, 2, 1], extra_rows=3),
    'shared-head': verify(out_mode=8, drafts=(3, 3)),
    'token-out-of-range': verify(plants=[[20, 0, 1]]),
    # Aliasing layouts (out_mode 6, layout out_mode >> 4; fuzz_verify.cc's
    # Layout): refused overlaps, and arrays touching end to end (allowed).
    'alias-accepted-on-offsets': verify(drafts=(2, 1, 3), out_mode=0x06),
    'alias-next-shifted': verify(drafts=(2, 1, 3), arrays=0x10, out_mode=0x16),
    'alias-next-shifted-one-request': verify(drafts=(3,), out_mode=0x16),
    'alias-accepted-on-emitted': verify(drafts=(2, 1, 3), out_mode=0x26),
    'alias-emitted-on-hidden': verify(drafts=(2, 1, 3), h={'dtype': 1, 'seed': 2}, out_mode=0x36),
    'alias-next-on-seeds': verify(drafts=(1, 2), arrays=0x04, out_mode=0x46),
    'alias-accepted-on-temps': verify(drafts=(1, 2), arrays=0x01, temps=[1, 0], out_mode=0x56),
    'alias-end-to-end': verify(drafts=(2, 0, 3), out_mode=0x66, follow_up=0x05),
}
VERIFY_REGRESSIONS = {
    # Was: draft_logits [0, V] for a batch without drafts refused
    # (OUT_OF_RANGE, "rows must be >= 1"). Now: verified as greedy.
    'draft-logits-0xV-refused': verify(drafts=(0, 0), stochastic=1),
    # Was: a stochastic draft whose draft_logits / T_d overflows fp32
    # (T_d = denorm_min) rejected silently with OK. Now: NON_FINITE.
    'stochastic-overflow-accepted': verify(drafts=(2,), stochastic=1, arrays=0x03, temps=[1], dtemps=[8]),
    # Was: result.emitted_tokens over batch.draft_tokens accepted, with wrong
    # tokens (request 1's drafts overwritten by request 0's output). Now:
    # INVALID_ARGUMENT naming result->emitted_tokens, nothing written.
    'emitted-aliases-draft-tokens': verify(drafts=(2, 3), arrays=0x01, temps=[4, 4], out_mode=4),
}


# ---------------------------------------------------------------------------
# fuzz_engine
# ---------------------------------------------------------------------------
def drafter(kind=0, min_n=1, max_n_extra=2, mode=0, td=0, logits_dtype=0, own_head=0, all_rows=0, cost=0):
    """kind 0 n-gram, 1 TOKENS, 2 LOGITS, 3 HIDDEN, 4 TREE; mode % 4
    (callbacks): 0 greedy oracle, 1 random (HIDDEN: negated rows), 2 oracle
    with a wrong last token, 3 none; mode & 4 (LOGITS): the target's logits;
    mode // 4 % 3 (TREE): the shape, 0 a chain, 1 random parents, 2 a wrong
    sibling before each oracle token."""
    return [kind, min_n - 1, max_n_extra, mode, td, logits_dtype, own_head, all_rows, cost]


def generation(prompt_len=4, pm=128, temperature=0, seed=3, request_id=0, max_tokens=12, stops=(), flags=0, reset=0,
               plant=None, faults=()):
    x = W().range(1, 10, prompt_len).u64(42).u8(pm).temperature(temperature).u64(seed).u64(request_id)
    x.range(1, 24, max_tokens).u8(len(stops))
    for s in stops:
        x.u8(s)
    x.u8(flags).u8(reset)
    if plant is None:
        x.u8(0)
    else:
        x.u8(255).u8(plant - 1)
    x.u8(len(faults))
    for where, index, kind in faults:  # where: 0 forward, 1 rollback, 2 draft, 3 token
        x.u8(where).u8(index).u8(kind)
    return x.bytes()


def engine(ctx_seed=1, threads=1, max_rows=8, vocab=24, d=6, w=None, hidden_dtype=0, drafters=(), explicit_arms=0,
           arms=((0, 3),), default_draft_len=4, policy=0, oracle=(16, 32, 8, 4), max_context=0, rollback=0,
           create_plant=None, generations=None):
    x = W().u64(ctx_seed).range(0, 2, threads).range(2, 12, max_rows).range(2, 40, vocab).range(1, 8, d)
    x.spec(**(w or {})).u64(9).u8(hidden_dtype).u8(len(drafters))
    for dr in drafters:
        for v in dr:
            x.u8(v)
    x.u8(explicit_arms).u8(len(arms) - 1)
    for drafter_index, length in arms:
        if drafters:
            x.u8(drafter_index)
        x.u8(length)
    x.u8(default_draft_len).u8(policy).u64(5)
    for o in oracle:
        x.u8(o)
    # rollback: bit 0 set: no rollback callback; bit 1 set: a keep callback.
    x.u8(0 if max_context == 0 else 160 + (max_context - 160 % 40) % 40).u8(rollback)
    if create_plant is None:
        x.u8(0)
    else:
        x.u8(255).u8(create_plant - 1)
    gens = generations or [generation()]
    x.u8(len(gens) - 1)
    for g in gens:
        x.b += g
    return x.bytes()


ENGINE_CORPUS = {
    'empty': b'',
    'no-drafter-greedy': engine(),
    'ngram-greedy-cycle': engine(drafters=[drafter(0)], generations=[generation(prompt_len=9, pm=200, max_tokens=24)]),
    'ngram-sampled': engine(drafters=[drafter(0, min_n=2, max_n_extra=2)],
                            generations=[generation(pm=200, temperature=1, max_tokens=20)]),
    'tokens-oracle-sampled': engine(drafters=[drafter(1, mode=0)], generations=[generation(temperature=1)]),
    'tokens-wrong-last': engine(drafters=[drafter(1, mode=2)], generations=[generation(max_tokens=16)]),
    'logits-target-like': engine(drafters=[drafter(2, mode=4, td=0)],
                                 generations=[generation(temperature=1, max_tokens=16)]),
    'logits-bf16-greedy': engine(drafters=[drafter(2, mode=5, td=32, logits_dtype=1)],
                                 generations=[generation(max_tokens=10)]),
    'hidden-all-rows': engine(drafters=[drafter(3, mode=0, all_rows=1)], generations=[generation(max_tokens=12)]),
    'hidden-own-head-one-row': engine(drafters=[drafter(3, mode=1, own_head=1)],
                                      generations=[generation(temperature=2, max_tokens=8)]),
    'three-drafters-arms-thompson': engine(
        drafters=[drafter(0), drafter(1, mode=0), drafter(3, mode=3)], explicit_arms=1,
        arms=((0, 4), (1, 2), (2, 3), (0, 0)), policy=1,
        generations=[generation(max_tokens=20, stops=(3,)), generation(temperature=1, seed=9, max_tokens=20, reset=255)]),
    'fixed-and-oracle': engine(drafters=[drafter(0), drafter(1)], explicit_arms=1, arms=((0, 2), (1, 5)), policy=2,
                               generations=[generation(), generation(temperature=1)]),
    'oracle-policy': engine(drafters=[drafter(1)], explicit_arms=1, arms=((0, 1), (0, 3)), policy=3),
    'max-context': engine(drafters=[drafter(0)], max_context=20,
                          generations=[generation(prompt_len=10, max_tokens=24)]),
    'no-rollback': engine(drafters=[drafter(1, mode=2)], rollback=1),
    'bf16-rows-fp16': engine(hidden_dtype=1, drafters=[drafter(0)], generations=[generation(pm=200)]),
    'streaming-only': engine(drafters=[drafter(0)], generations=[generation(flags=0xE0)]),
    'no-token-callback': engine(drafters=[drafter(0)], generations=[generation(flags=0x07)]),
    'faults-callbacks': engine(drafters=[drafter(1)], generations=[
        generation(faults=[(0, 2, 0)]), generation(faults=[(2, 0, 1)]), generation(faults=[(3, 1, 1)])]),
    'faults-views': engine(drafters=[drafter(2, mode=4)], generations=[
        generation(faults=[(0, 1, 2)]), generation(faults=[(2, 0, 5)]), generation(faults=[(0, 0, 5)])]),
    'token-callback-actions': engine(drafters=[drafter(0)], generations=[
        generation(max_tokens=20, faults=[(3, 2, 2)]), generation(faults=[(3, 0, 3), (3, 1, 4), (3, 2, 5)]),
        generation(faults=[(3, 3, 0)])]),
    'rollback-fails': engine(drafters=[drafter(1, mode=2)], generations=[generation(faults=[(1, 0, 0)])]),
    'create-refused': engine(drafters=[drafter(0)], create_plant=9),
    'generate-refused': engine(generations=[generation(plant=3), generation(plant=12), generation()]),
    # Misaligned views from callbacks: CALLBACK (HIDDEN drafter rows; LOGITS
    # drafter logits, then fp32 target rows).
    'faults-misaligned-hidden-drafter': engine(drafters=[drafter(3, mode=0)],
                                               generations=[generation(faults=[(2, 0, 10)]), generation()]),
    'faults-misaligned-logits-target': engine(drafters=[drafter(2, mode=4)], generations=[
        generation(faults=[(2, 1, 11)]), generation(faults=[(0, 1, 12)])]),
    # Tree steps: right children after wrong siblings with a keep callback,
    # random trees with a rollback only or neither, sampled, bad parents and
    # a failing keep.
    'tree-siblings-keep': engine(max_rows=12, drafters=[drafter(4, mode=8)], arms=((0, 6),), rollback=2,
                                 generations=[generation(max_tokens=20), generation(temperature=1, max_tokens=16)]),
    'tree-random-rollback': engine(max_rows=12, drafters=[drafter(4, mode=4)], arms=((0, 5),),
                                   generations=[generation(max_tokens=20)]),
    'tree-random-neither': engine(drafters=[drafter(4, mode=6)], arms=((0, 4),), rollback=1,
                                  generations=[generation(temperature=1, max_tokens=16)]),
    'tree-and-chain-arms': engine(drafters=[drafter(4, mode=8), drafter(1, mode=0)], explicit_arms=1,
                                  arms=((0, 5), (1, 3), (0, 0)), rollback=3, generations=[generation(max_tokens=24)]),
    'tree-faults': engine(drafters=[drafter(4, mode=8)], arms=((0, 4),), rollback=2, generations=[
        generation(faults=[(2, 1, 5)]), generation(faults=[(2, 0, 6)]), generation(faults=[(1, 0, 1)])]),
}
ENGINE_REGRESSIONS = {
    # Was: an out-of-range bandit policy (−1) read through the enum (UBSan:
    # invalid value in engine_api.cc). Now: INVALID_ARGUMENT.
    'policy-minus-1': engine(create_plant=17),
    # Was: the dtype (−1) of a view a callback returns read through the enum
    # (UBSan: invalid value in dtype_size). Now: CALLBACK.
    'target-view-dtype-minus-1': engine(generations=[generation(faults=[(0, 0, 8)])]),
    # Was (found by this harness, same class): the memory (−1) of a view a
    # callback returns read through the enum (UBSan). Now: CALLBACK.
    'target-view-memory-minus-1': engine(generations=[generation(faults=[(0, 0, 7)])]),
    # Was: LOGITS drafts whose draft logits / T_d overflow fp32 rejected
    # silently, generate returning OK. Now: NON_FINITE.
    'logits-overflow-accepted': engine(drafters=[drafter(2, mode=0, td=20)],
                                       generations=[generation(temperature=1, faults=[(2, 0, 9)])]),
    # Was: misaligned bf16 target rows read through misaligned loads (UBSan).
    # Now: the engine refuses the view with CALLBACK.
    'misaligned-bf16-target-rows': engine(hidden_dtype=1, generations=[generation(faults=[(0, 0, 12)])]),
}


# ---------------------------------------------------------------------------
# fuzz_api: a program of operations (kind % 8): 0 context create, 1 thread
# start failure, 2 LM head, 3 summaries, 4 status strings, 5 randomness,
# 6 NULL handling, 7 drafter create. Ops 2, 3 and 7 first make the pool
# context (u64 seed, u8 threads) if there is none.
# ---------------------------------------------------------------------------
def op_context(mode=0, backend=5, ordinal=0, stream=0, seed=1, threads=1, rows=15, requests=3, size=0):
    """size ≥ 240: struct_size = 4 · the next byte (here 3: 12)."""
    x = W().u8(0).u8(mode).u8(backend).u8(ordinal).u8(stream).u64(seed).u8(threads).u8(rows).u8(requests).u8(size)
    if size >= 240:
        x.u8(3)
    return x.bytes()


def op_pool(kind):
    return W().u8(kind).u64(3).u8(1).bytes()


def op_head(first, rows=7, cols=3, spec=None, plants=()):
    x = W()
    x.b += op_pool(2) if first else W().u8(2).bytes()
    x.u8(rows - 1).u8(cols - 1).spec(**(spec or {}))
    if plants:  # each refuses the head: nothing more is read
        x.u8(255).u8(len(plants) - 1)
        for p in plants:
            x.b += bytes(p)
        return x.bytes()
    return x.u8(0).u64(11).bytes()  # no plants; the seed of the hidden row


def op_summaries(first, rows=8, requests=2, mode=0):
    x = W()
    x.b += op_pool(3) if first else W().u8(3).bytes()
    return x.u8(rows - 1).u8(requests - 1).u8(mode).bytes()


def op_status(k):
    return W().u8(4).u8(k).bytes()


def op_rng(seed=1, rid=2, step=3, position=4, token=5, purpose=1):
    return (W().u8(5).u64(seed).u64(rid).u64(step).u8(0).range(0, 1023, position).range(0, (1 << 20) - 1, token)
            .u8(purpose - 1).bytes())


def op_drafter(first, mode=0, nulls=0, body=()):
    x = W()
    x.b += op_pool(7) if first else W().u8(7).bytes()
    x.u8(mode).u8(nulls)
    for v in body:
        x.u8(v)
    return x.bytes()


API_CORPUS = {
    'empty': b'',
    'context-default': op_context(),
    'context-params-null': op_context(mode=240),
    'context-auto-threads': op_context(backend=0, threads=0, rows=63, requests=63),
    'context-bad-values': op_context(threads=252) + op_context(rows=250) + op_context(backend=2) + op_context(size=240),
    'heads': op_head(True) + op_head(False, rows=48, cols=16, spec={'dtype': 1}) + op_head(False, spec={'dtype': 2, 'extra_stride': 2}),
    'head-refused': op_head(True, plants=[[13]]) + op_head(False, plants=[[8]]) + op_head(False, plants=[[15, 0, 0, 0]]),
    'summaries': op_summaries(True) + op_summaries(False, rows=1, requests=1) + op_summaries(False, rows=4, requests=252),
    'status-and-rng': op_status(2) + op_status(17) + op_rng() + op_rng(position=1023, token=(1 << 20) - 1, purpose=4),
    'nulls': W().u8(6).bytes(),
    'drafters': op_drafter(True, 0, 0, [3, 2, 0, 0, 0]) + op_drafter(False, 200, 0, [1, 0, 1, 0, 0, 0, 0])
    + op_drafter(False, 200, 0, [2, 0, 0, 0, 0, 0, 0]) + op_drafter(False, 200, 0, [1, 0, 9, 0, 0, 0, 0]),
    # 6 worker threads, the first or the last failing to start.
    'thread-start-failures': W().u8(1).u8(5).u8(0).u8(1).u8(5).u8(4).bytes(),
    # Purposes 0 and 5: NaN.
    'rng-purposes-outside': W().u8(5).u64(1).u64(2).u64(3).u8(0).u16(4).u32(5).u8(241).u8(5).u64(1).u64(2)
    .u64(3).u8(0).u16(4).u32(5).u8(246).bytes(),
}
API_REGRESSIONS = {
    # Was: context create when a CPU pool thread cannot start. All fail:
    # FLASHSPEC_ERR_INTERNAL (undocumented for create); some fail: the call
    # hung in ~ThreadPool. Now: OUT_OF_MEMORY naming params->cpu_threads,
    # no thread left running.
    'thread-start-all-fail': W().u8(1).u8(0).u8(0).bytes(),
    'thread-start-some-fail-hang': W().u8(1).u8(3).u8(1).bytes(),
    # Was: an out-of-range status (−1) read through the enum (UBSan). Now:
    # "unknown status".
    'status-string-minus-1': op_status(1),
    # Was: an out-of-range randomness purpose (−1) read through the enum
    # (UBSan). Now: NaN.
    'rng-purpose-minus-1': W().u8(5).u64(1).u64(2).u64(3).u8(0).u16(4).u32(5).u8(240).bytes(),
    # Was: an out-of-range callback drafter kind (−1) read through the enum
    # (UBSan). Now: INVALID_ARGUMENT.
    'drafter-kind-minus-1': op_drafter(True, 200, 0, [244, 0, 0, 0, 0, 0, 0]),
}


# ---------------------------------------------------------------------------
# fuzz_plugin: a program (kind % 16, slot % 3, then the op's bytes).
# ---------------------------------------------------------------------------
def p_ctx(slot, threads=1, rows=12):
    return W().u8(0).u8(slot).u8(threads).u64(slot + 1).u8(rows - 4).u8(0).bytes()


def p_head(slot, ctx, vocab=12, d=4, dtype=0):
    return W().u8(2).u8(slot).u8(ctx).spec(dtype=dtype).u8(vocab - 1).u8(d - 1).bytes()


def p_data(kind, head, ctx, rows=3, extra=(0,)):
    x = W().u8(kind).u8(head).u8(ctx).u8(rows - 1).spec(seed=head + 5)
    for v in extra:
        x.u8(v)
    return x.bytes()


PLUGIN_CORPUS = {
    'empty': b'',
    'table-only': W().u8(0).bytes(),
    'other-abi': W().u8(255).u32(1).bytes(),
    'draft-and-verify': p_ctx(0) + p_head(0, 0) + W().u8(4).u8(1).u8(0).u8(7).bytes()
    + p_data(6, 0, 0, extra=(1,)) + p_data(7, 0, 0, extra=(1, 2, 1)),
    'shared-head': p_ctx(0) + p_ctx(1, threads=2) + p_head(0, 0) + p_data(6, 0, 1) + p_data(7, 0, 1, extra=(0, 0, 0)),
    'engine': p_ctx(0) + p_head(0, 0) + W().u8(8).u8(0).u8(0).u8(1).u8(2).bytes()
    + W().u8(8).u8(1).u8(0).u8(0).bytes() + W().u8(10).u8(0).u8(0).u8(1).u8(1).u64(3).bytes()
    + W().u8(12).u8(0).u8(1).u8(2).u8(5).u8(0).bytes() + W().u8(13).u8(0).u8(3).u8(4).u8(7).u8(1).bytes()
    + W().u8(14).u8(0).u8(1).u8(1).bytes() + W().u8(11).u8(0).bytes() + W().u8(9).u8(0).bytes(),
    'teardown-order': p_ctx(0) + p_ctx(1) + p_head(1, 0) + W().u8(1).u8(0).bytes() + W().u8(3).u8(1).bytes()
    + W().u8(1).u8(0).bytes() + W().u8(1).u8(1).bytes(),
    'strings': W().u8(0).u8(15).u8(0).u8(2).u8(15).u8(0).u8(12).bytes(),
}
PLUGIN_REGRESSIONS = {}


# ---------------------------------------------------------------------------
# fuzz_sampling
# ---------------------------------------------------------------------------
def sampling(seed=5, vocab=20, d=4, drafts=((-1, 0, 0), (-1,)), tree=False, temps=(2, 1), controls=None,
             logprobs=0, top_n=0, shards=()):
    """Batch: seed, V, d, R, tree byte, per request its drafts (parents; the
    tokens are 1, 2, ...) and temperature pick (0: 0, 1: 0.5, 2: 1, 3: 2);
    controls: None, or per request (top-k pick, top-p pick, min-p pick,
    repetition pick, bias entries) then the mask byte (≥ 128: no mask) and
    mask_words bytes; logprobs and top_logprobs; the shard cuts."""
    w = W().u64(seed).range(1, 48, vocab).range(1, 6, d).range(1, 4, len(drafts)).u8(0 if tree else 200)
    for r, parents in enumerate(drafts):
        w.range(0, 5, len(parents))
        for k, parent in enumerate(parents):
            w.range(0, vocab - 1, (k + 1) % vocab).u8(255).range(-1, k - 1, parent if k else -1)
            if tree:
                w.u8(255)
        w.u8(temps[r % len(temps)])
    if controls is None:
        w.u8(255)
    else:
        w.u8(0)
        for r in range(len(drafts)):
            top_k, top_p, min_p, repetition, bias = controls[r % len(controls)]
            w.u8(top_k).u8(top_p).u8(min_p).u8(repetition).range(0, 3, len(bias))
            for token, value in bias:
                w.range(0, vocab - 1, token).u8(255).range(-40, 40, value).u8(255)
            w.u8(255)  # no typical acceptance
        w.u8(200)  # no mask
        w.u8(255).u8(255)  # mask_words 0
    w.u8(0 if logprobs else 200).u8(255).range(0, 4, top_n).u8(255)
    for cut in shards:
        w.u8(cut)
    return w.bytes()


SAMPLING_CORPUS = {
    'plain': b'',
    'chains': sampling(),
    'tree': sampling(drafts=((-1, 0, 0, 1), (-1, -1)), tree=True),
    'controls-logprobs': sampling(controls=((2, 1, 1, 1, ((3, -8), (5, 4))), (1, 2, 0, 0, ())), logprobs=1, top_n=3),
    'greedy-shards': sampling(temps=(0,), shards=(2, 4, 9)),
}
SAMPLING_REGRESSIONS = {}


HARNESSES = {
    'draft': (DRAFT_CORPUS, DRAFT_REGRESSIONS),
    'verify': (VERIFY_CORPUS, VERIFY_REGRESSIONS),
    'engine': (ENGINE_CORPUS, ENGINE_REGRESSIONS),
    'api': (API_CORPUS, API_REGRESSIONS),
    'plugin': (PLUGIN_CORPUS, PLUGIN_REGRESSIONS),
    'sampling': (SAMPLING_CORPUS, SAMPLING_REGRESSIONS),
}


def main():
    check = '--check' in sys.argv[1:]
    stale = []
    for harness, (corpus, regressions) in HARNESSES.items():
        for folder, inputs, prefix in (('corpus', corpus, 'seed-'), ('regressions', regressions, 'known-')):
            directory = os.path.join(HERE, folder, harness)
            os.makedirs(directory, exist_ok=True)
            for name, data in inputs.items():
                path = os.path.join(directory, prefix + name)
                old = open(path, 'rb').read() if os.path.exists(path) else None
                if old != data:
                    stale.append(os.path.relpath(path, HERE))
                    if not check:
                        with open(path, 'wb') as f:
                            f.write(data)
    if check and stale:
        print('out of date: ' + ', '.join(stale))
        return 1
    print(('would write ' if check else 'wrote ') + str(len(stale)) + ' files')
    return 0


if __name__ == '__main__':
    sys.exit(main())
