"""Vocabulary shards through the Python binding (CPU backend): ranks are
simulated in one process, each with the head of its slice (a view of one
weight matrix), the records gathered into one [ranks, rows, 48] array, as
torch.distributed's all_gather_into_tensor would. A sharded verify emits
what the unsharded one does and sharded drafts equal unsharded drafts;
records the library would overrun, or could not write in place, are refused
before the call; malformed gathers surface the library's error."""
import numpy as np
import pytest

import flashspec

V, D = 200, 16
B = flashspec.SHARD_RECORD_BYTES
VERSION_OFFSET = 32  # the int32 version field of a record (flashspec.h's layout)

# 1, 2, 3 and 5 ranks, cut unevenly (slices of 1 and of 199 tokens too).
CUTS = [(0, V), (0, 37, V), (0, 1, 150, V), (0, 13, 14, 90, 171, V)]


@pytest.fixture
def ctx():
    with flashspec.Context("cpu", seed=4321, cpu_threads=2, max_rows=256, max_requests=64) as c:
        yield c


@pytest.fixture
def weights():
    return np.random.default_rng(11).standard_normal((V, D)).astype(np.float32)


def shard_heads(ctx, weights, cut):
    return [ctx.lm_head_shard(weights[begin:end], begin, V) for begin, end in zip(cut, cut[1:])]


def gather_verify(ctx, heads, batch, rows):
    records = np.empty((len(heads), rows, B), np.uint8)
    for rank, head in enumerate(heads):
        ctx.verify_shard(head, batch, records[rank])
    return records


def gather_draft(ctx, heads, hidden, **params):
    records = np.empty((len(heads), len(hidden), B), np.uint8)
    for rank, head in enumerate(heads):
        ctx.draft_shard(head, hidden, records[rank], **params)
    return records


def argmax_rows(weights, hidden):
    return (np.asarray(hidden, np.float64) @ np.asarray(weights, np.float64).T).argmax(axis=1)


def ragged_batch(weights, rng, requests, *, tree, temperatures):
    """A batch of `requests` requests with 0..4 drafts each: three drafts in
    four are the target argmax of the row that scores them (so many are
    accepted), the rest random. Trees get random parents."""
    lengths = rng.integers(0, 5, requests)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    rows = int(offsets[-1]) + requests
    hidden = (3.0 * rng.standard_normal((rows, D))).astype(np.float32)
    argmax = argmax_rows(weights, hidden)
    parents, drafts = [], []
    for r, n in enumerate(lengths):
        base = int(offsets[r]) + r
        for j in range(n):
            parent = int(rng.integers(-1, j)) if tree and j > 0 else j - 1
            parents.append(parent)
            drafts.append(int(argmax[base + parent + 1]) if rng.random() < 0.75 else int(rng.integers(V)))
    batch = flashspec.VerifyBatch(offsets, np.array(drafts, np.int32), hidden, temperatures=temperatures,
                                  steps=np.full(requests, 3, np.uint64),
                                  draft_parents=np.array(parents, np.int32) if tree else None)
    return batch, offsets, hidden, rows


def greedy_tree_walk(weights, hidden, offsets, drafts, parents, r):
    """T = 0 tree verify by hand (flashspec.h, "Tree verify"): from the root,
    y = the argmax of the current node's row; descend into the first child
    with token y, else emit y and stop. Returns (tokens, node indices)."""
    start, n, base = int(offsets[r]), int(offsets[r + 1] - offsets[r]), int(offsets[r]) + r
    argmax = argmax_rows(weights, hidden[base:base + n + 1])
    node, tokens, nodes = -1, [], []
    while True:
        y = int(argmax[node + 1])
        child = next((k for k in range(n) if parents[start + k] == node and drafts[start + k] == y), None)
        tokens.append(y)
        if child is None:
            return tokens, nodes
        nodes.append(child)
        node = child


# ---- heads ------------------------------------------------------------------
def test_record_constants_are_the_headers():
    assert flashspec.SHARD_RECORD_BYTES == 48 and flashspec.SHARD_RECORD_VERSION == 1


