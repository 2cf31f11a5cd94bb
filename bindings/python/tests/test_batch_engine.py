"""The batched engine from Python, against the single-sequence engine on the
synthetic target of test_engine.py (hidden row of a context = E[its last
token]): every sequence emits what a fresh Engine.generate emits for it, at
T = 0 and T > 0, sequences joining mid-run; one sequence's raising callback
ends that sequence alone; a raising target forward fails the step, which is
then repeated; bad input gets the status's exception, the engine unchanged."""
import gc

import numpy as np
import pytest

import flashspec
from test_engine import D, PROMPT, V, Model

PROMPTS = {11: PROMPT, 22: [9, 1, 9, 1, 9], 2 ** 64 - 1: [40, 2]}
ARMS = [(0, 2), (0, 5), (1, 3), (None, 0)]


class BatchHost:
    """One KV cache of tokens per sequence id; checks the ragged protocol."""

    def __init__(self, model):
        self.model = model
        self.caches = {}
        self.batch_sizes = []
        self.rollbacks = 0

    def forward(self, call):
        assert isinstance(call, flashspec.BatchForward)
        assert call.token_offsets[0] == 0 and call.row_offsets[0] == 0
        assert call.tokens.dtype == np.int32 and call.sequence_ids.dtype == np.uint64
        self.batch_sizes.append(len(call.sequence_ids))
        rows = []
        for s, seq_id in enumerate(call.sequence_ids):
            cache = self.caches.setdefault(int(seq_id), [])
            past = int(call.num_past[s])
            assert past <= len(cache), f"num_past {past} beyond the cache of {len(cache)}"
            cache[past:] = [int(t) for t in call.tokens_of(s)]
            n = call.rows_of(s)
            assert 1 <= n <= len(call.tokens_of(s))
            rows.append(self.model.E[np.array(cache[len(cache) - n:])])
        hidden = np.concatenate(rows)
        assert hidden.shape == (call.num_rows, D)
        return hidden

    def rollback(self, sequence_id, num_keep):
        cache = self.caches[sequence_id]
        assert num_keep <= len(cache)
        del cache[num_keep:]
        self.rollbacks += 1


def hash_drafter(ctx, fail=None):
    """Proposes pseudo-random tokens, a function of the context alone, so a
    fresh copy in a single engine proposes the same; ``fail(context)`` may
    raise."""
    def draft(context, k):
        if fail is not None:
            fail(context)
        rng = np.random.default_rng(int(np.sum(context * np.arange(1, len(context) + 1))))
        return rng.integers(0, V, size=k)
    return flashspec.CallbackDrafter(ctx, draft)


def drafters(ctx, fail=None):
    return [flashspec.NgramDrafter(ctx, max_n=3), hash_drafter(ctx, fail)]


def single_engine_tokens(ctx, head, model, prompt, **generate):
    """What a fresh Engine with the same arms and drafters emits."""
    ds = drafters(ctx)
    with flashspec.Engine(ctx, head, Model().forward, drafters=ds,
                          arms=[(None if d is None else ds[d], k) for d, k in ARMS], bandit_seed=5) as engine:
        tokens = engine.generate(prompt, **generate).tokens
    for d in ds:
        d.close()
    return tokens


@pytest.fixture
def ctx():
    with flashspec.Context("cpu", seed=5, cpu_threads=2, max_rows=64, max_requests=8) as c:
        yield c


@pytest.fixture
def model():
    return Model()


