"""CPU tests of the Python binding: results against numpy references,
errors, handles, RNG helpers and the plugin table."""
import ctypes
import gc
import math

import numpy as np
import pytest

import flashspec
from flashspec import capi

V, D = 50, 16


@pytest.fixture
def ctx():
    with flashspec.Context("cpu", seed=1234, cpu_threads=2, max_rows=64, max_requests=8) as c:
        yield c


@pytest.fixture
def weights():
    rng = np.random.default_rng(7)
    return rng.standard_normal((V, D)).astype(np.float32)


def logits_of(w, h):
    return np.asarray(h, np.float64) @ np.asarray(w, np.float64).T


def test_version_and_status():
    assert flashspec.version() == "%d.%d.%d" % (capi.FLASHSPEC_VERSION_MAJOR, capi.FLASHSPEC_VERSION_MINOR,
                                                capi.FLASHSPEC_VERSION_PATCH)
    assert flashspec.version_number() == capi.FLASHSPEC_VERSION_NUMBER
    assert flashspec.abi_version() == flashspec.ABI_VERSION
    assert flashspec.status_name(capi.FLASHSPEC_ERR_OUT_OF_RANGE) == "FLASHSPEC_ERR_OUT_OF_RANGE"
    assert flashspec.status_string(capi.FLASHSPEC_OK) == "success"
    assert flashspec.status_name(999) == "FLASHSPEC_UNKNOWN_STATUS"


def test_every_status_has_its_exception_class():
    names = [n for n in dir(capi) if n.startswith("FLASHSPEC_ERR_")]
    assert len(names) >= 15
    for n in names:
        cls = flashspec.error_class(getattr(capi, n))
        assert issubclass(cls, flashspec.FlashSpecError) and cls is not flashspec.FlashSpecError
    assert issubclass(flashspec.OutOfRangeError, ValueError)
    assert flashspec.error_class(999) is flashspec.FlashSpecError


def test_greedy_draft_matches_numpy(ctx, weights):
    h = np.random.default_rng(1).standard_normal((5, D)).astype(np.float32)
    head = ctx.lm_head(weights)
    assert (head.vocab_size, head.hidden_size) == (V, D)
    tokens, scores = ctx.draft(head, h)
    ref = logits_of(weights, h)
    np.testing.assert_array_equal(tokens, ref.argmax(axis=1))
    np.testing.assert_allclose(scores, ref.max(axis=1), rtol=1e-5, atol=1e-5)


def test_draft_reads_strided_and_half_inputs_without_copy(ctx, weights):
    big = np.zeros((V, D + 7), np.float16)
    big[:, :D] = weights
    head = ctx.lm_head(big[:, :D])  # row stride D + 7, fp16
    w16 = big[:, :D].astype(np.float32)
    hbig = np.random.default_rng(2).standard_normal((3, 2 * D)).astype(np.float32)
    tokens, scores = ctx.draft(head, hbig[:, :D])
    ref = logits_of(w16, hbig[:, :D])
    np.testing.assert_array_equal(tokens, ref.argmax(axis=1))
    np.testing.assert_allclose(scores, ref.max(axis=1), rtol=1e-4, atol=1e-4)


def test_sampled_draft_follows_the_randomness_contract(ctx, weights):
    rows, temperature = 4, 0.7
    h = np.random.default_rng(3).standard_normal((rows, D)).astype(np.float32)
    seeds = np.array([11, 12, 13, 14], np.uint64)
    request_ids = np.array([100, 7, 100, 5], np.uint64)
    steps = np.array([0, 3, 9, 1], np.uint64)
    positions = np.array([0, 1, 2, 0], np.int32)
    head = ctx.lm_head(weights)
    tokens, logq = ctx.draft(head, h, temperature=temperature, seeds=seeds, request_ids=request_ids,
                             steps=steps, positions=positions)
    scaled = logits_of(weights, h) / temperature
    for r in range(rows):
        u = np.array([flashspec.rng_uniform(int(seeds[r]), int(request_ids[r]), int(steps[r]),
                                            int(positions[r]), "draft_noise", i) for i in range(V)])
        expected = int(np.argmax(scaled[r] - np.log(-np.log(u))))
        assert tokens[r] == expected
        lse = np.log(np.exp(scaled[r] - scaled[r].max()).sum()) + scaled[r].max()
        assert logq[r] == pytest.approx(scaled[r, expected] - lse, abs=1e-4)