def test_shard_heads_know_their_slice(ctx, weights):
    whole = ctx.lm_head(weights)
    assert (whole.vocab_begin, whole.global_vocab_size, whole.vocab_size) == (0, V, V)
    heads = shard_heads(ctx, weights, CUTS[3])
    assert [(h.vocab_begin, h.vocab_size, h.global_vocab_size) for h in heads] == [
        (0, 13, V), (13, 1, V), (14, 76, V), (90, 81, V), (171, 29, V)]


def test_bad_slices_and_misused_shard_heads_are_refused(ctx, weights):
    with pytest.raises(flashspec.OutOfRangeError):
        ctx.lm_head_shard(weights[:100], 150, V)  # past the vocabulary
    with pytest.raises(flashspec.OutOfRangeError):
        ctx.lm_head_shard(weights[:100], -1, V)
    with pytest.raises(ValueError, match="give both"):
        flashspec.LMHead(ctx, weights, vocab_begin=0)
    shard = ctx.lm_head_shard(weights[:50], 0, V)
    hidden = np.ones((3, D), np.float32)
    tokens = np.full(3, 77, np.int32)
    with pytest.raises(flashspec.InvalidArgumentError, match="head"):
        ctx.draft(shard, hidden, tokens_out=tokens)
    assert (tokens == 77).all()
    with pytest.raises(flashspec.InvalidArgumentError, match="head"):
        ctx.verify_and_finalize(shard, flashspec.VerifyBatch([0, 2], [1, 2], hidden))


# ---- sharded == unsharded -----------------------------------------------------
@pytest.mark.parametrize("cut", CUTS, ids=lambda c: f"{len(c) - 1}ranks")
@pytest.mark.parametrize("temperature", [0.0, 0.8, "mixed"])
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_sharded_verify_emits_the_unsharded_tokens(ctx, weights, cut, temperature, tree):
    rng = np.random.default_rng(len(cut) * 10 + tree)
    requests = 24
    temperatures = (np.where(np.arange(requests) % 2, 0.0, 1.1) if temperature == "mixed"
                    else np.full(requests, temperature)).astype(np.float32)
    batch, _, _, rows = ragged_batch(weights, rng, requests, tree=tree, temperatures=temperatures)
    whole = ctx.verify_and_finalize(ctx.lm_head(weights), batch)
    accepted = np.asarray(whole.accepted_counts)
    assert accepted.sum() > 0, "no draft accepted: the comparison would miss the acceptance test"

    records = gather_verify(ctx, shard_heads(ctx, weights, cut), batch, rows)
    sharded = ctx.finalize_shards(batch, records)
    np.testing.assert_array_equal(sharded.accepted_counts, whole.accepted_counts)
    np.testing.assert_array_equal(sharded.emitted_tokens, whole.emitted_tokens)
    np.testing.assert_array_equal(sharded.next_steps, whole.next_steps)
    assert (sharded.accepted_nodes is None) == (not tree)
    if tree:
        np.testing.assert_array_equal(sharded.accepted_nodes, whole.accepted_nodes)
    # The flat per-shard layout, [ranks, rows * 48], reads the same bytes.
    flat = ctx.finalize_shards(batch, records.reshape(len(cut) - 1, rows * B))
    np.testing.assert_array_equal(flat.emitted_tokens, whole.emitted_tokens)


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_sharded_greedy_verify_is_greedy_decoding(ctx, weights, tree):
    """An independent reference: at T = 0 the sharded result is the numpy
    argmax walk (along the chain, or down the tree)."""
    rng = np.random.default_rng(5)
    requests = 16
    batch, offsets, hidden, rows = ragged_batch(weights, rng, requests, tree=tree,
                                                temperatures=np.zeros(requests, np.float32))
    drafts = np.asarray(batch._inputs["draft_tokens"])
    parents = (np.asarray(batch.draft_parents) if tree
               else np.concatenate([np.arange(-1, n - 1) for n in np.diff(offsets)]).astype(np.int32))
    result = ctx.finalize_shards(batch, gather_verify(ctx, shard_heads(ctx, weights, CUTS[2]), batch, rows))
    depth = 0
    for r in range(requests):
        tokens, nodes = greedy_tree_walk(weights, hidden, offsets, drafts, parents, r)
        assert result.tokens(r) == tokens, f"request {r}"
        depth = max(depth, len(nodes))
        if tree:
            slots = np.asarray(result.accepted_nodes)[int(offsets[r]) + r:][:len(nodes)]
            assert slots.tolist() == nodes
    assert depth >= 2, "no path went two nodes deep: the walk would not test the tree"