def make_engine(ctx, head, host, **kw):
    return flashspec.BatchEngine(ctx, head, host.forward, target_rollback=host.rollback, num_drafters=2, arms=ARMS,
                                 bandit_seed=5, **kw)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_each_sequence_equals_its_single_engine_run(ctx, model, temperature):
    head = ctx.lm_head(model.W)
    host = BatchHost(model)
    engine = make_engine(ctx, head, host)
    budgets = {11: 30, 22: 25, 2 ** 64 - 1: 20}
    streamed = {i: [] for i in PROMPTS}
    ids = list(PROMPTS)

    def add(i):
        engine.add_sequence(i, PROMPTS[i], drafters=drafters(ctx), temperature=temperature, seed=3,
                            request_id=i % 1000, max_tokens=budgets[i],
                            on_token=lambda seq, tok: streamed[seq].append(tok))

    add(ids[0])
    add(ids[1])
    assert engine.step() == 2 and engine.step() == 2
    add(ids[2])  # joins mid-run
    engine.run()
    assert engine.sequence_ids == tuple(ids)
    assert max(host.batch_sizes) == 3, "the sequences never shared a forward"
    assert host.rollbacks, "no draft was ever rejected"
    total = 0
    for i in ids:
        state = engine.sequence(i)
        expected = single_engine_tokens(ctx, head, model, PROMPTS[i], temperature=temperature, seed=3,
                                        request_id=i % 1000, max_tokens=budgets[i])
        assert state.tokens == expected and streamed[i] == expected
        if temperature == 0:
            assert expected == model.greedy(PROMPTS[i], budgets[i])
        assert not state.active and state.error is None
        assert state.finish_reason == flashspec.FinishReason.LENGTH
        m = engine.metrics(i)
        assert m.steps == state.steps and m.emitted_tokens == budgets[i] and m.arms == ()
        total += m.steps
    m = engine.metrics()
    assert m.steps == total and m.emitted_tokens == sum(budgets.values())
    assert sum(a.pulls for a in m.arms) == m.steps and [(a.drafter, a.draft_len) for a in m.arms] == \
        [(0, 2), (0, 5), (1, 3), (-1, 0)]
    assert m.position_drafted == () and m.position_accepted == ()


def test_stop_tokens_and_host_stop_end_one_sequence(ctx, model):
    head = ctx.lm_head(model.W)
    engine = make_engine(ctx, head, BatchHost(model))
    reference = {i: model.greedy(PROMPTS[i], 30) for i in PROMPTS}
    a, b, c = PROMPTS
    engine.add_sequence(a, PROMPTS[a], drafters=drafters(ctx), temperature=0, max_tokens=30,
                        stop_tokens=[reference[a][6]])
    engine.add_sequence(b, PROMPTS[b], drafters=drafters(ctx), temperature=0, max_tokens=30,
                        on_token=lambda seq, tok: len(engine.sequence(seq).tokens) >= 4)
    engine.add_sequence(c, PROMPTS[c], drafters=drafters(ctx), temperature=0, max_tokens=30)
    engine.run()
    sa, sb, sc = (engine.sequence(i) for i in PROMPTS)
    assert sa.finish_reason == flashspec.FinishReason.STOP_TOKEN
    assert sa.tokens == reference[a][:reference[a].index(reference[a][6]) + 1]
    assert sb.finish_reason == flashspec.FinishReason.HOST_STOP and sb.tokens == reference[b][:len(sb.tokens)]
    assert sc.finish_reason == flashspec.FinishReason.LENGTH and sc.tokens == reference[c]


class Boom(Exception):
    pass


@pytest.mark.parametrize("where", ["draft callback", "token callback"])
def test_a_raising_sequence_callback_ends_that_sequence_alone(ctx, model, where):
    head = ctx.lm_head(model.W)
    engine = make_engine(ctx, head, BatchHost(model))
    failing, others = 22, [11, 2 ** 64 - 1]
    reference = {i: model.greedy(PROMPTS[i], 25) for i in PROMPTS}

    def fail_draft(context):
        if len(context) > len(PROMPTS[failing]) + 5:
            raise Boom("draft exploded")

    def fail_token(seq, token):
        if len(engine.sequence(seq).tokens) >= 5:
            raise Boom("token exploded")

    for i in PROMPTS:
        mine = i == failing
        engine.add_sequence(i, PROMPTS[i], drafters=drafters(ctx, fail_draft if mine and where == "draft callback"
                                                               else None),
                            temperature=0, max_tokens=25,
                            on_token=fail_token if mine and where == "token callback" else None)
    engine.run()
    state = engine.sequence(failing)
    assert not state.active and state.finish_reason == flashspec.FinishReason.NONE
    assert isinstance(state.error, flashspec.CallbackError) and isinstance(state.error.__cause__, Boom)
    assert where in state.error.message and "Boom" in state.error.message
    assert 0 < len(state.tokens) < 25 and state.tokens == reference[failing][:len(state.tokens)]
    for i in others:
        s = engine.sequence(i)
        assert s.error is None and s.tokens == reference[i] and s.finish_reason == flashspec.FinishReason.LENGTH


