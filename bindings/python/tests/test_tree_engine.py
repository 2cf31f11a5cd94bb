"""Tree steps from Python: a tree drafter whose right child comes after a
decoy, a target whose forward runs the tree (each node's row from its path:
its own token and its parent's), with target_keep and without; at T = 0 the
engines emit the target's greedy tokens."""
import numpy as np
import pytest

import flashspec

V = 16
PROMPT = [3, 1, 4, 1]


def next_token(context):
    """The target's greedy next token after ..., a, b."""
    a = context[-2] if len(context) > 1 else 0
    return (3 * context[-1] + a + 1) % V


def greedy(n):
    context = list(PROMPT)
    for _ in range(n):
        context.append(next_token(context))
    return context[len(PROMPT):]


def decoy_tree(context, max_nodes):
    """Per level a decoy (with a child of its own), then the right token,
    whose subtree is the next level."""
    tokens, parents, path, parent = [], [], [int(t) for t in context], -1
    while len(tokens) + 3 <= max_nodes:
        right = next_token(path)
        decoy = (right + 5) % V
        base = len(tokens)
        tokens += [decoy, (decoy + 1) % V, right]
        parents += [parent, base, parent]
        parent = base + 2
        path.append(right)
    return tokens, parents


def rows(cache, tokens, parents, num_rows):
    """Token t's context: the cache, then its path through the call
    (parents[t], or t - 1); its row is the one-hot of the next token."""
    out = np.zeros((num_rows, V), dtype=np.float32)
    for r, t in enumerate(range(len(tokens) - num_rows, len(tokens))):
        path, i = [], t
        while i >= 0:
            path.append(int(tokens[i]))
            i = int(parents[i]) if parents is not None and parents[i] >= 0 else i - 1
        out[r, next_token(list(cache) + path[::-1])] = 1.0
    return out


@pytest.fixture
def setup():
    with flashspec.Context("cpu", seed=5, cpu_threads=1, max_rows=64, max_requests=4) as ctx:
        head = ctx.lm_head(4.0 * np.eye(V, dtype=np.float32))
        yield ctx, head


@pytest.mark.parametrize("with_keep", [True, False])
def test_greedy_tree_engine_equals_greedy_decoding(setup, with_keep):
    ctx, head = setup
    host = {"cache": [], "tree_forwards": 0, "keeps": 0}

    def forward(tokens, num_past, num_rows, parents):
        assert num_past <= len(host["cache"])
        cache = host["cache"][:num_past]
        out = rows(cache, tokens, parents, num_rows)
        host["cache"] = cache + [int(t) for t in tokens]
        host["tree_forwards"] += parents is not None
        return out

    def keep(num_past, indices):
        cache = host["cache"]
        host["cache"] = cache[:num_past] + [cache[num_past + int(i)] for i in indices]
        host["keeps"] += 1

    drafter = flashspec.CallbackDrafter(ctx, decoy_tree, tree=True)
    with flashspec.Engine(ctx, head, forward, with_parents=True, target_keep=keep if with_keep else None,
                          drafters=[drafter], arms=[(drafter, 9)], policy="fixed") as engine:
        result = engine.generate(PROMPT, temperature=0.0, max_tokens=30)
        metrics = engine.metrics()
    assert result.tokens == greedy(30)
    # Right children below decoys were accepted: paths deeper than one.
    assert metrics.accepted_tokens > metrics.steps
    assert host["tree_forwards"] == metrics.drafts
    assert (host["keeps"] > 0) == with_keep
    drafter.close()


def test_a_forward_without_parents_refuses_a_tree_step(setup):
    ctx, head = setup
    drafter = flashspec.CallbackDrafter(ctx, decoy_tree, tree=True)
    with flashspec.Engine(ctx, head, lambda tokens, num_past, num_rows: rows([], tokens, None, num_rows),
                          drafters=[drafter], default_draft_len=6) as engine:
        with pytest.raises(flashspec.CallbackError, match="with_parents"):
            engine.generate(PROMPT, temperature=0.0, max_tokens=8)
    drafter.close()


def test_bad_parent_is_a_callback_error_naming_the_node(setup):
    ctx, head = setup
    drafter = flashspec.CallbackDrafter(ctx, lambda context, k: ([1, 2, 3], [-1, 0, 2]), tree=True)
    with flashspec.Engine(ctx, head, lambda tokens, num_past, num_rows, parents: rows([], tokens, parents, num_rows),
                          with_parents=True, drafters=[drafter], default_draft_len=6) as engine:
        with pytest.raises(flashspec.CallbackError, match="node 2: parent 2"):
            engine.generate(PROMPT, temperature=0.0, max_tokens=8)
    drafter.close()


def test_batched_tree_sequences_equal_greedy_decoding(setup):
    ctx, head = setup
    caches, keeps = {}, []

    def forward(call):
        out = []
        for s, sid in enumerate(call.sequence_ids):
            sid = int(sid)
            cache = caches.get(sid, [])[:int(call.num_past[s])]
            out.append(rows(cache, call.tokens_of(s), call.parents_of(s), call.rows_of(s)))
            caches[sid] = cache + [int(t) for t in call.tokens_of(s)]
        return np.concatenate(out)

    def keep(sid, num_past, indices):
        cache = caches[sid]
        caches[sid] = cache[:num_past] + [cache[num_past + int(i)] for i in indices]
        keeps.append(sid)

    drafters = [flashspec.CallbackDrafter(ctx, decoy_tree, tree=True) for _ in range(2)]
    with flashspec.BatchEngine(ctx, head, forward, target_keep=keep, num_drafters=1, arms=[(0, 9)],
                               policy="fixed") as batch:
        for sid, drafter in enumerate(drafters):
            batch.add_sequence(sid, PROMPT, drafters=[drafter], temperature=0.0, max_tokens=20 + sid)
        batch.run()
        for sid in range(2):
            state = batch.sequence(sid)
            assert state.error is None and state.tokens == greedy(20 + sid)
    assert keeps
    for drafter in drafters:
        drafter.close()
