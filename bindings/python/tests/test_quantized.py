"""CPU tests of 8-bit LM heads (Context.lm_head_quantized, LMHead.dtype):
the library's quantisation rule reproduced in numpy, greedy drafts against
float64 logits of the dequantised weights, pre-quantised codes with their
scales, and the library's errors for bad input."""
import numpy as np
import pytest

import flashspec
from flashspec import capi

V, D, ROWS = 40, 16, 6


@pytest.fixture
def ctx():
    with flashspec.Context("cpu", seed=5, cpu_threads=2, max_rows=64, max_requests=8) as c:
        yield c


@pytest.fixture
def weights():
    return np.random.default_rng(11).standard_normal((V, D)).astype(np.float32)


def e4m3_value(code):
    """The value of an e4m3 ("e4m3fn") bit pattern: bias 7, 3 mantissa bits."""
    code = int(code)
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    if exponent == 0:
        return sign * mantissa * 2.0 ** -9
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


def e4m3_round(x):
    """x (float32) to the nearest e4m3 value, ties to even, saturating at ±448."""
    x = np.asarray(x, np.float64)
    a = np.abs(x)
    exponent = np.maximum(np.floor(np.log2(np.where(a > 0, a, 1.0))), -6)
    step = 2.0 ** (exponent - 3)  # 3 mantissa bits; subnormals share 2^-9
    return np.sign(x) * np.minimum(np.rint(a / step) * step, 448.0)


def quantize(w, stored):
    """The documented rule, in float32 as the library computes it: per row
    scale = amax / 448 (e4m3) or amax / 127 (int8), 1 where that is 0; the
    codes' values and the scales."""
    w = np.asarray(w, np.float32)
    amax = np.abs(w).max(axis=1)
    scale = amax / np.float32(448.0 if stored == "e4m3" else 127.0)
    scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
    x = (w / scale[:, None]).astype(np.float32)
    values = e4m3_round(x) if stored == "e4m3" else np.clip(np.rint(x.astype(np.float64)), -127, 127)
    return values, scale


def dequantised(values, scale):
    return np.asarray(values, np.float64) * np.asarray(scale, np.float64)[:, None]


def hidden_rows(w_ref, seed):
    """Hidden rows whose float64 logits have a clear winner: each is a
    multiple of one vocabulary row plus noise; the test asserts the margin."""
    rng = np.random.default_rng(seed)
    picks = rng.choice(V, ROWS, replace=False)
    h = (3.0 * w_ref[picks] / np.abs(w_ref[picks]).max(axis=1, keepdims=True)
         + 0.1 * rng.standard_normal((ROWS, D))).astype(np.float32)
    return h


def assert_greedy_matches(ctx, head, w_ref, seed):
    h = hidden_rows(w_ref, seed)
    logits = np.asarray(h, np.float64) @ w_ref.T
    top2 = np.sort(logits, axis=1)[:, -2:]
    assert np.all(top2[:, 1] - top2[:, 0] > 1e-3 * np.maximum(1.0, np.abs(top2[:, 1]))), "ties possible"
    tokens, scores = ctx.draft(head, h)
    np.testing.assert_array_equal(tokens, logits.argmax(axis=1))
    np.testing.assert_allclose(scores, logits.max(axis=1), rtol=1e-4, atol=1e-4)


def test_e4m3_decoder_knows_the_documented_codes():
    assert [e4m3_value(c) for c in (0x38, 0x40, 0xB8, 0x30, 0x00, 0x7E, 0x01)] == \
        [1.0, 2.0, -1.0, 0.5, 0.0, 448.0, 2.0 ** -9]
    assert e4m3_round(np.float32(1.0625)) == 1.0 and e4m3_round(np.float32(1.1875)) == 1.25  # ties to even
    assert e4m3_round(np.float32(500.0)) == 448.0


