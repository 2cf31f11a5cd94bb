"""GPU tests of the Python binding: torch and cupy device arrays reach the
CUDA backend without a copy, on the context's stream, and give the CPU
backend's tokens. Each test skips with its reason where there is no GPU, no
CUDA backend in this build, or no torch / cupy."""
import numpy as np
import pytest

import flashspec

V, D = 300, 64

if flashspec.cuda_device_count() == 0:
    pytest.skip("no CUDA device usable by this build of libflashspec "
                "(CPU-only build or no GPU)", allow_module_level=True)

torch = pytest.importorskip("torch", reason="PyTorch is not installed")


def _cupy():
    return pytest.importorskip("cupy", reason="CuPy is not installed")


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((V, D)).astype(np.float32)
    h = rng.standard_normal((6, D)).astype(np.float32)
    return w, h


def cpu_draft(w, h, **kw):
    with flashspec.Context("cpu", seed=99) as ctx:
        return ctx.draft(ctx.lm_head(w), h, **kw)


def assert_tokens_match(got, want, w, h, temperature=0.0):
    """Tokens equal the CPU backend's, except where the two best candidates
    are closer than fp32 accumulation error (then either is right)."""
    logits = (h.astype(np.float64) @ w.astype(np.float64).T)
    for r, (g, e) in enumerate(zip(got, want)):
        if g == e:
            continue
        if temperature == 0.0:
            gap = abs(logits[r, g] - logits[r, e])
            assert gap < 1e-3 * max(1.0, abs(logits[r, e])), f"row {r}: {g} vs {e}, gap {gap}"
        else:
            pytest.fail(f"row {r}: sampled token {g} differs from the CPU backend's {e}")


def test_torch_draft_zero_copy_on_a_side_stream():
    w, h = inputs()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        wt = torch.from_numpy(w).cuda()
        ht = torch.from_numpy(h).cuda()
        with flashspec.Context("cuda", cuda_stream=stream, seed=99) as ctx:
            assert ctx.backend == "cuda"
            head = ctx.lm_head(wt)
            tokens, scores = ctx.draft(head, ht)
            assert isinstance(tokens, torch.Tensor) and tokens.is_cuda
            ctx.synchronize()
    want_t, want_s = cpu_draft(w, h)
    assert_tokens_match(tokens.cpu().numpy(), want_t, w, h)
    np.testing.assert_allclose(scores.cpu().numpy(), want_s, rtol=1e-3, atol=1e-3)


def test_torch_sampled_draft_matches_cpu_backend_and_writes_given_outputs():
    w, h = inputs(1)
    wt, ht = torch.from_numpy(w).cuda(), torch.from_numpy(h).cuda()
    stream = torch.cuda.current_stream()
    out = torch.full((6,), -1, dtype=torch.int32, device="cuda")
    with flashspec.Context("cuda", cuda_stream=stream, seed=99) as ctx:
        head = ctx.lm_head(wt, borrow=True)
        tokens, _ = ctx.draft(head, ht, temperature=0.8, tokens_out=out)
        assert tokens is out  # written in place, no copy
        ctx.synchronize()
    want, _ = cpu_draft(w, h, temperature=0.8)
    assert_tokens_match(out.cpu().numpy(), want, w, h, temperature=0.8)


def test_torch_bf16_rows_through_dlpack():
    w, h = inputs(2)
    wt = torch.from_numpy(w).cuda().to(torch.bfloat16)
    ht = torch.from_numpy(h).cuda().to(torch.bfloat16)
    with flashspec.Context("cuda", cuda_stream=torch.cuda.current_stream(), seed=99) as ctx:
        tokens, _ = ctx.draft(ctx.lm_head(wt), ht)
        ctx.synchronize()
    w32, h32 = wt.float().cpu().numpy(), ht.float().cpu().numpy()
    want, _ = cpu_draft(w32, h32)
    assert_tokens_match(tokens.cpu().numpy(), want, w32, h32)


