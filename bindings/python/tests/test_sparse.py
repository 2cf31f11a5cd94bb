"""Sparse draft distributions and stochastic trees through the Python
binding (CPU backend): a sparse chain given as a tree emits what it emits
as a chain, token for token; a stochastic tree's accepted path is a path of
the tree; support arrays the library would read past their end are refused
before the call, and the library's own checks surface as its errors."""
import numpy as np
import pytest

import flashspec

V, D = 50, 8


@pytest.fixture
def ctx():
    with flashspec.Context("cpu", seed=99, cpu_threads=2, max_rows=256, max_requests=64) as c:
        yield c


@pytest.fixture
def head(ctx):
    weights = np.random.default_rng(3).standard_normal((V, D)).astype(np.float32)
    return ctx.lm_head(weights)


def sparse_chain(rng, requests, length, k=4):
    """Chains of `length` drafts per request, each drawn from a random top-k q."""
    offsets = np.arange(requests + 1, dtype=np.int32) * length
    tokens, support_offsets, support_tokens, support_probs = [], [0], [], []
    for _ in range(requests * length):
        support = rng.choice(V, size=k, replace=False).astype(np.int32)
        probs = rng.dirichlet(np.ones(k)).astype(np.float32)
        tokens.append(int(rng.choice(support, p=probs / probs.sum())))
        support_tokens.extend(support)
        support_probs.extend(probs)
        support_offsets.append(len(support_tokens))
    hidden = rng.standard_normal((requests * (length + 1), D)).astype(np.float32)
    return dict(offsets=offsets, tokens=np.array(tokens, np.int32), hidden=hidden,
                support=(np.array(support_offsets, np.int32), np.array(support_tokens, np.int32),
                         np.array(support_probs, np.float32)))


def batch_of(chain, **kw):
    so, st, sp = chain["support"]
    return flashspec.VerifyBatch(chain["offsets"], chain["tokens"], chain["hidden"], temperatures=[1.0] * (len(chain["offsets"]) - 1),
                                 draft_support_offsets=so, draft_support_tokens=st, draft_support_probs=sp, **kw)


def test_sparse_chain_as_tree_equals_chain(ctx, head):
    chain = sparse_chain(np.random.default_rng(5), requests=6, length=3)
    parents = np.tile(np.array([-1, 0, 1], np.int32), 6)
    as_chain = ctx.verify_and_finalize(head, batch_of(chain))
    as_tree = ctx.verify_and_finalize(head, batch_of(chain, draft_parents=parents))
    np.testing.assert_array_equal(np.asarray(as_chain.accepted_counts), np.asarray(as_tree.accepted_counts))
    np.testing.assert_array_equal(np.asarray(as_chain.emitted_tokens), np.asarray(as_tree.emitted_tokens))
    assert np.asarray(as_chain.accepted_counts).sum() > 0


def test_stochastic_tree_path_is_a_path_of_the_tree(ctx, head):
    rng = np.random.default_rng(8)
    # One request: three root candidates (the last repeats the first), each with one child.
    parents = np.array([-1, -1, -1, 0, 1, 2], np.int32)
    for trial in range(20):
        chain = sparse_chain(rng, requests=1, length=6)
        tokens = chain["tokens"]
        so, st, sp = chain["support"]
        tokens[2] = tokens[0]  # siblings may repeat a token; row 2 gets row 0's support
        st[so[2]:so[3]], sp[so[2]:so[3]] = st[so[0]:so[1]], sp[so[0]:so[1]]
        batch = batch_of(chain, draft_parents=parents, request_ids=[trial])
        result = ctx.verify_and_finalize(head, batch)
        depth = int(np.asarray(result.accepted_counts)[0])
        nodes = np.asarray(result.accepted_nodes)[:depth]
        emitted = np.asarray(result.emitted_tokens)
        node_parent = -1
        for k, node in enumerate(nodes):
            assert parents[node] == node_parent
            assert tokens[node] == emitted[k]
            node_parent = node
        assert (emitted[depth + 1:] == -1).all()


def test_support_arrays_are_checked_before_the_call(ctx, head):
    chain = sparse_chain(np.random.default_rng(1), requests=2, length=2)
    so, st, sp = chain["support"]
    with pytest.raises(ValueError, match="draft_support_offsets has 4 entries"):
        ctx.verify_and_finalize(head, batch_of(dict(chain, support=(so[:-1], st, sp))))
    with pytest.raises(ValueError, match="draft_support_tokens has 15 entries"):
        ctx.verify_and_finalize(head, batch_of(dict(chain, support=(so, st[:-1], sp))))
    with pytest.raises(ValueError, match="draft_support_probs has 15 entries"):
        ctx.verify_and_finalize(head, batch_of(dict(chain, support=(so, st, sp[:-1]))))
    so_big = so.copy()
    so_big[-1] += 1
    with pytest.raises(ValueError, match="draft_support_tokens has 16 entries, fewer than draft_support_offsets"):
        ctx.verify_and_finalize(head, batch_of(dict(chain, support=(so_big, st, sp))))
    with pytest.raises(ValueError, match="draft_support_probs: needed with draft_support_offsets"):
        flashspec.VerifyBatch(chain["offsets"], chain["tokens"], chain["hidden"], draft_support_offsets=so,
                              draft_support_tokens=st).c_batch(0)


def test_library_refusals_surface(ctx, head):
    chain = sparse_chain(np.random.default_rng(2), requests=1, length=2)
    so, st, sp = chain["support"]
    repeated = st.copy()
    repeated[1] = repeated[0]
    with pytest.raises(flashspec.errors.InvalidArgumentError, match="names token .* twice"):
        ctx.verify_and_finalize(head, batch_of(dict(chain, support=(so, repeated, sp))))
    off_sum = sp.copy()
    off_sum[0] += 0.1
    with pytest.raises(flashspec.errors.InvalidArgumentError, match="draft_support_probs"):
        ctx.verify_and_finalize(head, batch_of(dict(chain, support=(so, st, off_sum))))
    wide = np.array([0, flashspec.MAX_DRAFT_SUPPORT + 1, flashspec.MAX_DRAFT_SUPPORT + 5], np.int32)
    with pytest.raises(flashspec.errors.OutOfRangeError, match="support tokens, expected 1..64"):
        ctx.verify_and_finalize(head, batch_of(dict(chain, support=(wide, np.arange(69, dtype=np.int32) % V,
                                                                      np.full(69, 2 / 69, np.float32)))))