@pytest.mark.parametrize("stored,expected", [("e4m3", capi.FLASHSPEC_DTYPE_E4M3), ("int8", capi.FLASHSPEC_DTYPE_I8)])
def test_quantising_float32_weights_reads_back_the_stored_dtype(ctx, weights, stored, expected):
    head = ctx.lm_head_quantized(weights, stored)
    assert head.dtype == stored
    assert capi.flashspec_lm_head_dtype(head.raw) == expected
    assert (head.vocab_size, head.hidden_size) == (V, D)
    by_constant = ctx.lm_head_quantized(weights, expected)
    assert by_constant.dtype == stored


def test_float_heads_read_back_their_dtype(ctx, weights):
    assert ctx.lm_head(weights).dtype == "float32"
    assert ctx.lm_head(weights.astype(np.float16)).dtype == "float16"


@pytest.mark.parametrize("stored", ["e4m3", "int8"])
def test_greedy_draft_of_a_quantised_head_is_the_argmax_of_the_dequantised_weights(ctx, weights, stored):
    head = ctx.lm_head_quantized(weights, stored)
    values, scale = quantize(weights, stored)
    assert_greedy_matches(ctx, head, dequantised(values, scale), seed=3)


def test_float16_weights_are_quantised_too(ctx, weights):
    w16 = weights.astype(np.float16)
    head = ctx.lm_head_quantized(w16, "int8")
    assert head.dtype == "int8"
    values, scale = quantize(w16.astype(np.float32), "int8")
    assert_greedy_matches(ctx, head, dequantised(values, scale), seed=4)


@pytest.mark.parametrize("shape", [(V,), (V, 1)])
def test_int8_codes_with_scales(ctx, shape):
    rng = np.random.default_rng(21)
    codes = rng.integers(-128, 128, size=(V, D)).astype(np.int8)  # any int8 value, -128 included
    scales = rng.uniform(0.001, 0.05, size=V).astype(np.float32)
    head = ctx.lm_head_quantized(codes, "int8", scales=scales.reshape(shape))
    assert head.dtype == "int8"
    assert_greedy_matches(ctx, head, dequantised(codes, scales), seed=5)