def test_a_raising_target_forward_fails_the_step_which_is_repeated(ctx, model):
    head = ctx.lm_head(model.W)
    host = BatchHost(model)
    calls = {"n": 0}

    def forward(call):
        calls["n"] += 1
        if calls["n"] == 3:
            raise Boom("forward exploded")
        return host.forward(call)

    engine = flashspec.BatchEngine(ctx, head, forward, target_rollback=host.rollback, num_drafters=2, arms=ARMS)
    for i in PROMPTS:
        engine.add_sequence(i, PROMPTS[i], drafters=drafters(ctx), temperature=0, max_tokens=20)
    engine.step()
    engine.step()
    before = {i: engine.sequence(i).tokens for i in PROMPTS}
    with pytest.raises(flashspec.CallbackError) as info:
        engine.step()
    assert isinstance(info.value.__cause__, Boom) and "target forward" in info.value.message
    assert {i: engine.sequence(i).tokens for i in PROMPTS} == before  # no token in the failed step
    engine.run()
    for i in PROMPTS:
        assert engine.sequence(i).tokens == model.greedy(PROMPTS[i], 20)
    bad_rows = flashspec.BatchEngine(ctx, head, lambda call: np.zeros((call.num_rows + 1, D), np.float32))
    bad_rows.add_sequence(1, PROMPT, temperature=0)
    with pytest.raises(flashspec.CallbackError, match="rows"):
        bad_rows.step()


def test_bad_input_raises_the_status_exception_and_leaves_the_engine_unchanged(ctx, model):
    head = ctx.lm_head(model.W)
    engine = make_engine(ctx, head, BatchHost(model), max_sequences=2)
    engine.add_sequence(1, PROMPT, drafters=drafters(ctx), temperature=0, max_tokens=8)
    spare = drafters(ctx)
    with pytest.raises(flashspec.OutOfRangeError, match="prompt"):
        engine.add_sequence(2, [V], drafters=spare)
    with pytest.raises(flashspec.InvalidArgumentError, match="sequence_id"):
        engine.add_sequence(1, PROMPT, drafters=spare)
    with pytest.raises(flashspec.OutOfRangeError, match="num_drafters"):
        engine.add_sequence(2, PROMPT, drafters=spare[:1])
    with pytest.raises(flashspec.InvalidArgumentError, match="temperature"):
        engine.add_sequence(2, PROMPT, drafters=spare, temperature=-1.0)
    with pytest.raises(flashspec.OutOfRangeError, match="stop_tokens"):
        engine.add_sequence(2, PROMPT, drafters=spare, stop_tokens=[-1])
    logits = flashspec.CallbackDrafter(ctx, lambda c, k: ([], np.zeros((0, V), np.float32)), logits=True)
    with pytest.raises(flashspec.UnsupportedError):
        engine.add_sequence(2, PROMPT, drafters=[spare[0], logits])
    with pytest.raises(OverflowError, match="sequence_id"):
        engine.add_sequence(-1, PROMPT, drafters=spare)
    with pytest.raises(flashspec.OutOfRangeError, match="sequence_id"):
        engine.remove_sequence(99)
    with pytest.raises(flashspec.OutOfRangeError, match="sequence_id"):
        engine.sequence(99)
    with pytest.raises(flashspec.OutOfRangeError, match="sequence_id"):
        engine.metrics(99)
    assert engine.sequence_ids == (1,) and not any(d._in_use for d in spare)
    engine.add_sequence(2, PROMPT, drafters=spare, temperature=0, max_tokens=8)
    with pytest.raises(flashspec.WorkspaceExceededError):
        engine.add_sequence(3, PROMPT, drafters=drafters(ctx))
    engine.run()
    assert engine.sequence(1).tokens == engine.sequence(2).tokens == model.greedy(PROMPT, 8)
    with pytest.raises(ValueError, match="policy"):
        flashspec.BatchEngine(ctx, head, BatchHost(model).forward, policy="greedy")
    with pytest.raises(flashspec.OutOfRangeError):
        flashspec.BatchEngine(ctx, head, BatchHost(model).forward, arms=[(0, 2)])  # no drafter 0
    with pytest.raises(ValueError, match="oracle_rewards has 1 entries, fewer than the 2 arms"):
        flashspec.BatchEngine(ctx, head, BatchHost(model).forward, num_drafters=1, arms=[(0, 2), (None, 0)],
                              policy="oracle", oracle_rewards=[1.0])


def test_nested_calls_from_a_callback_are_refused(ctx, model):
    head = ctx.lm_head(model.W)
    refused = []

    def on_token(seq, token):
        if not refused:
            with pytest.raises(flashspec.InvalidArgumentError):
                engine.step()
            with pytest.raises(flashspec.InvalidArgumentError):
                engine.remove_sequence(seq)
            refused.append(seq)

    engine = flashspec.BatchEngine(ctx, head, BatchHost(model).forward)
    engine.add_sequence(4, PROMPT, temperature=0, max_tokens=6, on_token=on_token)
    engine.run()
    assert refused == [4] and engine.sequence(4).tokens == model.greedy(PROMPT, 6)


