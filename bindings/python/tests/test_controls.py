"""Sampling controls and logprobs through the Python binding, on the CPU
backend: results against a float64 reference of the header's chain, and
every array checked against the batch before the library is called."""
import math

import numpy as np
import pytest

import flashspec
from flashspec import capi

V, D = 50, 16


@pytest.fixture
def ctx():
    with flashspec.Context("cpu", seed=99, cpu_threads=2, max_rows=64, max_requests=8) as c:
        yield c


@pytest.fixture
def weights():
    return np.random.default_rng(7).standard_normal((V, D)).astype(np.float32)


def logits_of(w, h):
    return np.asarray(h, np.float64) @ np.asarray(w, np.float64).T


def log_softmax(x):
    m = x.max()
    return x - m - math.log(np.exp(x - m).sum())


def controlled(l, T, allowed, bias=None, top_k=None, top_p=None, min_p=None):
    """The header's chain in float64: the distribution p over V tokens."""
    x = np.array(l, np.float64)
    if bias:
        for token, value in bias.items():
            x[token] += value
    x[~allowed] = -np.inf
    if T == 0:
        p = np.zeros(len(x))
        p[int(np.argmax(x))] = 1.0  # ties: the smallest id
        return p
    x = x / T
    order = np.lexsort((np.arange(len(x)), -x))  # by x descending, ties by id
    order = order[allowed[order]]
    if top_k is not None:
        order = order[:top_k]
    if top_p is not None:
        q = np.exp(x[order] - x[order[0]])
        cumulative = np.cumsum(q / q.sum())
        order = order[:int(np.searchsorted(cumulative, top_p)) + 1]
    if min_p is not None and min_p > 0:
        order = order[x[order] >= x[order[0]] + math.log(min_p)]
    p = np.zeros(len(x))
    e = np.exp(x[order] - x[order[0]])
    p[order] = e / e.sum()
    return p