def test_draft_into_given_outputs(ctx, weights):
    head = ctx.lm_head(weights)
    h = np.random.default_rng(4).standard_normal((2, D)).astype(np.float32)
    tokens = np.full(2, -5, np.int32)
    scores = np.zeros(2, np.float32)
    out_t, out_s = ctx.draft(head, h, tokens_out=tokens, scores_out=scores)
    assert out_t is tokens and out_s is scores
    np.testing.assert_array_equal(tokens, logits_of(weights, h).argmax(axis=1))


def greedy_batch(weights, rng, lengths, *, correct):
    """Drafts that agree with the target argmax (correct=True) or not."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    hidden = rng.standard_normal((int(offsets[-1]) + len(lengths), D)).astype(np.float32)
    argmax = logits_of(weights, hidden).argmax(axis=1)
    drafts = []
    for r, n in enumerate(lengths):
        base = int(offsets[r]) + r
        for j in range(n):
            t = int(argmax[base + j])
            drafts.append(t if correct[r] > j else (t + 1) % V)
    return offsets, np.array(drafts, np.int32), hidden, argmax


def test_greedy_verify_equals_greedy_decoding(ctx, weights):
    rng = np.random.default_rng(5)
    lengths = [3, 0, 4, 2]
    correct = [3, 0, 1, 0]  # request 0 all accepted, 2 rejected at its 2nd draft
    offsets, drafts, hidden, argmax = greedy_batch(weights, rng, lengths, correct=correct)
    batch = flashspec.VerifyBatch(offsets, drafts, hidden, temperatures=np.zeros(4, np.float32),
                                  steps=np.array([5, 6, 7, 8], np.uint64))
    result = ctx.verify_and_finalize(ctx.lm_head(weights), batch)
    np.testing.assert_array_equal(result.accepted_counts, [3, 0, 1, 0])
    for r in range(4):
        base = int(offsets[r]) + r
        k = correct[r]
        assert result.tokens(r) == [int(t) for t in drafts[offsets[r]:offsets[r] + k]] + [int(argmax[base + k])]
        tail = np.asarray(result.emitted_tokens)[base + k + 1: base + lengths[r] + 1]
        assert (tail == -1).all()
    np.testing.assert_array_equal(result.next_steps, [6, 7, 8, 9])


def test_a_greedy_batch_is_temperatures_of_zero(ctx, weights):
    rng = np.random.default_rng(7)
    offsets, drafts, hidden, _ = greedy_batch(weights, rng, [3, 1, 4], correct=[1, 1, 4])
    head = ctx.lm_head(weights)
    zeros = ctx.verify_and_finalize(head, flashspec.VerifyBatch(offsets, drafts, hidden, temperatures=[0, 0, 0]))
    flagged = ctx.verify_and_finalize(head, flashspec.VerifyBatch(offsets, drafts, hidden, greedy=True))
    np.testing.assert_array_equal(flagged.accepted_counts, [1, 1, 4])
    np.testing.assert_array_equal(flagged.accepted_counts, zeros.accepted_counts)
    np.testing.assert_array_equal(flagged.emitted_tokens, zeros.emitted_tokens)
    with pytest.raises(flashspec.InvalidArgumentError, match="temperatures"):
        ctx.verify_and_finalize(head, flashspec.VerifyBatch(offsets, drafts, hidden, greedy=True,
                                                            temperatures=[0, 0, 0]))


def test_verify_then_finalize_matches_the_fused_call(ctx, weights):
    rng = np.random.default_rng(6)
    offsets, drafts, hidden, _ = greedy_batch(weights, rng, [2, 3], correct=[1, 3])
    batch = flashspec.VerifyBatch(offsets, drafts, hidden, seeds=[3, 4], request_ids=[10, 11])
    head = ctx.lm_head(weights)
    summaries = ctx.summaries(max_rows=16, max_requests=4)
    ctx.verify(head, batch, summaries)
    split = ctx.finalize(batch, summaries)
    fused = ctx.verify_and_finalize(head, batch)
    np.testing.assert_array_equal(split.accepted_counts, fused.accepted_counts)
    np.testing.assert_array_equal(split.emitted_tokens, fused.emitted_tokens)


def test_caller_uniforms_decide_acceptance(ctx, weights):
    rng = np.random.default_rng(8)
    lengths = [4]
    offsets, drafts, hidden, _ = greedy_batch(weights, rng, lengths, correct=[4])
    temperature = 1.5
    logp = logits_of(weights, hidden) / temperature
    logp -= np.log(np.exp(logp - logp.max(axis=1, keepdims=True)).sum(axis=1, keepdims=True)) + \
        logp.max(axis=1, keepdims=True)
    p = np.array([math.exp(logp[j, drafts[j]]) for j in range(4)])
    # Accept positions 0 and 1, reject position 2: u below p, then above.
    uniforms = np.array([p[0] * 0.5, p[1] * 0.5, min(p[2] * 1.5, 0.999999), 0.5], np.float32)
    batch = flashspec.VerifyBatch(offsets, drafts, hidden, temperatures=[temperature],
                                  accept_uniforms=uniforms)
    result = ctx.verify_and_finalize(ctx.lm_head(weights), batch)
    assert int(result.accepted_counts[0]) == 2
    tokens = result.tokens(0)
    assert tokens[:2] == [int(drafts[0]), int(drafts[1])]
    assert tokens[2] != int(drafts[2]) and 0 <= tokens[2] < V  # the residual excludes the draft


def test_errors_carry_status_and_message(ctx, weights):
    head = ctx.lm_head(weights)
    offsets = np.array([0, 2], np.int32)
    hidden = np.zeros((3, D), np.float32)
    batch = flashspec.VerifyBatch(offsets, np.array([1, V + 3], np.int32), hidden)
    with pytest.raises(flashspec.OutOfRangeError) as info:
        ctx.verify_and_finalize(head, batch)
    assert info.value.status == capi.FLASHSPEC_ERR_OUT_OF_RANGE
    assert "draft_tokens" in info.value.message
    assert ctx.last_error == info.value.message

    bad = np.ones((1, D), np.float32)
    bad[0, 3] = np.nan
    with pytest.raises(flashspec.NonFiniteError):
        ctx.draft(head, bad)
    with pytest.raises(flashspec.OutOfRangeError, match="cols|hidden"):
        ctx.draft(head, np.ones((1, D + 1), np.float32))
    with pytest.raises(flashspec.InvalidArgumentError):
        ctx.draft(head, np.ones((1, D), np.float32), temperature=-1.0)


def log_softmax(logits):
    """float64 log-softmax over the last axis."""
    top = logits.max(axis=-1, keepdims=True)
    return logits - (top + np.log(np.exp(logits - top).sum(axis=-1, keepdims=True)))


def test_draft_top_k_ranks_the_log_softmax_of_the_logits(ctx, weights):
    rows, k = 4, 5
    h = np.random.default_rng(21).standard_normal((rows, D)).astype(np.float32)
    head = ctx.lm_head(weights)
    tokens, logprobs = ctx.draft_top_k(head, h, k)
    assert isinstance(tokens, np.ndarray) and isinstance(logprobs, np.ndarray)
    assert (tokens.shape, tokens.dtype, logprobs.shape, logprobs.dtype) == ((rows, k), np.int32, (rows, k), np.float32)
    logits = logits_of(weights, h)
    ranked = np.argsort(-logits, axis=1, kind="stable")[:, :k]  # ties: the smaller id first
    np.testing.assert_array_equal(tokens, ranked)
    np.testing.assert_allclose(logprobs, np.take_along_axis(log_softmax(logits), ranked, axis=1), rtol=0, atol=1e-4)
    # Log-probabilities of the whole vocabulary, not of the k kept: a
    # renormalisation over the top k would sum to 1.
    assert np.exp(logprobs.astype(np.float64)).sum(axis=1).max() < 1 - 1e-3


def test_draft_top_k_of_one_is_the_greedy_draft(ctx, weights):
    h = np.random.default_rng(22).standard_normal((6, D)).astype(np.float32)
    head = ctx.lm_head(weights)
    tokens, _ = ctx.draft_top_k(head, h, 1)
    greedy, _ = ctx.draft(head, h, temperature=0.0)
    np.testing.assert_array_equal(tokens[:, 0], greedy)
    full, _ = ctx.draft_top_k(head, h, flashspec.MAX_DRAFT_TOP_K)
    assert full.shape == (6, flashspec.MAX_DRAFT_TOP_K) == (6, capi.FLASHSPEC_MAX_DRAFT_TOP_K)
    np.testing.assert_array_equal(full[:, 0], greedy)


def test_draft_top_k_applies_the_bias_and_mask_of_its_controls(ctx, weights):
    rows, k = 2, 4
    h = np.random.default_rng(23).standard_normal((rows, D)).astype(np.float32)
    mask = np.zeros((rows, V), bool)
    mask[0, 10:40] = True
    mask[1, [3, 7]] = True  # fewer allowed tokens than k
    bias = {12: 5.0, 3: -2.0}
    controls = flashspec.SamplingControls(token_mask=mask, logit_bias=bias)
    tokens, logprobs = ctx.draft_top_k(ctx.lm_head(weights), h, k, controls=controls)
    x = logits_of(weights, h)
    for token, value in bias.items():
        x[:, token] += value
    x[~mask] = -np.inf
    ranked = np.argsort(-x, axis=1, kind="stable")[:, :k]
    expected = np.take_along_axis(log_softmax(x), ranked, axis=1)
    np.testing.assert_array_equal(tokens[0], ranked[0])
    np.testing.assert_allclose(logprobs[0], expected[0], rtol=0, atol=1e-4)
    np.testing.assert_array_equal(tokens[1, :2], ranked[1, :2])
    np.testing.assert_allclose(logprobs[1, :2], expected[1, :2], rtol=0, atol=1e-4)
    np.testing.assert_array_equal(tokens[1, 2:], [-1, -1])
    assert np.all(np.isneginf(logprobs[1, 2:]))


@pytest.mark.parametrize("k", [0, -1, capi.FLASHSPEC_MAX_DRAFT_TOP_K + 1, 1 << 40, -(1 << 40)])
def test_draft_top_k_refuses_k_outside_one_to_the_maximum(ctx, weights, k):
    with pytest.raises(flashspec.OutOfRangeError) as info:
        ctx.draft_top_k(ctx.lm_head(weights), np.ones((2, D), np.float32), k)
    assert info.value.status == capi.FLASHSPEC_ERR_OUT_OF_RANGE
    assert "k" in info.value.message


def test_draft_top_k_refuses_truncating_controls(ctx, weights):
    with pytest.raises(flashspec.InvalidArgumentError) as info:
        ctx.draft_top_k(ctx.lm_head(weights), np.ones((1, D), np.float32), 3,
                        controls=flashspec.SamplingControls(top_p=0.9))
    assert info.value.status == capi.FLASHSPEC_ERR_INVALID_ARGUMENT
    with pytest.raises(TypeError, match="k"):
        ctx.draft_top_k(ctx.lm_head(weights), np.ones((1, D), np.float32), 2.0)


def test_failed_create_reports_through_the_thread_message():
    # No machine has CUDA device 99: NO_DEVICE whether or not a GPU is present.
    with pytest.raises(flashspec.NoDeviceError) as info:
        flashspec.Context("cuda", device=99)
    assert info.value.status == capi.FLASHSPEC_ERR_NO_DEVICE and info.value.message
    with pytest.raises(flashspec.OutOfRangeError, match="max_rows"):
        flashspec.Context("cpu", max_rows=-1)


def test_handles_close_once_and_children_first(weights):
    c = flashspec.Context("cpu")
    head = c.lm_head(weights)
    summaries = c.summaries(4, 2)
    c.close()
    assert head.closed and summaries.closed and c.closed
    c.close()
    with pytest.raises(ValueError, match="closed"):
        c.draft(head, np.zeros((1, D), np.float32))
    del c, head, summaries
    gc.collect()


def test_philox_known_answer():
    # Random123 known-answer vector for philox4x32-10 with zero counter and key.
    assert flashspec.philox4x32_10([0, 0, 0, 0], [0, 0]) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    u = flashspec.rng_uniform(1, 2, 3, 4, "accept_uniform", 0)
    assert 0.0 < u < 1.0
    assert u != flashspec.rng_uniform(1, 2, 3, 4, "bonus_noise", 0)


def test_plugin_table_resolves_the_same_functions():
    api = flashspec.get_api()
    assert api.abi_version == flashspec.ABI_VERSION
    assert api.struct_size >= 20 * ctypes.sizeof(ctypes.c_void_p)
    version_number = ctypes.CFUNCTYPE(ctypes.c_uint)(int(api.version_number))
    assert version_number() == flashspec.version_number()
    status_string = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_int)(int(api.status_string))
    assert status_string(capi.FLASHSPEC_ERR_CUDA).decode() == flashspec.status_string(capi.FLASHSPEC_ERR_CUDA)
    assert flashspec.get_api(flashspec.ABI_VERSION + 1) is None


# ---- lengths are checked before the library is called ---------------------
# Each too-short array raises a plain ValueError (not a FlashSpecError: the
# library never saw the call), the C function is not called, and the outputs
# are left as they were.

@pytest.fixture
def no_library_call(monkeypatch):
    """Replaces the C entry points that take caller buffers with a function
    that fails the test: any call reaching them is a missing binding check."""
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
    return info.value


def host_batch(weights, **overrides):
    """Two requests of 2 and 1 drafts: offsets [0, 2, 3], 5 target rows."""
    rng = np.random.default_rng(11)
    args = dict(draft_offsets=np.array([0, 2, 3], np.int32), draft_tokens=np.array([1, 2, 3], np.int32),
                target_hidden=rng.standard_normal((5, D)).astype(np.float32))
    args.update(overrides)
    return flashspec.VerifyBatch(args.pop("draft_offsets"), args.pop("draft_tokens"), args.pop("target_hidden"),
                                 **args)


def sentinel_result(requests=2, rows=5):
    return flashspec.VerifyResult(np.full(requests, -7, np.int32), np.full(rows, -7, np.int32),
                                  np.full(requests, 7, np.uint64))


def assert_untouched(result):
    assert (np.asarray(result.accepted_counts) == -7).all()
    assert (np.asarray(result.emitted_tokens) == -7).all()
    assert (np.asarray(result.next_steps) == 7).all()


@pytest.mark.parametrize("name, value, match", [
    # A slice of a longer array: without the check the library reads on into
    # the rest of it and succeeds.
    ("draft_tokens", np.array([1, 2, 3, 4], np.int32)[:2], r"draft_tokens has 2 entries, fewer than draft_offsets\[R\] = 3"),
    ("temperatures", np.array([0.5, 0.5], np.float32)[:1], "temperatures has 1 entries, fewer than the 2 requests"),
    ("draft_temperatures", np.ones(2, np.float32)[:1], "draft_temperatures has 1 entries, fewer than the 2 requests"),
    ("seeds", np.arange(2, dtype=np.uint64)[:1], "seeds has 1 entries, fewer than the 2 requests"),
    ("request_ids", [5], "request_ids has 1 entries, fewer than the 2 requests"),
    ("steps", np.zeros(0, np.uint64), "steps has 0 entries, fewer than the 2 requests"),
    ("accept_uniforms", np.full(3, 0.5, np.float32)[:2], r"accept_uniforms has 2 entries, fewer than draft_offsets\[R\] = 3"),
])
def test_short_batch_arrays_are_refused_before_the_call(ctx, weights, no_library_call, name, value, match):
    head = ctx.lm_head(weights)
    batch = host_batch(weights, **{name: value})
    out = sentinel_result()
    refused(ctx, no_library_call, lambda: ctx.verify_and_finalize(head, batch, out=out), match)
    assert_untouched(out)
    summaries = ctx.summaries(16, 4)
    refused(ctx, no_library_call, lambda: ctx.verify(head, batch, summaries), match)
    refused(ctx, no_library_call, lambda: ctx.finalize(batch, summaries, out=out), match)
    assert_untouched(out)


def test_target_hidden_and_draft_logits_rows_must_match_the_offsets(ctx, weights, no_library_call):
    head = ctx.lm_head(weights)
    rows4 = np.zeros((4, D), np.float32)
    refused(ctx, no_library_call, lambda: ctx.verify_and_finalize(head, host_batch(weights, target_hidden=rows4)),
            r"target_hidden has 4 rows, expected draft_offsets\[R\] \+ R = 5")
    logits = np.zeros((2, V), np.float32)
    refused(ctx, no_library_call,
            lambda: ctx.verify_and_finalize(head, host_batch(weights, draft_logits=logits), out=sentinel_result()),
            r"draft_logits has 2 rows, expected draft_offsets\[R\] = 3")


@pytest.mark.parametrize("field, size", [("accepted_counts", 1), ("emitted_tokens", 4), ("next_steps", 1)])
def test_short_result_arrays_are_refused_and_neighbours_untouched(ctx, weights, field, size):
    # The real library stays in place: without the check it writes on into
    # the memory after each slice.
    head = ctx.lm_head(weights)
    backing = {"accepted_counts": np.full(8, -7, np.int32), "emitted_tokens": np.full(8, -7, np.int32),
               "next_steps": np.full(8, 7, np.uint64)}
    full = {"accepted_counts": 2, "emitted_tokens": 5, "next_steps": 2}
    views = {k: v[:size if k == field else full[k]] for k, v in backing.items()}
    out = flashspec.VerifyResult(views["accepted_counts"], views["emitted_tokens"], views["next_steps"])
    want = "the 2 requests" if field != "emitted_tokens" else r"draft_offsets\[R\] \+ R = 5"
    refused(ctx, [], lambda: ctx.verify_and_finalize(head, host_batch(weights), out=out),
            f"{field} has {size} entries, fewer than {want}")
    # Nothing was written: neither the arrays nor the memory after them.
    assert (backing["accepted_counts"] == -7).all() and (backing["emitted_tokens"] == -7).all()
    assert (backing["next_steps"] == 7).all()


def test_result_arrays_of_the_right_size_are_written_in_place(ctx, weights):
    head = ctx.lm_head(weights)
    steps = np.array([5, 6], np.uint64)
    want = ctx.verify_and_finalize(head, host_batch(weights, steps=steps))
    # int64 where C writes uint64: the same bits, written into the caller's array.
    out = flashspec.VerifyResult(np.full(2, -7, np.int32), np.full(5, -7, np.int32), np.zeros(2, np.int64))
    got = ctx.verify_and_finalize(head, host_batch(weights, steps=steps), out=out)
    assert got is out
    np.testing.assert_array_equal(out.accepted_counts, want.accepted_counts)
    np.testing.assert_array_equal(out.emitted_tokens, want.emitted_tokens)
    np.testing.assert_array_equal(out.next_steps, [6, 7])


@pytest.mark.parametrize("next_steps, error, match", [
    (np.zeros(2, np.int32), TypeError, "next_steps: expected a uint64 output"),
    (np.zeros(4, np.uint64)[::2], ValueError, "next_steps: outputs must be contiguous"),
    ([0, 0], TypeError, "next_steps: an output must be an array"),
])
def test_outputs_are_never_silently_copied(ctx, weights, no_library_call, next_steps, error, match):
    head = ctx.lm_head(weights)
    out = flashspec.VerifyResult(np.zeros(2, np.int32), np.zeros(5, np.int32), next_steps)
    refused(ctx, no_library_call, lambda: ctx.verify_and_finalize(head, host_batch(weights), out=out), match, error)


def test_read_only_outputs_are_refused(ctx, weights, no_library_call):
    head = ctx.lm_head(weights)
    frozen = np.zeros(5, np.int32)
    frozen.flags.writeable = False
    out = flashspec.VerifyResult(np.zeros(2, np.int32), frozen)
    refused(ctx, no_library_call, lambda: ctx.verify_and_finalize(head, host_batch(weights), out=out),
            "emitted_tokens: the output array is read-only")
    refused(ctx, no_library_call, lambda: ctx.draft(head, np.zeros((5, D), np.float32), tokens_out=frozen),
            "tokens_out: the output array is read-only")


def test_draft_outputs_are_checked_not_copied(ctx, weights, no_library_call):
    head = ctx.lm_head(weights)
    h = np.zeros((3, D), np.float32)
    backing = np.full(4, -5, np.int32)
    refused(ctx, no_library_call, lambda: ctx.draft(head, h, tokens_out=backing[:2]),
            "tokens_out has 2 entries, fewer than the 3 rows")
    refused(ctx, no_library_call, lambda: ctx.draft(head, h, tokens_out=np.zeros(3, np.int64)),
            "tokens_out: expected a int32 output", TypeError)
    refused(ctx, no_library_call, lambda: ctx.draft(head, h, scores_out=np.zeros(6, np.float32)[::2]),
            "scores_out: outputs must be contiguous")
    refused(ctx, no_library_call, lambda: ctx.draft(head, h, seeds=np.zeros(3, np.uint64)[:2]),
            "seeds has 2 entries, fewer than the 3 rows")
    assert (backing == -5).all()


def test_a_batch_without_drafts(ctx, weights):
    head = ctx.lm_head(weights)
    hidden = np.random.default_rng(12).standard_normal((2, D)).astype(np.float32)
    result = ctx.verify_and_finalize(head, flashspec.VerifyBatch([0, 0, 0], [], hidden, temperatures=[0, 0],
                                                                 draft_logits=np.zeros((0, V), np.float32)))
    argmax = logits_of(weights, hidden).argmax(axis=1)
    assert result.tokens(0) == [int(argmax[0])] and result.tokens(1) == [int(argmax[1])]


# Device arrays, described through __cuda_array_interface__ only. Nothing
# here dereferences them: the binding's own checks run on their shapes, and
# the library is replaced by a function that fails the test.
class DeviceArray:
    def __init__(self, shape, typestr, strides=None):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "strides": strides,
                                         "data": (0x7F0000000000, False), "version": 3}


def device_batch(offsets=3, tokens=3, rows=5, logits=None, **per_request):
    """A device batch of R = offsets - 1 requests: the device offsets are not
    readable, so offsets[R] is taken as rows - R."""
    arrays = {k: DeviceArray((n,), "<u8" if k in ("seeds", "request_ids", "steps") else "<f4")
              for k, n in per_request.items()}
    return flashspec.VerifyBatch(DeviceArray((offsets,), "<i4"), DeviceArray((tokens,), "<i4"),
                                 DeviceArray((rows, D), "<f4"),
                                 draft_logits=DeviceArray((logits, V), "<f4") if logits is not None else None,
                                 **arrays)


@pytest.mark.parametrize("batch, match", [
    (lambda: device_batch(tokens=2), r"draft_tokens has 2 entries, fewer than draft_offsets\[R\] = 3"),
    (lambda: device_batch(temperatures=1), "temperatures has 1 entries, fewer than the 2 requests"),
    (lambda: device_batch(draft_temperatures=1), "draft_temperatures has 1 entries"),
    (lambda: device_batch(seeds=1), "seeds has 1 entries"),
    (lambda: device_batch(request_ids=0), "request_ids has 0 entries"),
    (lambda: device_batch(steps=1), "steps has 1 entries"),
    (lambda: device_batch(accept_uniforms=2), r"accept_uniforms has 2 entries, fewer than draft_offsets\[R\] = 3"),
    (lambda: device_batch(rows=1), "target_hidden has 1 rows, fewer than the 2 requests"),
    (lambda: device_batch(logits=4), r"draft_logits has 4 rows, expected draft_offsets\[R\] = 3"),
])
def test_device_batch_sizes_are_checked_without_reading_the_device(ctx, weights, no_library_call, batch, match):
    head = ctx.lm_head(weights)
    summaries = ctx.summaries(16, 4)
    refused(ctx, no_library_call, lambda: ctx.verify(head, batch(), summaries), match)


def test_device_result_sizes_are_checked_against_the_batch(ctx, no_library_call):
    summaries = ctx.summaries(16, 4)
    out = flashspec.VerifyResult(DeviceArray((2,), "<i4"), DeviceArray((4,), "<i4"), DeviceArray((2,), "<i8"))
    refused(ctx, no_library_call, lambda: ctx.finalize(device_batch(), summaries, out=out),
            r"emitted_tokens has 4 entries, fewer than draft_offsets\[R\] \+ R = 5")


def test_an_empty_device_draft_array_is_passed_as_null():
    # Requests without drafts: no draft tokens, one target row each. An empty
    # array is contiguous whatever strides its producer reports.
    batch = flashspec.VerifyBatch(DeviceArray((3,), "<i4"), DeviceArray((0,), "<i4", strides=(8,)),
                                  DeviceArray((2, D), "<f4"), draft_logits=DeviceArray((0, V), "<f4", strides=(0, 8)))
    c = batch.c_batch(0)
    assert c.num_requests == 2 and c.memory == capi.FLASHSPEC_MEMORY_CUDA
    assert c.draft_tokens == 0 and c.draft_logits is None


def test_all_names_the_public_api():
    # help(flashspec) documents __all__: every name in it exists, and the
    # classes and functions of the package are in it.
    for name in flashspec.__all__:
        assert hasattr(flashspec, name), name
    for name in ("Context", "LMHead", "VerifyBatch", "VerifyResult", "SamplingControls", "Engine", "NgramDrafter",
                 "CallbackDrafter",
                 "FlashSpecError", "InvalidArgumentError", "rng_uniform", "version"):
        assert name in flashspec.__all__, name
    assert "capi" not in flashspec.__all__
    assert len(flashspec.__all__) == len(set(flashspec.__all__)), "a name listed twice"