def test_torch_verify_and_finalize_on_device_matches_cpu():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((V, D)).astype(np.float32)
    lengths = [3, 1, 4]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    hidden = rng.standard_normal((int(offsets[-1]) + 3, D)).astype(np.float32)
    drafts = rng.integers(0, V, int(offsets[-1])).astype(np.int32)
    temps = np.array([0.0, 1.0, 0.7], np.float32)
    steps = np.array([4, 5, 6], np.uint64)
    with flashspec.Context("cpu", seed=5) as ctx:
        want = ctx.verify_and_finalize(ctx.lm_head(w), flashspec.VerifyBatch(
            offsets, drafts, hidden, temperatures=temps, steps=steps))
    dev = lambda a: torch.from_numpy(a.astype(np.int64) if a.dtype == np.uint64 else a).cuda()  # noqa: E731
    with flashspec.Context("cuda", cuda_stream=torch.cuda.current_stream(), seed=5) as ctx:
        batch = flashspec.VerifyBatch(dev(offsets), dev(drafts), dev(hidden), temperatures=dev(temps),
                                      steps=dev(steps))
        got = ctx.verify_and_finalize(ctx.lm_head(dev(w)), batch)
        assert got.accepted_counts.is_cuda and got.emitted_tokens.is_cuda
        ctx.synchronize()
    np.testing.assert_array_equal(got.accepted_counts.cpu().numpy(), want.accepted_counts)
    np.testing.assert_array_equal(got.emitted_tokens.cpu().numpy(), want.emitted_tokens)
    np.testing.assert_array_equal(got.next_steps.cpu().numpy().astype(np.uint64), steps + 1)