def test_e4m3_codes_with_scales(ctx):
    rng = np.random.default_rng(22)
    codes = rng.integers(0, 256, size=(V, D)).astype(np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x38  # no NaN code
    codes[0, :4] = [0x38, 0x40, 0xB8, 0x30]  # 1, 2, -1, 0.5
    scales = rng.uniform(0.001, 0.01, size=V).astype(np.float32)
    values = np.vectorize(e4m3_value)(codes)
    assert list(values[0, :4]) == [1.0, 2.0, -1.0, 0.5]
    head = ctx.lm_head_quantized(codes, capi.FLASHSPEC_DTYPE_E4M3, scales=scales)
    assert head.dtype == "e4m3"
    assert_greedy_matches(ctx, head, dequantised(values, scales), seed=6)


def test_strided_codes_and_scales_are_copied(ctx):
    rng = np.random.default_rng(23)
    wide = rng.integers(-127, 128, size=(V, 2 * D)).astype(np.int8)
    codes = wide[:, ::2]
    scales_wide = rng.uniform(0.01, 0.02, size=(V, 2)).astype(np.float32)
    scales = scales_wide[:, :1]  # [V, 1], row stride 2
    head = ctx.lm_head_quantized(codes, "int8", scales=scales)
    assert_greedy_matches(ctx, head, dequantised(codes, scales[:, 0]), seed=7)


def test_quantised_head_verifies(ctx, weights):
    head = ctx.lm_head_quantized(weights, "int8")
    w_ref = dequantised(*quantize(weights, "int8"))
    h = hidden_rows(w_ref, 8)[:3]
    target = (np.asarray(h, np.float64) @ w_ref.T).argmax(axis=1)
    batch = flashspec.VerifyBatch(np.array([0, 2], np.int32), target[:2].astype(np.int32), h)
    result = ctx.verify_and_finalize(head, batch)
    assert result.tokens(0) == list(target)


def check_error(cls, status, match, call):
    with pytest.raises(cls, match=match) as info:
        call()
    assert info.value.status == status
    assert info.value.message
    return info.value


def test_bad_input_raises_the_library_status(ctx, weights):
    codes = np.zeros((V, D), np.int8)
    scales = np.ones(V, np.float32)
    # Wrong stored dtype: not 8-bit, or codes of the other 8-bit dtype.
    check_error(flashspec.DtypeMismatchError, capi.FLASHSPEC_ERR_DTYPE_MISMATCH, "stored",
                lambda: ctx.lm_head_quantized(weights, "float32"))
    check_error(flashspec.DtypeMismatchError, capi.FLASHSPEC_ERR_DTYPE_MISMATCH, "weight",
                lambda: ctx.lm_head_quantized(codes, "e4m3", scales=scales))
    check_error(flashspec.DtypeMismatchError, capi.FLASHSPEC_ERR_DTYPE_MISMATCH, "weight",
                lambda: ctx.lm_head_quantized(codes.view(np.uint8), "int8", scales=scales))
    # Scales given for a weight the library quantises, or missing for codes.
    check_error(flashspec.InvalidArgumentError, capi.FLASHSPEC_ERR_INVALID_ARGUMENT, "scales",
                lambda: ctx.lm_head_quantized(weights, "int8", scales=scales))
    check_error(flashspec.InvalidArgumentError, capi.FLASHSPEC_ERR_INVALID_ARGUMENT, "scales",
                lambda: ctx.lm_head_quantized(codes, "int8"))
    # Scales of the wrong length: the library is given the array's own
    # length and refuses it, reading nothing past its end.
    for wrong in (np.ones(V - 1, np.float32), np.ones(V + 1, np.float32), np.ones((V, 2), np.float32)):
        err = check_error(flashspec.InvalidArgumentError, capi.FLASHSPEC_ERR_INVALID_ARGUMENT, "scales",
                          lambda: ctx.lm_head_quantized(codes, "int8", scales=wrong))
        assert f"[{V}, 1]" in err.message
    # Negative or non-finite scales.
    for bad in (-1.0, np.nan, np.inf):
        s = scales.copy()
        s[V // 2] = bad
        check_error(flashspec.NonFiniteError, capi.FLASHSPEC_ERR_NON_FINITE, "scales",
                    lambda: ctx.lm_head_quantized(codes, "int8", scales=s))
    # A NaN e4m3 code.
    nan_codes = np.full((V, D), 0x38, np.uint8)
    nan_codes[3, 4] = 0x7F
    check_error(flashspec.NonFiniteError, capi.FLASHSPEC_ERR_NON_FINITE, "weight",
                lambda: ctx.lm_head_quantized(nan_codes, "e4m3", scales=scales))
    # Non-finite weights to quantise.
    w = weights.copy()
    w[1, 2] = np.inf
    check_error(flashspec.NonFiniteError, capi.FLASHSPEC_ERR_NON_FINITE, "weight",
                lambda: ctx.lm_head_quantized(w, "e4m3"))


def test_binding_argument_errors(ctx, weights):
    with pytest.raises(ValueError, match="stored must be one of"):
        ctx.lm_head_quantized(weights, "fp8")
    with pytest.raises(TypeError, match="stored"):
        ctx.lm_head_quantized(weights, 3.0)
    with pytest.raises(ValueError, match="shape"):
        ctx.lm_head_quantized(np.zeros((V, D), np.int8), "int8", scales=np.ones((2, V, 1), np.float32))
    with pytest.raises(ValueError, match="pass stored"):
        flashspec.LMHead(ctx, weights, scales=np.ones(V, np.float32))
    with pytest.raises(ValueError, match="unsharded"):
        flashspec.LMHead(ctx, weights, stored="int8", vocab_begin=0, global_vocab_size=V)


def test_context_close_closes_quantised_heads(weights):
    c = flashspec.Context("cpu", cpu_threads=1)
    head = c.lm_head_quantized(weights, "e4m3")
    c.close()
    assert head.closed