def test_lifetimes(model):
    ctx = flashspec.Context("cpu", max_rows=32)
    head = ctx.lm_head(model.W)
    engine = flashspec.BatchEngine(ctx, head, BatchHost(model).forward, num_drafters=1)
    ngram = flashspec.NgramDrafter(ctx)
    engine.add_sequence(1, PROMPT, drafters=[ngram], max_tokens=4)
    with pytest.raises(ValueError, match="close the engine first"):
        ngram.close()
    with pytest.raises(flashspec.InvalidArgumentError):
        engine.add_sequence(2, PROMPT, drafters=[ngram])  # serves sequence 1
    engine.run()
    engine.remove_sequence(1)
    assert engine.sequence_ids == ()
    engine.add_sequence(2, PROMPT, drafters=[ngram], max_tokens=4)  # free again
    # Closing the context closes the engine, then the drafter, then the head.
    ctx.close()
    assert engine.closed and ngram.closed and head.closed
    with pytest.raises(ValueError, match="closed"):
        engine.step()
    # Dropping every reference frees the engine and its trampolines.
    ctx = flashspec.Context("cpu", max_rows=32)
    engine = flashspec.BatchEngine(ctx, ctx.lm_head(model.W), BatchHost(model).forward)
    engine.add_sequence(1, PROMPT, max_tokens=3)
    engine.run()
    assert len(engine.sequence(1).tokens) == 3
    del engine
    gc.collect()
    ctx.close()


# ---- the suffix drafter and the draft length rule ----------------------------------
def noise_drafter(ctx, seed):
    """Proposes random tokens: almost always rejected."""
    rng = np.random.default_rng(seed)
    return flashspec.CallbackDrafter(ctx, lambda context, k: rng.integers(0, V, size=k))


def run_greedy_batch(ctx, model, make_drafters, n, **options):
    """Every prompt of PROMPTS to n tokens at T = 0 in one BatchEngine,
    checked against greedy decoding; returns the engine's metrics."""
    head = ctx.lm_head(model.W)
    host = BatchHost(model)
    with flashspec.BatchEngine(ctx, head, host.forward, target_rollback=host.rollback, **options) as engine:
        for i, prompt in PROMPTS.items():
            engine.add_sequence(i, prompt, drafters=make_drafters(i), temperature=0, max_tokens=n)
        engine.run()
        for i, prompt in PROMPTS.items():
            state = engine.sequence(i)
            assert state.tokens == model.greedy(prompt, n) and state.error is None
            assert state.finish_reason == flashspec.FinishReason.LENGTH
        return engine.metrics()


def test_suffix_drafter_and_adaptive_draft_len_equal_greedy_decoding(ctx, model):
    m = run_greedy_batch(ctx, model, lambda i: [flashspec.SuffixDrafter(ctx), noise_drafter(ctx, i % 97)], 40,
                         num_drafters=2, arms=[(0, 6), (1, 6), (None, 0)], draft_len_rule="adaptive",
                         draft_len_memory=16.0)
    assert m.steps < 40 * len(PROMPTS) and m.arms[0].accepted_tokens > 0


def test_draft_len_rule_reaches_the_batch_engine(ctx, model):
    """A drafter that is never right: the arm rule drafts k = 6 every step,
    the adaptive one soon stops asking it."""
    drafted = {}
    for rule in ("arm", "adaptive"):
        m = run_greedy_batch(ctx, model, lambda i: [noise_drafter(ctx, i % 97)], 60, num_drafters=1,
                             arms=[(0, 6)], policy="fixed", target_row_cost=0.1, draft_len_rule=rule)
        drafted[rule] = m.draft_tokens
    assert drafted["adaptive"] * 4 <= drafted["arm"], drafted


def test_draft_len_rule_bad_input(ctx, model):
    head = ctx.lm_head(model.W)
    forward = BatchHost(model).forward
    with pytest.raises(ValueError, match="draft_len_rule"):
        flashspec.BatchEngine(ctx, head, forward, draft_len_rule="sometimes")
    for memory in (0.5, 2e6, float("nan")):
        with pytest.raises(flashspec.InvalidArgumentError, match="params->draft_len_memory"):
            flashspec.BatchEngine(ctx, head, forward, draft_len_rule="adaptive", draft_len_memory=memory)