def test_torch_sparse_stochastic_tree_on_device_matches_cpu():
    """A tree of stochastic drafts with sparse q in device arrays: the same
    emitted tokens and path as the CPU backend, and a short support array
    refused before the library reads it."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal((V, D)).astype(np.float32)
    parents = np.array([-1, -1, 0, 0, 1, -1, 0], np.int32)  # request 0: 5 nodes, request 1: 2
    offsets = np.array([0, 5, 7], np.int32)
    hidden = rng.standard_normal((9, D)).astype(np.float32)
    support_offsets, support_tokens, support_probs, drafts = [0], [], [], []
    for _ in range(7):
        tokens = rng.choice(V, size=6, replace=False).astype(np.int32)
        probs = rng.dirichlet(np.ones(6)).astype(np.float32)
        support_tokens += list(tokens)
        support_probs += list(probs)
        support_offsets.append(len(support_tokens))
        drafts.append(tokens[rng.integers(0, 6)])
    arrays = dict(draft_parents=parents, draft_support_offsets=np.array(support_offsets, np.int32),
                  draft_support_tokens=np.array(support_tokens, np.int32),
                  draft_support_probs=np.array(support_probs, np.float32))
    drafts = np.array(drafts, np.int32)
    temps = np.array([1.0, 0.8], np.float32)
    with flashspec.Context("cpu", seed=8) as ctx:
        want = ctx.verify_and_finalize(ctx.lm_head(w), flashspec.VerifyBatch(
            offsets, drafts, hidden, temperatures=temps, **arrays))
    dev = lambda a: torch.from_numpy(a).cuda()  # noqa: E731
    with flashspec.Context("cuda", cuda_stream=torch.cuda.current_stream(), seed=8) as ctx:
        head = ctx.lm_head(dev(w))
        batch = flashspec.VerifyBatch(dev(offsets), dev(drafts), dev(hidden), temperatures=dev(temps),
                                      **{k: dev(v) for k, v in arrays.items()})
        got = ctx.verify_and_finalize(head, batch)
        ctx.synchronize()
        short = dict(arrays, draft_support_tokens=arrays["draft_support_tokens"][:-1])
        with pytest.raises(ValueError, match="draft_support_tokens has 41 entries"):
            ctx.verify_and_finalize(head, flashspec.VerifyBatch(dev(offsets), dev(drafts), dev(hidden),
                                                                **{k: dev(v) for k, v in short.items()}))
    np.testing.assert_array_equal(got.accepted_counts.cpu().numpy(), want.accepted_counts)
    np.testing.assert_array_equal(got.emitted_tokens.cpu().numpy(), want.emitted_tokens)


def test_torch_controls_on_device_match_cpu():
    """Sampling controls with device index arrays: host values (scalars, a
    bias dict, a bool mask) are copied to the device, per-request device
    arrays are taken as they are; verify and draft give the CPU backend's
    tokens and logprobs."""
    rng = np.random.default_rng(21)
    w = rng.standard_normal((V, D)).astype(np.float32)
    offsets = np.array([0, 3, 4, 6], np.int32)
    hidden = rng.standard_normal((9, D)).astype(np.float32)
    drafts = rng.integers(0, V, 6).astype(np.int32)
    temps = np.array([0.8, 0.0, 1.0], np.float32)
    mask = rng.random((9, V)) < 0.7
    top_p = np.array([0.95, 0.9, 0.8], np.float32)
    dev = lambda a: torch.from_numpy(a).cuda()  # noqa: E731

    def controls(top_p_array):
        return flashspec.SamplingControls(top_k=40, top_p=top_p_array, min_p=0.05,
                                          logit_bias={int(drafts[0]): 2.0, 7: -1.0}, token_mask=mask)

    with flashspec.Context("cpu", seed=3) as ctx:
        head = ctx.lm_head(w)
        want = ctx.verify_and_finalize(head, flashspec.VerifyBatch(
            offsets, drafts, hidden, temperatures=temps, controls=controls(top_p), logprobs=True))
        want_draft = ctx.draft(head, hidden, temperature=0.7, controls=flashspec.SamplingControls(
            top_k=20, min_p=0.1, token_mask=mask))
    with flashspec.Context("cuda", cuda_stream=torch.cuda.current_stream(), seed=3) as ctx:
        head = ctx.lm_head(dev(w))
        for given in (top_p, dev(top_p)):
            batch = flashspec.VerifyBatch(dev(offsets), dev(drafts), dev(hidden), temperatures=dev(temps),
                                          controls=controls(given), logprobs=True)
            got = ctx.verify_and_finalize(head, batch)
            ctx.synchronize()
            np.testing.assert_array_equal(got.accepted_counts.cpu().numpy(), want.accepted_counts)
            np.testing.assert_array_equal(got.emitted_tokens.cpu().numpy(), want.emitted_tokens)
            np.testing.assert_allclose(got.logprobs.cpu().numpy(), want.logprobs, atol=1e-4, equal_nan=True)
        tokens, _ = ctx.draft(head, dev(hidden), temperature=0.7, controls=flashspec.SamplingControls(
            top_k=20, min_p=0.1, token_mask=mask))
        ctx.synchronize()
        # The bias as device CSR arrays: bias_offsets[R] is read back to size the lists.
        bias = {int(drafts[0]): 2.0, 7: -1.0}  # every request's, as logit_bias above
        per = len(bias)
        csr = flashspec.SamplingControls(
            top_k=40, top_p=dev(top_p), min_p=0.05, token_mask=mask,
            bias_offsets=dev(np.arange(0, 3 * per + 1, per, dtype=np.int32)),
            bias_tokens=dev(np.array(list(bias) * 3, np.int32)),
            bias_values=dev(np.array(list(bias.values()) * 3, np.float32)))
        got = ctx.verify_and_finalize(head, flashspec.VerifyBatch(
            dev(offsets), dev(drafts), dev(hidden), temperatures=dev(temps), controls=csr, logprobs=True))
        ctx.synchronize()
        short = flashspec.SamplingControls(bias_offsets=dev(np.array([0, 2, 2, 2], np.int32)),
                                           bias_tokens=dev(np.array([7], np.int32)),
                                           bias_values=dev(np.array([1.0], np.float32)))
        with pytest.raises(ValueError, match="bias_tokens has 1 entries"):
            ctx.verify_and_finalize(head, flashspec.VerifyBatch(dev(offsets), dev(drafts), dev(hidden),
                                                                controls=short))
    np.testing.assert_array_equal(tokens.cpu().numpy(), want_draft[0])
    np.testing.assert_array_equal(got.emitted_tokens.cpu().numpy(), want.emitted_tokens)
    np.testing.assert_allclose(got.logprobs.cpu().numpy(), want.logprobs, atol=1e-4, equal_nan=True)


def test_cupy_draft_through_cuda_array_interface_and_dlpack():
    cupy = _cupy()
    w, h = inputs(4)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        wc, hc = cupy.asarray(w), cupy.asarray(h)
        with flashspec.Context("cuda", cuda_stream=stream, seed=99) as ctx:
            head = ctx.lm_head(wc)
            tokens, _ = ctx.draft(head, hc)
            assert isinstance(tokens, cupy.ndarray)
            # The same rows through the CUDA array interface alone.
            class CaiOnly:
                __cuda_array_interface__ = hc.__cuda_array_interface__
            out = cupy.empty(6, dtype=cupy.int32)
            ctx.draft(head, CaiOnly(), tokens_out=out)
            ctx.synchronize()
    want, _ = cpu_draft(w, h)
    assert_tokens_match(cupy.asnumpy(tokens), want, w, h)
    np.testing.assert_array_equal(cupy.asnumpy(out), cupy.asnumpy(tokens))


def test_device_arrays_of_the_wrong_dtype_are_refused_not_copied():
    wt = torch.zeros((V, D), dtype=torch.float64, device="cuda")
    with flashspec.Context("cuda") as ctx:
        with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
            ctx.lm_head(wt)


def test_device_rows_on_a_cpu_context_are_a_device_mismatch():
    w, h = inputs(5)
    with flashspec.Context("cpu") as ctx:
        head = ctx.lm_head(w)
        with pytest.raises(flashspec.DeviceMismatchError):
            ctx.draft(head, torch.from_numpy(h).cuda(), tokens_out=np.empty(6, np.int32),
                      scores_out=np.empty(6, np.float32))