def test_a_wrong_slice_changes_the_tokens(ctx, weights):
    """The comparisons above can fail: a rank holding other weights for its
    slice (same tiling, so the records are well-formed) emits other tokens."""
    rng = np.random.default_rng(8)
    requests = 24
    batch, _, _, rows = ragged_batch(weights, rng, requests, tree=False,
                                     temperatures=np.zeros(requests, np.float32))
    whole = ctx.verify_and_finalize(ctx.lm_head(weights), batch)
    wrong = weights.copy()
    wrong[37:] = np.random.default_rng(9).standard_normal((V - 37, D))
    records = gather_verify(ctx, shard_heads(ctx, wrong, CUTS[1]), batch, rows)
    sharded = ctx.finalize_shards(batch, records)
    assert not np.array_equal(sharded.emitted_tokens, whole.emitted_tokens)


@pytest.mark.parametrize("cut", CUTS, ids=lambda c: f"{len(c) - 1}ranks")
def test_sharded_greedy_drafts_equal_unsharded_drafts(ctx, weights, cut):
    hidden = np.random.default_rng(12).standard_normal((9, D)).astype(np.float32)
    tokens, scores = ctx.draft(ctx.lm_head(weights), hidden)
    np.testing.assert_array_equal(tokens, argmax_rows(weights, hidden))
    records = gather_draft(ctx, shard_heads(ctx, weights, cut), hidden)
    sharded_tokens, sharded_scores = ctx.draft_from_shards(records)
    np.testing.assert_array_equal(sharded_tokens, tokens)
    np.testing.assert_allclose(sharded_scores, scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cut", CUTS, ids=lambda c: f"{len(c) - 1}ranks")
def test_sharded_sampled_drafts_equal_unsharded_drafts(ctx, weights, cut):
    rows = 12
    hidden = np.random.default_rng(13).standard_normal((rows, D)).astype(np.float32)
    params = dict(temperatures=np.where(np.arange(rows) % 3, 0.9, 0.0).astype(np.float32),
                  seeds=np.arange(rows, dtype=np.uint64) + 5, request_ids=np.arange(rows, dtype=np.uint64) % 4,
                  steps=np.arange(rows, dtype=np.uint64), positions=(np.arange(rows) % 3).astype(np.int32))
    tokens, scores = ctx.draft(ctx.lm_head(weights), hidden, **params)
    assert not np.array_equal(tokens, argmax_rows(weights, hidden)), "sampling drew only argmaxes"
    records = gather_draft(ctx, shard_heads(ctx, weights, cut), hidden, **params)
    out_tokens, out_scores = np.full(rows, -7, np.int32), np.zeros(rows, np.float32)
    sharded_tokens, sharded_scores = ctx.draft_from_shards(records, tokens_out=out_tokens, scores_out=out_scores,
                                                           **params)
    assert sharded_tokens is out_tokens and sharded_scores is out_scores
    np.testing.assert_array_equal(sharded_tokens, tokens)
    np.testing.assert_allclose(sharded_scores, scores, rtol=1e-5, atol=1e-5)
    # The scalar temperature of the call, too.
    tokens, _ = ctx.draft(ctx.lm_head(weights), hidden, temperature=1.3, seeds=params["seeds"])
    records = gather_draft(ctx, shard_heads(ctx, weights, cut), hidden, temperature=1.3, seeds=params["seeds"])
    np.testing.assert_array_equal(ctx.draft_from_shards(records, temperature=1.3, seeds=params["seeds"])[0], tokens)


# ---- records the binding refuses before the call -------------------------------
def small_batch(weights):
    hidden = np.random.default_rng(3).standard_normal((3, D)).astype(np.float32)
    return flashspec.VerifyBatch([0, 2], [5, 6], hidden, temperatures=[0.0]), hidden


def bad_records(rows):
    """(label, records, error) per kind of array the library must not be
    handed: each is a view into a larger sentinel buffer, so a write past
    its end (or anywhere) would show."""
    buffer = np.full(4 * rows * B, 0xAB, np.uint8)
    read_only = buffer[:rows * B]
    read_only = read_only.view()
    read_only.setflags(write=False)
    return buffer, [
        ("one byte short", buffer[:rows * B - 1], ValueError),
        ("one row short", buffer[:(rows - 1) * B].reshape(rows - 1, B), ValueError),
        ("rows of 47 bytes", buffer[:rows * 47 + 47].reshape(rows + 1, 47), ValueError),
        ("strided", buffer[:2 * rows * B].reshape(rows, 2 * B)[:, ::2], ValueError),
        ("read-only", read_only, ValueError),
        ("int8", buffer[:rows * B].view(np.int8), TypeError),
        ("float32", buffer[:rows * B].view(np.float32), TypeError),
    ]


@pytest.mark.parametrize("case", range(7))
def test_verify_shard_refuses_records_it_cannot_fill(ctx, weights, case):
    batch, _ = small_batch(weights)
    head = ctx.lm_head_shard(weights[:100], 0, V)
    buffer, cases = bad_records(3)
    label, records, error = cases[case]
    with pytest.raises(error, match="records"):
        ctx.verify_shard(head, batch, records)
    assert (buffer == 0xAB).all(), f"{label}: the records were written"


@pytest.mark.parametrize("case", range(7))
def test_draft_shard_refuses_records_it_cannot_fill(ctx, weights, case):
    head = ctx.lm_head_shard(weights[100:], 100, V)
    hidden = np.ones((3, D), np.float32)
    buffer, cases = bad_records(3)
    label, records, error = cases[case]
    with pytest.raises(error, match="records"):
        ctx.draft_shard(head, hidden, records, temperature=0.5)
    assert (buffer == 0xAB).all(), f"{label}: the records were written"


def test_records_of_the_right_size_are_written_in_place(ctx, weights):
    """The positive side of the checks above: flat, [rows, 48], and the
    first rows of a longer array."""
    batch, hidden = small_batch(weights)
    head = ctx.lm_head_shard(weights[:100], 0, V)
    for records in (np.zeros(3 * B, np.uint8), np.zeros((3, B), np.uint8), np.zeros((5, B), np.uint8)):
        ctx.verify_shard(head, batch, records)
        versions = records.reshape(-1)[:3 * B].reshape(3, B)[:, VERSION_OFFSET:VERSION_OFFSET + 4]
        assert (versions.copy().view("<i4") == flashspec.SHARD_RECORD_VERSION).all()
        assert (records.reshape(-1)[3 * B:] == 0).all(), "wrote past the batch's rows"
        ctx.draft_shard(head, hidden, records)
        assert (records.reshape(-1)[3 * B:] == 0).all(), "wrote past the hidden rows"


class DLPackOnly:
    """A host array seen only through DLPack (as a CPU torch tensor is)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


class CudaArrayInterfaceOnly:
    """What a CUDA array interface producer (cupy, numba) describes; the
    address is never read, as the arrays are refused before the call."""

    def __init__(self, array, typestr):
        self.__cuda_array_interface__ = {"shape": array.shape, "typestr": typestr,
                                         "data": (array.__array_interface__["data"][0], False), "version": 3}


def test_records_through_dlpack_are_uint8_views(ctx, weights):
    batch, hidden = small_batch(weights)
    heads = shard_heads(ctx, weights, CUTS[1])
    want = gather_verify(ctx, heads, batch, 3)
    got = np.zeros_like(want)
    for rank, head in enumerate(heads):
        ctx.verify_shard(head, batch, DLPackOnly(got[rank]))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ctx.finalize_shards(batch, DLPackOnly(got)).emitted_tokens,
                                  ctx.finalize_shards(batch, want).emitted_tokens)
    with pytest.raises(TypeError, match="records: expected a uint8"):
        ctx.verify_shard(heads[0], batch, DLPackOnly(np.zeros((3, 12), np.float32)))


def test_device_records_for_a_host_call_are_refused(ctx, weights):
    batch, hidden = small_batch(weights)
    head = ctx.lm_head_shard(weights[:100], 0, V)
    buffer = np.full((3, B), 0xAB, np.uint8)
    with pytest.raises(ValueError, match="records must live in host memory, like the batch's index arrays"):
        ctx.verify_shard(head, batch, CudaArrayInterfaceOnly(buffer, "|u1"))
    with pytest.raises(ValueError, match="records must live in host memory, like the per-row arrays"):
        ctx.draft_shard(head, hidden, CudaArrayInterfaceOnly(buffer, "|u1"), seeds=[1, 2, 3])
    with pytest.raises(TypeError, match="records: expected a uint8"):
        ctx.verify_shard(head, batch, CudaArrayInterfaceOnly(buffer.view(np.int32), "<i4"))
    with pytest.raises(ValueError, match="records must live in host memory"):
        ctx.finalize_shards(batch, CudaArrayInterfaceOnly(np.zeros((2, 3, B), np.uint8), "|u1"))
    assert (buffer == 0xAB).all()


def sentinel_result(rows, requests):
    return flashspec.VerifyResult(np.full(requests, 77, np.int32), np.full(rows, 77, np.int32),
                                  np.full(requests, 77, np.uint64))


def assert_untouched(result):
    for array in (result.accepted_counts, result.emitted_tokens, result.next_steps):
        assert (np.asarray(array) == 77).all()


def test_finalize_shards_checks_the_gathered_size_exactly(ctx, weights):
    batch, _ = small_batch(weights)
    heads = shard_heads(ctx, weights, CUTS[1])
    records = gather_verify(ctx, heads, batch, 3)
    result = sentinel_result(3, 1)
    extra_row = np.zeros((2, 4, B), np.uint8)
    extra_row[:, :3] = records
    cases = [(extra_row, ValueError, "4 records per shard"),
             (np.ascontiguousarray(records[:, :2]), ValueError, "2 records per shard"),
             (records.reshape(2, 3 * B)[:, :-1].copy(), ValueError, "shape"),
             (records.reshape(6, B), ValueError, "1 records per shard"),
             (records.reshape(1, 2, 3, B), ValueError, "shape"),
             (records.view(np.int8), TypeError, "uint8"),
             (records.reshape(-1).view(np.float32).reshape(2, 3, 12), TypeError, "uint8")]
    for bad, error, message in cases:
        with pytest.raises(error, match="records") as info:
            ctx.finalize_shards(batch, bad, out=result)
        assert message in str(info.value)
        assert_untouched(result)
    # A strided host input is read through a contiguous copy.
    strided = np.zeros((2, 3, 2 * B), np.uint8)
    strided[:, :, ::2] = records
    ctx.finalize_shards(batch, strided[:, :, ::2], out=result)
    np.testing.assert_array_equal(result.emitted_tokens, ctx.finalize_shards(batch, records).emitted_tokens)


def test_draft_from_shards_checks_records_and_outputs(ctx, weights):
    hidden = np.ones((3, D), np.float32)
    records = gather_draft(ctx, shard_heads(ctx, weights, CUTS[1]), hidden)
    tokens, scores = np.full(3, 77, np.int32), np.full(3, 77, np.float32)
    for bad, error in ((records.reshape(2, 3 * B)[:, 1:].copy(), ValueError), (records.view(np.int8), TypeError),
                       (records.reshape(-1), ValueError)):
        with pytest.raises(error, match="records"):
            ctx.draft_from_shards(bad, tokens_out=tokens, scores_out=scores)
    with pytest.raises(ValueError, match="tokens_out has 2 entries, fewer than the 3 rows"):
        ctx.draft_from_shards(records, tokens_out=tokens[:2], scores_out=scores)
    with pytest.raises(ValueError, match="temperatures has 1 entries"):
        ctx.draft_from_shards(records, temperatures=[1.0], tokens_out=tokens, scores_out=scores)
    assert (tokens == 77).all() and (scores == 77).all()


# ---- malformed gathers: the library's error ------------------------------------
def malformed(records):
    versioned = records.copy()
    versioned[1, 2, VERSION_OFFSET:VERSION_OFFSET + 4] = np.frombuffer(
        np.int32(flashspec.SHARD_RECORD_VERSION + 1).tobytes(), np.uint8)
    return {"another version": versioned,
            "ranks out of order": np.ascontiguousarray(records[::-1]),
            "a rank missing": np.ascontiguousarray(records[:2]),
            "a rank twice": np.ascontiguousarray(records[[0, 1, 1, 2]])}


def test_finalize_shards_refuses_malformed_gathers(ctx, weights):
    batch, _ = small_batch(weights)
    records = gather_verify(ctx, shard_heads(ctx, weights, CUTS[2]), batch, 3)
    result = sentinel_result(3, 1)
    for label, bad in malformed(records).items():
        with pytest.raises(flashspec.InvalidArgumentError) as info:
            ctx.finalize_shards(batch, bad, out=result)
        assert info.value.message.startswith("records"), (label, info.value.message)
        assert_untouched(result)
    assert ctx.finalize_shards(batch, records, out=result) is result  # the well-formed gather is accepted


def test_draft_from_shards_refuses_malformed_gathers(ctx, weights):
    hidden = np.random.default_rng(4).standard_normal((3, D)).astype(np.float32)
    records = gather_draft(ctx, shard_heads(ctx, weights, CUTS[2]), hidden)
    tokens, scores = np.full(3, 77, np.int32), np.full(3, 77, np.float32)
    for label, bad in malformed(records).items():
        with pytest.raises(flashspec.InvalidArgumentError) as info:
            ctx.draft_from_shards(bad, tokens_out=tokens, scores_out=scores)
        assert info.value.message.startswith("records"), (label, info.value.message)
        assert (tokens == 77).all() and (scores == 77).all()


def test_calls_needing_a_second_exchange_are_unsupported(ctx, weights):
    _, hidden = small_batch(weights)
    head = ctx.lm_head_shard(weights[:100], 0, V)
    records = np.zeros((3, B), np.uint8)
    stochastic = flashspec.VerifyBatch([0, 2], [5, 6], hidden, draft_logits=np.zeros((2, V), np.float32))
    with pytest.raises(flashspec.UnsupportedError, match="draft_logits"):
        ctx.verify_shard(head, stochastic, records)
    with pytest.raises(flashspec.UnsupportedError, match="logprobs"):
        ctx.verify_shard(head, flashspec.VerifyBatch([0, 2], [5, 6], hidden, logprobs=True), records)


# ---- tree verify on a whole head --------------------------------------------------
def test_tree_result_arrays(ctx, weights):
    """VerifyResult.like allocates accepted_nodes for a tree batch only; a
    given one must hold a slot per target row."""
    rng = np.random.default_rng(6)
    tree, offsets, hidden, rows = ragged_batch(weights, rng, 6, tree=True, temperatures=np.zeros(6, np.float32))
    chain, _, _, _ = ragged_batch(weights, rng, 6, tree=False, temperatures=np.zeros(6, np.float32))
    assert flashspec.VerifyResult.like(chain).accepted_nodes is None
    assert np.asarray(flashspec.VerifyResult.like(tree).accepted_nodes).shape == (rows,)
    head = ctx.lm_head(weights)
    result = ctx.verify_and_finalize(head, tree)
    drafts, parents = np.asarray(tree._inputs["draft_tokens"]), np.asarray(tree.draft_parents)
    for r in range(6):
        tokens, nodes = greedy_tree_walk(weights, hidden, offsets, drafts, parents, r)
        assert result.tokens(r) == tokens
    out = flashspec.VerifyResult(np.zeros(6, np.int32), np.zeros(rows, np.int32),
                                 accepted_nodes=np.full(rows - 1, 77, np.int32))
    with pytest.raises(ValueError, match=f"accepted_nodes has {rows - 1} entries"):
        ctx.verify_and_finalize(head, tree, out=out)
    with pytest.raises(ValueError, match="draft_parents has 1 entries"):
        flashspec.VerifyBatch([0, 2], [5, 6], hidden[:3], draft_parents=[-1]).c_batch(0)
    with pytest.raises(flashspec.OutOfRangeError, match="draft_parents"):
        ctx.verify_and_finalize(head, flashspec.VerifyBatch([0, 2], [5, 6], hidden[:3], draft_parents=[-1, 1]))