def pack(allowed):
    """The mask's packed layout, written out bit by bit."""
    rows, vocab = allowed.shape
    words = np.zeros((rows, (vocab + 31) // 32), np.uint32)
    for r in range(rows):
        for i in range(vocab):
            if allowed[r, i]:
                words[r, i // 32] |= np.uint32(1 << (i % 32))
    return words


def random_allowed(rng, rows):
    allowed = rng.random((rows, V)) < 0.3
    allowed[:, 0] |= ~allowed.any(axis=1)  # every row allows a token
    return allowed


def top_by_raw_logit(l, n):
    return list(np.lexsort((np.arange(len(l)), -l))[:n])


# ---- results -------------------------------------------------------------

@pytest.mark.parametrize("packed", [False, True])
def test_temperature_zero_verify_is_greedy_over_the_controlled_set(ctx, weights, packed):
    rng = np.random.default_rng(3)
    R, n, top_n = 4, 3, 4
    hidden = rng.standard_normal((R * (n + 1), D)).astype(np.float32)
    allowed = random_allowed(rng, R * (n + 1))
    bias = [{int(t): float(rng.normal(0, 3)) for t in rng.integers(0, V, 6)} for _ in range(R)]
    logits = logits_of(weights, hidden)
    greedy = np.array([int(np.argmax(controlled(logits[row], 0, allowed[row], bias[row // (n + 1)])))
                       for row in range(R * (n + 1))])
    # Request r drafts the controlled argmax but a wrong token at position r.
    offsets, drafts = [0], []
    for r in range(R):
        for j in range(n):
            token = greedy[r * (n + 1) + j]
            drafts.append(int((token + 1) % V) if j == r else int(token))
        offsets.append(len(drafts))
    controls = flashspec.SamplingControls(token_mask=pack(allowed) if packed else allowed, logit_bias=bias,
                                          top_k=[5, 1, flashspec.TOP_K_ALL, 20], top_p=0.5, min_p=[0.2, 0, 0.9, 1])
    batch = flashspec.VerifyBatch(offsets, drafts, hidden, temperatures=np.zeros(R, np.float32),
                                  controls=controls, logprobs=True, top_logprobs=top_n)
    result = ctx.verify_and_finalize(head := ctx.lm_head(weights), batch)
    assert result.top_tokens.shape == result.top_logprobs.shape == (R * (n + 1), top_n)
    for r in range(R):
        accepted = min(r, n)
        assert result.accepted_counts[r] == accepted
        start = r * (n + 1)
        assert result.tokens(r) == list(greedy[start:start + accepted + 1])
        assert result.token_logprobs(r) == [0.0] * (accepted + 1)  # T = 0: a point mass
        for k in range(n + 1):
            slot = start + k
            if k > accepted:
                assert result.emitted_tokens[slot] == -1
                assert math.isnan(result.logprobs[slot]) and math.isnan(result.raw_logprobs[slot])
                assert (result.top_tokens[slot] == -1).all()
                assert np.isnan(result.top_logprobs[slot]).all()
                continue
            raw = log_softmax(logits[slot])
            assert np.isfinite(result.raw_logprobs[slot])
            assert result.raw_logprobs[slot] == pytest.approx(raw[greedy[slot]], abs=1e-4)
            # Top tokens by raw logit (no bias, mask or truncation), largest first.
            assert list(result.top_tokens[slot]) == top_by_raw_logit(logits[slot], top_n)
            np.testing.assert_allclose(result.top_logprobs[slot], raw[result.top_tokens[slot]], atol=1e-4)
            assert (np.diff(result.top_logprobs[slot]) <= 0).all()
        assert [t for t, _ in result.top(r)[0]] == list(result.top_tokens[start])

    # verify + finalize on separate summaries give the same result.
    summaries = ctx.summaries(32, 8)
    ctx.verify(head, batch, summaries)
    again = ctx.finalize(batch, summaries)
    np.testing.assert_array_equal(again.emitted_tokens, result.emitted_tokens)
    np.testing.assert_array_equal(again.top_tokens, result.top_tokens)


def test_logprobs_are_those_of_the_controlled_distribution(ctx, weights):
    rng = np.random.default_rng(4)
    R, n, T = 6, 2, 0.8
    hidden = (1.5 * rng.standard_normal((R * (n + 1), D))).astype(np.float32)
    allowed = random_allowed(rng, R * (n + 1))
    spec = dict(bias={3: 2.0, 9: -1.0, 21: 0.5}, top_k=8, top_p=0.9, min_p=0.05)
    logits = logits_of(weights, hidden)
    p = [controlled(logits[row], T, allowed[row], **spec) for row in range(R * (n + 1))]
    offsets = list(range(0, R * n + 1, n))
    drafts = [int(np.argmax(p[r * (n + 1) + j])) for r in range(R) for j in range(n)]
    controls = flashspec.SamplingControls(token_mask=allowed, logit_bias=spec["bias"], top_k=spec["top_k"],
                                          top_p=spec["top_p"], min_p=spec["min_p"])
    result = ctx.verify_and_finalize(ctx.lm_head(weights), flashspec.VerifyBatch(
        offsets, drafts, hidden, temperatures=[T] * R, controls=controls, logprobs=True))
    assert result.top_tokens is None and result.top_logprobs is None
    for r in range(R):
        for k, token in enumerate(result.tokens(r)):
            slot = r * (n + 1) + k
            assert p[slot][token] > 0, "a token outside the kept set"
            assert result.logprobs[slot] == pytest.approx(math.log(p[slot][token]), abs=1e-4)
            assert result.raw_logprobs[slot] == pytest.approx(log_softmax(logits[slot])[token], abs=1e-4)


def test_draft_with_controls(ctx, weights):
    rng = np.random.default_rng(5)
    rows = 40
    hidden = rng.standard_normal((rows, D)).astype(np.float32)
    allowed = random_allowed(rng, rows)
    bias = [{int(rng.integers(V)): 2.0} for _ in range(rows)]
    head = ctx.lm_head(weights)
    logits = logits_of(weights, hidden)

    tokens, scores = ctx.draft(head, hidden, controls=flashspec.SamplingControls(token_mask=allowed, logit_bias=bias))
    for r in range(rows):
        assert tokens[r] == np.argmax(controlled(logits[r], 0, allowed[r], bias[r]))

    T, top_k = 0.9, np.arange(rows, dtype=np.int32) % 5 + 1
    controls = flashspec.SamplingControls(token_mask=allowed, logit_bias=bias, top_k=top_k)
    tokens, scores = ctx.draft(head, hidden, temperature=T, controls=controls)
    for r in range(rows):
        q = controlled(logits[r], T, allowed[r], bias[r], top_k=int(top_k[r]))
        assert q[tokens[r]] > 0
        assert scores[r] == pytest.approx(math.log(q[tokens[r]]), abs=1e-4)


def test_stochastic_drafts_under_the_target_controls_are_all_accepted(ctx, weights):
    # q = p: drafts sampled from the controlled target distribution itself
    # (ctx.draft with the same controls) pass every acceptance test.
    rng = np.random.default_rng(6)
    R, n, T = 4, 3, 1.0
    rows = R * (n + 1)
    hidden = rng.standard_normal((rows, D)).astype(np.float32)
    allowed = random_allowed(rng, rows)
    bias = [{int(rng.integers(V)): 1.0} for _ in range(R)]
    head = ctx.lm_head(weights)
    draft_rows = [r * (n + 1) + j for r in range(R) for j in range(n)]
    per_row_bias = [bias[row // (n + 1)] for row in draft_rows]
    drafts, _ = ctx.draft(head, hidden[draft_rows], temperature=T, seeds=np.arange(len(draft_rows), dtype=np.uint64),
                          controls=flashspec.SamplingControls(token_mask=allowed[draft_rows], logit_bias=per_row_bias,
                                                              top_k=6))
    draft_logits = (hidden[draft_rows] @ weights.T).astype(np.float32)
    batch = flashspec.VerifyBatch(
        list(range(0, R * n + 1, n)), drafts, hidden, draft_logits=draft_logits, temperatures=[T] * R,
        draft_temperatures=[T] * R,
        controls=flashspec.SamplingControls(token_mask=allowed, logit_bias=bias, top_k=6),
        draft_controls=flashspec.SamplingControls(token_mask=allowed[draft_rows], logit_bias=bias, top_k=6))
    result = ctx.verify_and_finalize(head, batch)
    assert list(result.accepted_counts) == [n] * R


def test_typical_acceptance_with_a_zero_threshold_accepts_every_draft(ctx, weights):
    # delta = 0: the threshold min(epsilon, 0 * exp(-H)) is 0, and every
    # draft of positive probability is accepted, however unlikely.
    rng = np.random.default_rng(8)
    R, n = 5, 4
    hidden = (2 * rng.standard_normal((R * (n + 1), D))).astype(np.float32)
    drafts = rng.integers(0, V, R * n).astype(np.int32)
    offsets = list(range(0, R * n + 1, n))
    head = ctx.lm_head(weights)
    plain = ctx.verify_and_finalize(head, flashspec.VerifyBatch(offsets, drafts, hidden))
    assert sum(plain.accepted_counts) < R * n  # Algorithm 1 rejects some random drafts
    typical = flashspec.SamplingControls(typical_epsilon=0.5, typical_delta=0.0)
    result = ctx.verify_and_finalize(head, flashspec.VerifyBatch(offsets, drafts, hidden, controls=typical))
    assert list(result.accepted_counts) == [n] * R


def test_repetition_penalty_scales_the_logits_of_the_named_tokens(ctx, weights):
    # Each row's raw argmax, named with a bias of 0 and penalised: l / r for
    # l > 0, l * r otherwise. T = 0 gives the argmax of the penalised logits.
    rng = np.random.default_rng(10)
    rows = 12
    hidden = rng.standard_normal((rows, D)).astype(np.float32)
    logits = logits_of(weights, hidden)
    named = [[int(np.argmax(logits[r])), int(np.argmin(logits[r]))] for r in range(rows)]
    penalty = np.linspace(1.5, 40.0, rows).astype(np.float32)
    controls = flashspec.SamplingControls(logit_bias=[{t: 0.0 for t in tokens} for tokens in named],
                                          repetition_penalty=penalty)
    tokens, _ = ctx.draft(ctx.lm_head(weights), hidden, controls=controls)
    changed = 0
    for r in range(rows):
        penalised = logits[r].copy()
        for t in named[r]:
            penalised[t] = penalised[t] / penalty[r] if penalised[t] > 0 else penalised[t] * penalty[r]
        assert tokens[r] == np.argmax(penalised), f"row {r}"
        changed += tokens[r] != named[r][0]
    assert changed > rows // 2  # the penalty moved most argmaxes


def test_bias_as_csr_arrays_equals_bias_as_dicts(ctx, weights):
    rng = np.random.default_rng(9)
    hidden = rng.standard_normal((4, D)).astype(np.float32)
    head = ctx.lm_head(weights)
    as_dicts = flashspec.SamplingControls(logit_bias=[{5: 9.0}, None, {6: 9.0, 7: -1.0}, {}])
    # Entries naming one token add up.
    as_csr = flashspec.SamplingControls(bias_offsets=[0, 2, 2, 4, 4], bias_tokens=[5, 5, 6, 7],
                                        bias_values=[4.5, 4.5, 9.0, -1.0])
    a, _ = ctx.draft(head, hidden, controls=as_dicts)
    b, _ = ctx.draft(head, hidden, controls=as_csr)
    np.testing.assert_array_equal(a, b)
    assert a[0] == 5 and a[2] == 6


def test_library_errors_name_the_control(ctx, weights):
    head = ctx.lm_head(weights)
    hidden = np.zeros((3, D), np.float32)
    with pytest.raises(flashspec.InvalidArgumentError) as e:
        ctx.verify_and_finalize(head, flashspec.VerifyBatch([0, 2], [1, 2], hidden,
                                                            controls=flashspec.SamplingControls(top_p=0.0)))
    assert e.value.message.startswith("batch->controls->top_p")
    with pytest.raises(flashspec.OutOfRangeError) as e:
        ctx.verify_and_finalize(head, flashspec.VerifyBatch([0, 2], [1, 2], hidden, top_logprobs=21))
    assert e.value.message.startswith("batch->top_logprobs")
    with pytest.raises(flashspec.InvalidArgumentError) as e:
        ctx.draft(head, hidden, controls=flashspec.SamplingControls(typical_epsilon=0.1))
    assert e.value.message.startswith("params->controls->typical_epsilon")


# ---- lengths are checked before the library is called ---------------------

@pytest.fixture
def no_library_call(monkeypatch):
    called = []

    def refuse(name):
        def spy(*args):
            called.append(name)
            raise AssertionError(f"{name} was called with arrays the binding should have refused")
        return spy

    for name in ("flashspec_verify", "flashspec_finalize", "flashspec_verify_and_finalize", "flashspec_draft"):
        monkeypatch.setattr(capi, name, refuse(name))
    return called


def refused(ctx, called, fn, match, error=ValueError):
    with pytest.raises(error, match=match) as info:
        fn()
    assert not isinstance(info.value, flashspec.FlashSpecError), info.value
    assert not called and ctx.last_error == ""


def batch_with(controls=None, draft_controls=None, **kw):
    """Two requests of 2 and 1 drafts: offsets [0, 2, 3], 5 target rows."""
    hidden = np.random.default_rng(11).standard_normal((5, D)).astype(np.float32)
    return flashspec.VerifyBatch(np.array([0, 2, 3], np.int32), np.array([1, 2, 3], np.int32), hidden,
                                 controls=controls, draft_controls=draft_controls, **kw)


ALL = np.ones((5, V), bool)


@pytest.mark.parametrize("controls, match", [
    # Slices of longer arrays: without the check the library reads on.
    (dict(top_k=np.array([3, 3, 3], np.int32)[:1]), r"controls.top_k has 1 entries, fewer than the 2 requests"),
    (dict(top_p=[0.5]), "controls.top_p has 1 entries, fewer than the 2 requests"),
    (dict(min_p=np.zeros(0, np.float32)), "controls.min_p has 0 entries, fewer than the 2 requests"),
    (dict(typical_epsilon=[0.1]), "controls.typical_epsilon has 1 entries"),
    (dict(repetition_penalty=np.ones(3, np.float32)[:1], logit_bias={1: 0.0}),
     "controls.repetition_penalty has 1 entries, fewer than the 2 requests"),
    (dict(typical_epsilon=[0.1, 0.1], typical_delta=[0.3]), "controls.typical_delta has 1 entries"),
    (dict(logit_bias=[{1: 1.0}]), "controls.logit_bias has 1 entries, fewer than the 2 requests"),
    (dict(bias_offsets=np.array([0, 1, 2, 2], np.int32)[:2], bias_tokens=[1, 2], bias_values=[1.0, 1.0]),
     r"controls.bias_offsets has 2 entries, fewer than R \+ 1 = 3"),
    (dict(bias_offsets=[0, 1, 3], bias_tokens=np.array([1, 2, 3], np.int32)[:2], bias_values=[1.0, 1.0, 1.0]),
     r"controls.bias_tokens has 2 entries, fewer than bias_offsets\[R\] = 3"),
    (dict(bias_offsets=[0, 1, 3], bias_tokens=[1, 2, 3], bias_values=[1.0]),
     r"controls.bias_values has 1 entries, fewer than bias_offsets\[R\] = 3"),
    (dict(token_mask=ALL[:4]), r"controls.token_mask has 4 rows, expected draft_offsets\[R\] \+ R = 5"),
    (dict(token_mask=np.ones((6, 2), np.uint32)),
     r"controls.token_mask has 6 rows, expected draft_offsets\[R\] \+ R = 5"),
    # 0 words per row would mean ceil(V / 32) to the library.
    (dict(token_mask=np.ones((5, 0), np.uint32)), "controls.token_mask has no columns"),
    (dict(token_mask=np.ones((5, V - 1), bool)), f"controls.token_mask has {V - 1} columns, the vocabulary has {V}"),
])
def test_short_controls_are_refused_before_the_call(ctx, weights, no_library_call, controls, match):
    head = ctx.lm_head(weights)
    batch = batch_with(flashspec.SamplingControls(**controls))
    refused(ctx, no_library_call, lambda: ctx.verify_and_finalize(head, batch), match)
    refused(ctx, no_library_call, lambda: ctx.verify(head, batch, ctx.summaries(16, 4)), match)


def test_draft_controls_mask_has_one_row_per_draft(ctx, weights, no_library_call):
    head = ctx.lm_head(weights)
    logits = np.zeros((3, V), np.float32)
    batch = batch_with(draft_controls=flashspec.SamplingControls(token_mask=ALL), draft_logits=logits)
    refused(ctx, no_library_call, lambda: ctx.verify_and_finalize(head, batch),
            r"draft_controls.token_mask has 5 rows, expected draft_offsets\[R\] = 3")
    batch = batch_with(draft_controls=flashspec.SamplingControls(top_k=[2]), draft_logits=logits)
    refused(ctx, no_library_call, lambda: ctx.verify_and_finalize(head, batch),
            "draft_controls.top_k has 1 entries, fewer than the 2 requests")


def test_draft_controls_are_per_row(ctx, weights, no_library_call):
    head = ctx.lm_head(weights)
    h = np.zeros((3, D), np.float32)
    for controls, match in [(dict(top_k=[1, 1]), "controls.top_k has 2 entries, fewer than the 3 rows"),
                            (dict(logit_bias=[{}, {}]), "controls.logit_bias has 2 entries, fewer than the 3 rows"),
                            (dict(token_mask=np.ones((2, V), bool)),
                             "controls.token_mask has 2 rows, expected the 3 rows")]:
        controls = flashspec.SamplingControls(**controls)
        refused(ctx, no_library_call, lambda: ctx.draft(head, h, controls=controls), match)


@pytest.mark.parametrize("field, array, match", [
    ("logprobs", np.full(8, 7, np.float32)[:4], r"logprobs has 4 entries, fewer than draft_offsets\[R\] \+ R = 5"),
    ("raw_logprobs", np.full(8, 7, np.float32)[:4], r"raw_logprobs has 4 entries"),
    ("top_tokens", np.full((5, 3), 7, np.int32), "top_tokens has 3 columns, the batch asks for top_logprobs = 2"),
    ("top_tokens", np.full(20, 7, np.int32)[:9],
     r"top_tokens has 9 entries, fewer than \(draft_offsets\[R\] \+ R\) \* top_logprobs = 5 \* 2"),
    ("top_logprobs", np.full((4, 2), 7, np.float32), r"top_logprobs has 8 entries, fewer than"),
])
def test_short_logprob_outputs_are_refused_and_neighbours_untouched(ctx, weights, field, array, match):
    # The real library stays in place: without the check it would write past them.
    head = ctx.lm_head(weights)
    outputs = dict(logprobs=np.zeros(5, np.float32), raw_logprobs=np.zeros(5, np.float32),
                   top_tokens=np.zeros((5, 2), np.int32), top_logprobs=np.zeros((5, 2), np.float32))
    outputs[field] = array
    backing = array.base if array.base is not None else array
    before = backing.copy()
    out = flashspec.VerifyResult(np.zeros(2, np.int32), np.zeros(5, np.int32), **outputs)
    refused(ctx, [], lambda: ctx.verify_and_finalize(head, batch_with(logprobs=True, top_logprobs=2), out=out), match)
    np.testing.assert_array_equal(backing, before)


def test_logprob_outputs_of_the_right_size_are_written_in_place(ctx, weights):
    head = ctx.lm_head(weights)
    want = ctx.verify_and_finalize(head, batch_with(logprobs=True, top_logprobs=2))
    flat_tokens, flat_logprobs = np.zeros(10, np.int32), np.zeros(10, np.float32)
    out = flashspec.VerifyResult(np.zeros(2, np.int32), np.zeros(5, np.int32), logprobs=np.zeros(5, np.float32),
                                 raw_logprobs=np.zeros(5, np.float32), top_tokens=flat_tokens,
                                 top_logprobs=flat_logprobs, draft_offsets=[0, 2, 3])
    assert ctx.verify_and_finalize(head, batch_with(logprobs=True, top_logprobs=2), out=out) is out
    np.testing.assert_array_equal(flat_tokens.reshape(5, 2), want.top_tokens)
    np.testing.assert_array_equal(out.logprobs, want.logprobs)
    assert out.top(0) == want.top(0)


def test_controls_live_where_the_call_does(ctx, weights, no_library_call):
    """A CPU context copies nothing to a device: a device batch's host
    controls, and device controls of a host batch, are refused unread (a
    CUDA context copies host controls to the device: tests/test_gpu.py)."""
    class DeviceArray:
        def __init__(self, shape, typestr):
            self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "strides": None,
                                             "data": (0x7F0000000000, False), "version": 3}

    batch = flashspec.VerifyBatch(DeviceArray((3,), "<i4"), DeviceArray((3,), "<i4"), DeviceArray((5, D), "<f4"),
                                  controls=flashspec.SamplingControls(top_k=3))
    refused(ctx, no_library_call, lambda: ctx.verify(ctx.lm_head(weights), batch, ctx.summaries(16, 4)),
            "controls.top_k: the call's arrays are in device memory but the context is not a CUDA context")
    host_batch = batch_with(flashspec.SamplingControls(top_p=DeviceArray((2,), "<f4")))
    refused(ctx, no_library_call, lambda: ctx.verify_and_finalize(ctx.lm_head(weights), host_batch),
            r"controls.top_p: a device array for a call on host memory \(CPU backend\)")


def test_mask_packing_and_argument_forms():
    allowed = np.random.default_rng(12).random((3, 70)) < 0.5
    c = flashspec.SamplingControls(token_mask=allowed)
    np.testing.assert_array_equal(c.token_mask, pack(allowed))
    assert c.token_mask.dtype == np.uint32 and c.token_mask.shape == (3, 3) and c.mask_columns == 70
    with pytest.raises(TypeError, match="token_mask: expected a bool array"):
        flashspec.SamplingControls(token_mask=np.ones((2, 4), np.int64))
    with pytest.raises(ValueError, match="not both"):
        flashspec.SamplingControls(logit_bias={1: 1.0}, bias_offsets=[0, 1])
    with pytest.raises(TypeError, match="SamplingControls"):
        flashspec.VerifyBatch([0, 0], [], np.zeros((1, D), np.float32), controls={"top_k": 3})
