"""The speculative engine from Python: a synthetic target model (a fixed
random LM head; the hidden row after a context is a fixed random embedding
of its last token), greedy decoding computed in numpy as the reference,
drafters good and bad, failing callbacks, cancellation and metrics."""
import ctypes
import gc
import threading

import numpy as np
import pytest

import flashspec

V, D = 48, 16
PROMPT = [3, 17, 5, 3, 17]


class Model:
    """The target: W [V, d], hidden row of a context = E[its last token]. The
    'KV cache' is the token list; it checks the engine's num_past/rollback
    bookkeeping and raises on any inconsistency."""

    def __init__(self, seed=11):
        rng = np.random.default_rng(seed)
        self.W = rng.standard_normal((V, D)).astype(np.float32)
        self.E = rng.standard_normal((V, D)).astype(np.float32)
        self.cache = []
        self.forwards = 0
        self.rollbacks = []

    def forward(self, tokens, num_past, num_rows):
        assert tokens.dtype == np.int32 and 1 <= num_rows <= len(tokens)
        if num_past > len(self.cache):
            raise AssertionError(f"num_past {num_past} beyond the cache of {len(self.cache)}")
        self.cache = self.cache[:num_past] + [int(t) for t in tokens]
        self.forwards += 1
        return self.E[np.array(self.cache[len(self.cache) - num_rows:])]

    def rollback(self, num_keep):
        if num_keep > len(self.cache):
            raise AssertionError(f"rollback to {num_keep} beyond the cache of {len(self.cache)}")
        self.rollbacks.append(num_keep)
        self.cache = self.cache[:num_keep]

    def greedy(self, prompt, n):
        """Plain greedy decoding in float64; also asserts no near-tie, so an
        fp32 accumulation difference cannot flip a token."""
        seq, out = list(prompt), []
        for _ in range(n):
            logits = self.E[seq[-1]].astype(np.float64) @ self.W.astype(np.float64).T
            top2 = np.sort(logits)[-2:]
            assert top2[1] - top2[0] > 1e-3, "near-tie in the reference: pick another seed"
            seq.append(int(np.argmax(logits)))
            out.append(seq[-1])
        return out


@pytest.fixture
def ctx():
    with flashspec.Context("cpu", seed=5, cpu_threads=2, max_rows=32, max_requests=4) as c:
        yield c


@pytest.fixture
def model():
    return Model()


def random_drafter(ctx, seed=0):
    """Proposes random tokens: mostly rejected, so rollbacks are exercised."""
    rng = np.random.default_rng(seed)
    return flashspec.CallbackDrafter(ctx, lambda context, k: rng.integers(0, V, size=k))


def check_metrics(m, generation):
    assert m.steps == generation.steps and m.emitted_tokens == len(generation.tokens)
    assert m.accepted_tokens <= m.draft_tokens
    assert m.drafts == (m.position_drafted[0] if m.position_drafted else 0)
    assert sum(m.position_drafted) == m.draft_tokens and sum(m.position_accepted) == m.accepted_tokens
    for j in range(len(m.position_drafted)):
        assert m.position_accepted[j] <= m.position_drafted[j]
        if j:
            assert m.position_drafted[j] <= m.position_drafted[j - 1]
            assert m.position_accepted[j] <= m.position_accepted[j - 1]
    assert sum(a.pulls for a in m.arms) == m.steps
    assert sum(a.draft_tokens for a in m.arms) == m.draft_tokens
    assert sum(a.accepted_tokens for a in m.arms) == m.accepted_tokens
    if m.draft_tokens:
        assert m.acceptance_rate == pytest.approx(m.accepted_tokens / m.draft_tokens)
    assert m.tokens_per_step == pytest.approx(m.emitted_tokens / m.steps)
    assert 0 < m.step_latency_p50_us <= m.step_latency_p99_us
    assert m.as_dict()["steps"] == m.steps


def test_greedy_generation_equals_numpy_greedy_decoding(ctx, model):
    head = ctx.lm_head(model.W)
    ngram = flashspec.NgramDrafter(ctx, min_n=1, max_n=3)
    noise = random_drafter(ctx)
    engine = flashspec.Engine(ctx, head, model.forward, target_rollback=model.rollback, drafters=[ngram, noise],
                              arms=[(ngram, 2), (ngram, 6), (noise, 3), (None, 0)], target_row_cost=0.05)
    streamed = []
    tokens, reason, steps = engine.generate(PROMPT, temperature=0.0, seed=9, max_tokens=60,
                                            on_token=streamed.append)
    assert tokens == model.greedy(PROMPT, 60)
    assert streamed == tokens and reason == flashspec.FinishReason.LENGTH
    assert model.rollbacks, "the random drafter never had a draft rejected"
    m = engine.metrics()
    check_metrics(m, flashspec.Generation(tokens, reason, steps))
    assert m.steps < 60, "the n-gram drafter should have made some steps emit several tokens"
    assert [(a.drafter, a.draft_len) for a in m.arms] == [(0, 2), (0, 6), (1, 3), (-1, 0)]
    # The same generation again (the engine resets per generation) and after reset_metrics.
    engine.reset_metrics()
    assert engine.metrics().steps == 0
    assert engine.generate(PROMPT, temperature=0, max_tokens=60).tokens == tokens


def test_a_perfect_drafter_has_every_draft_accepted(ctx, model):
    reference = model.greedy(PROMPT, 40)

    def oracle(context, k):
        done = len(context) - len(PROMPT)
        return reference[done:done + k]

    head = ctx.lm_head(model.W)
    engine = flashspec.Engine(ctx, head, model.forward, drafters=[flashspec.CallbackDrafter(ctx, oracle)],
                              default_draft_len=4)
    g = engine.generate(PROMPT, temperature=0, max_tokens=40)
    assert g.tokens == reference
    m = engine.metrics()
    check_metrics(m, g)
    assert m.acceptance_rate == 1.0 and m.position_acceptance == (1.0,) * 4
    assert g.steps == 8 and m.tokens_per_step == 5.0  # 4 drafts + 1 bonus per step


def test_stochastic_drafts_with_logits(ctx, model):
    """A drafter that samples from its own logits: at T = 0 the output is still
    greedy decoding; at T > 0 the same seed gives the same tokens."""
    rng_w = np.random.default_rng(3).standard_normal((V, D)).astype(np.float32)

    def sampler(seed):
        rng = np.random.default_rng(seed)

        def draft(context, k):
            rows, tokens, last = [], [], context[-1]
            for _ in range(min(k, 3)):
                logits = (model.E[last] @ (model.W + 0.5 * rng_w).T).astype(np.float32)
                p = np.exp(logits - logits.max())
                last = int(rng.choice(V, p=p / p.sum()))
                tokens.append(last)
                rows.append(logits)
            return tokens, np.stack(rows)
        return draft

    head = ctx.lm_head(model.W)
    drafter = flashspec.CallbackDrafter(ctx, sampler(1), logits=True, draft_temperature=1.0)
    engine = flashspec.Engine(ctx, head, model.forward, target_rollback=model.rollback, drafters=[drafter])
    assert engine.generate(PROMPT, temperature=0, max_tokens=30).tokens == model.greedy(PROMPT, 30)
    assert engine.metrics().draft_tokens > 0
    engine.close()
    drafter.close()

    runs = []
    for _ in range(2):
        d = flashspec.CallbackDrafter(ctx, sampler(2), logits=True)
        with flashspec.Engine(ctx, head, Model().forward, drafters=[d]) as e:
            runs.append(e.generate(PROMPT, temperature=0.8, seed=77, max_tokens=25))
        d.close()
    assert runs[0] == runs[1] and len(runs[0].tokens) == 25


@pytest.mark.parametrize("where", ["target forward", "target rollback", "draft callback", "token callback"])
def test_a_raising_callback_fails_the_call_and_the_engine_stays_usable(ctx, model, where):
    reference = model.greedy(PROMPT, 30)
    calls = {"n": 0}

    class Boom(Exception):
        pass

    def maybe_raise(name):
        if name == where and state["armed"]:
            calls["n"] += 1
            if calls["n"] == 3:
                raise Boom(f"{name} exploded")

    state = {"armed": True}

    def forward(tokens, num_past, num_rows):
        maybe_raise("target forward")
        return model.forward(tokens, num_past, num_rows)

    def rollback(num_keep):
        maybe_raise("target rollback")
        model.rollback(num_keep)

    rng = np.random.default_rng(4)

    def draft(context, k):
        maybe_raise("draft callback")
        return rng.integers(0, V, size=k)  # rejected drafts: rollbacks happen

    def on_token(token):
        maybe_raise("token callback")

    head = ctx.lm_head(model.W)
    engine = flashspec.Engine(ctx, head, forward, target_rollback=rollback,
                              drafters=[flashspec.CallbackDrafter(ctx, draft)])
    with pytest.raises(flashspec.CallbackError) as info:
        engine.generate(PROMPT, temperature=0, max_tokens=30, on_token=on_token)
    e = info.value
    assert isinstance(e.__cause__, Boom) and where in str(e.__cause__)
    assert e.status_name == "FLASHSPEC_ERR_CALLBACK" and where in e.message and "Boom" in e.message
    assert e.tokens == reference[:len(e.tokens)]
    assert e.finish_reason in (flashspec.FinishReason.NONE, flashspec.FinishReason.HOST_STOP)

    state["armed"] = False
    g = engine.generate(PROMPT, temperature=0, max_tokens=30, on_token=on_token)
    assert g.tokens == reference and g.finish_reason == flashspec.FinishReason.LENGTH


def test_bad_callback_results_are_callback_errors(ctx, model):
    head = ctx.lm_head(model.W)
    wrong_width = flashspec.Engine(ctx, head, lambda t, p, n: np.zeros((n, D + 1), np.float32))
    with pytest.raises(flashspec.CallbackError, match="columns"):
        wrong_width.generate(PROMPT, max_tokens=4)
    wrong_rows = flashspec.Engine(ctx, head, lambda t, p, n: np.zeros((n + 1, D), np.float32))
    with pytest.raises(flashspec.CallbackError, match="rows"):
        wrong_rows.generate(PROMPT, max_tokens=4)
    too_many = flashspec.CallbackDrafter(ctx, lambda context, k: [0] * (k + 1))
    engine = flashspec.Engine(ctx, head, model.forward, drafters=[too_many])
    with pytest.raises(flashspec.CallbackError) as info:
        engine.generate(PROMPT, max_tokens=4)
    assert isinstance(info.value.__cause__, ValueError)
    out_of_vocab = flashspec.CallbackDrafter(ctx, lambda context, k: [V])
    engine = flashspec.Engine(ctx, head, model.forward, drafters=[out_of_vocab])
    with pytest.raises(flashspec.CallbackError, match="token"):
        engine.generate(PROMPT, max_tokens=4)
    nan_rows = flashspec.Engine(ctx, head, lambda t, p, n: np.full((n, D), np.nan, np.float32))
    with pytest.raises(flashspec.NonFiniteError):
        nan_rows.generate(PROMPT, max_tokens=4)


def test_bad_arguments_raise_the_status_exception(ctx, model):
    head = ctx.lm_head(model.W)
    engine = flashspec.Engine(ctx, head, model.forward)
    with pytest.raises(flashspec.OutOfRangeError, match="prompt"):
        engine.generate([V], max_tokens=4)
    with pytest.raises(flashspec.InvalidArgumentError, match="temperature"):
        engine.generate(PROMPT, temperature=-1.0)
    with pytest.raises(flashspec.OutOfRangeError):
        flashspec.NgramDrafter(ctx, min_n=0)
    with pytest.raises(ValueError, match="policy"):
        flashspec.Engine(ctx, head, model.forward, policy="greedy")
    with pytest.raises(flashspec.OutOfRangeError):
        flashspec.Engine(ctx, head, model.forward, arms=[(0, 2)])  # no drafter 0
    with pytest.raises(flashspec.NullPointerError, match="oracle_rewards"):
        flashspec.Engine(ctx, head, model.forward, policy="oracle")


def test_oracle_rewards_need_one_entry_per_arm(ctx, model, monkeypatch):
    head = ctx.lm_head(model.W)
    created = []
    real_create = flashspec.capi.flashspec_engine_create
    monkeypatch.setattr(flashspec.capi, "flashspec_engine_create",
                        lambda *args: created.append(1) or real_create(*args))
    drafters = [flashspec.NgramDrafter(ctx), flashspec.NgramDrafter(ctx)]
    arms = [(drafters[0], 2), (drafters[1], 3), (None, 0)]
    rewards = np.array([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="oracle_rewards has 2 entries, fewer than the 3 arms") as info:
        flashspec.Engine(ctx, head, model.forward, drafters=drafters, arms=arms, policy="oracle",
                         oracle_rewards=rewards[:2])
    assert not isinstance(info.value, flashspec.FlashSpecError) and not created
    with pytest.raises(ValueError, match="oracle_rewards has 1 entries, fewer than the 2 arms"):
        flashspec.Engine(ctx, head, model.forward, drafters=drafters, policy="oracle", oracle_rewards=[1.0])
    assert not created
    engine = flashspec.Engine(ctx, head, model.forward, drafters=drafters, arms=arms, policy="oracle",
                              oracle_rewards=rewards)
    assert created
    tokens, _, _ = engine.generate(PROMPT, temperature=0, max_tokens=4)
    assert len(tokens) == 4
    engine.close()


def test_stop_tokens_host_stop_and_cancel(ctx, model):
    reference = model.greedy(PROMPT, 40)
    head = ctx.lm_head(model.W)
    ngram = flashspec.NgramDrafter(ctx)
    engine = flashspec.Engine(ctx, head, model.forward, target_rollback=model.rollback, drafters=[ngram])

    stop = reference[7]
    g = engine.generate(PROMPT, temperature=0, max_tokens=40, stop_tokens=[stop])
    assert g.finish_reason == flashspec.FinishReason.STOP_TOKEN
    assert g.tokens == reference[:reference.index(stop) + 1]

    g = engine.generate(PROMPT, temperature=0, max_tokens=40, on_token=lambda t: t == reference[4])
    assert g.finish_reason == flashspec.FinishReason.HOST_STOP
    assert g.tokens == reference[:reference.index(reference[4]) + 1]

    seen = []

    def cancel_after_three(token):
        seen.append(token)
        if len(seen) == 3:
            engine.cancel()

    with pytest.raises(flashspec.CancelledError) as info:
        engine.generate(PROMPT, temperature=0, max_tokens=40, on_token=cancel_after_three)
    assert info.value.finish_reason == flashspec.FinishReason.CANCELLED
    assert info.value.tokens == reference[:len(info.value.tokens)] and len(info.value.tokens) >= 3
    # Each generation starts uncancelled.
    assert engine.generate(PROMPT, temperature=0, max_tokens=40).tokens == reference


def test_cancel_from_another_thread(ctx, model):
    head = ctx.lm_head(model.W)
    started, release = threading.Event(), threading.Event()

    def slow_forward(tokens, num_past, num_rows):
        started.set()
        release.wait(10)
        return model.forward(tokens, num_past, num_rows)

    engine = flashspec.Engine(ctx, head, slow_forward)
    errors = []

    def run():
        try:
            engine.generate(PROMPT, temperature=0, max_tokens=1000)
        except flashspec.FlashSpecError as e:
            errors.append(e)

    worker = threading.Thread(target=run)
    worker.start()
    assert started.wait(10)
    engine.cancel()
    release.set()
    worker.join(10)
    assert not worker.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], flashspec.CancelledError)
    assert 1 <= len(errors[0].tokens) < 1000


def test_nested_generate_is_refused(ctx, model):
    head = ctx.lm_head(model.W)
    nested = []

    def on_token(token):
        if not nested:
            with pytest.raises(flashspec.InvalidArgumentError, match="already generating") as info:
                engine.generate(PROMPT, max_tokens=2)
            nested.append(info.value)

    engine = flashspec.Engine(ctx, head, model.forward)
    g = engine.generate(PROMPT, temperature=0, max_tokens=5, on_token=on_token)
    assert nested and g.tokens == model.greedy(PROMPT, 5)


@pytest.mark.parametrize("policy,extra", [("thompson", {"bandit_seed": 3}), ("fixed", {"fixed_arm": 1}),
                                          ("oracle", {"oracle_rewards": [0.1, 2.0]})])
def test_policies(ctx, model, policy, extra):
    head = ctx.lm_head(model.W)
    ngram = flashspec.NgramDrafter(ctx)
    engine = flashspec.Engine(ctx, head, model.forward, target_rollback=model.rollback, drafters=[ngram],
                              arms=[(None, 0), (ngram, 3)], policy=policy, **extra)
    g = engine.generate(PROMPT, temperature=0, max_tokens=30)
    assert g.tokens == model.greedy(PROMPT, 30)
    m = engine.metrics()
    check_metrics(m, g)
    if policy != "thompson":
        assert m.arms[0].pulls == 0 and m.arms[1].pulls == m.steps


def test_callback_struct_layout_matches_the_library(ctx, model):
    from flashspec import _engine
    sizes = {}
    real_check = _engine._check_struct

    def recording_check(call, struct, name):
        sizes[name] = (call.struct_size, ctypes.sizeof(struct))
        real_check(call, struct, name)

    _engine._check_struct = recording_check
    try:
        head = ctx.lm_head(model.W)
        engine = flashspec.Engine(ctx, head, model.forward,
                                  drafters=[flashspec.CallbackDrafter(ctx, lambda c, k: [1])])
        engine.generate(PROMPT, max_tokens=3)
    finally:
        _engine._check_struct = real_check
    assert sizes["target forward"][0] == sizes["target forward"][1]
    assert sizes["draft callback"][0] == sizes["draft callback"][1]


def test_lifetimes(model):
    ctx = flashspec.Context("cpu", max_rows=16)
    head = ctx.lm_head(model.W)
    ngram = flashspec.NgramDrafter(ctx)
    engine = flashspec.Engine(ctx, head, model.forward, drafters=[ngram])
    with pytest.raises(ValueError, match="close the engine first"):
        ngram.close()
    with pytest.raises(flashspec.InvalidArgumentError):
        flashspec.Engine(ctx, head, model.forward, drafters=[ngram])  # serves another engine
    # Closing the context closes the engine, then the drafter, then the head.
    ctx.close()
    assert engine.closed and ngram.closed and head.closed
    with pytest.raises(ValueError, match="closed"):
        engine.generate(PROMPT)
    engine.cancel()  # a no-op once closed
    # Collected together, a drafter may be finalized before its engine: the
    # engine then destroys it after releasing it.
    ctx = flashspec.Context("cpu", max_rows=16)
    head = ctx.lm_head(model.W)
    ngram = flashspec.NgramDrafter(ctx)
    engine = flashspec.Engine(ctx, head, model.forward, drafters=[ngram])
    ngram.__del__()
    assert not ngram.closed
    engine.close()
    assert ngram.closed
    ctx.close()
    # Dropping every reference frees the engine and its trampolines.
    ctx = flashspec.Context("cpu", max_rows=16)
    head = ctx.lm_head(model.W)
    engine = flashspec.Engine(ctx, head, Model().forward, drafters=[flashspec.NgramDrafter(ctx)])
    assert len(engine.generate(PROMPT, max_tokens=5).tokens) == 5
    del engine
    gc.collect()
    ctx.close()


# ---- the suffix drafter and the adaptive draft length ------------------------------
def test_suffix_drafter_and_adaptive_k_equal_greedy_decoding(ctx, model):
    head = ctx.lm_head(model.W)
    expected = model.greedy(PROMPT, 60)
    for rule in ("arm", "adaptive"):
        suffix = flashspec.SuffixDrafter(ctx, max_depth=8, min_probability=0.2, cache_max_tokens=256)
        noise = random_drafter(ctx, seed=3)
        model.cache = []
        with flashspec.Engine(ctx, head, model.forward, target_rollback=model.rollback, drafters=[suffix, noise],
                              arms=[(suffix, 6), (noise, 3), (None, 0)], draft_len_rule=rule) as engine:
            first = engine.generate(PROMPT, max_tokens=60, temperature=0.0)
            assert list(first.tokens) == expected
            check_metrics(engine.metrics(), first)
            # The second generation also drafts from the first one's output.
            second = engine.generate(PROMPT, max_tokens=60, temperature=0.0)
            assert list(second.tokens) == expected
        suffix.close()
        noise.close()


def test_suffix_drafter_proposes_trees(ctx):
    suffix = flashspec.SuffixDrafter(ctx, max_match_len=1, max_depth=2, min_probability=0.0)
    tokens, parents = suffix.propose_tree([5, 1, 5, 2, 5, 3, 5], 3)
    assert tokens.dtype == np.int32 and parents.dtype == np.int32
    assert sorted(tokens.tolist()) == [1, 2, 3] and parents.tolist() == [-1, -1, -1]
    tokens, parents = suffix.propose_tree([5, 1, 5, 2, 5, 3, 5], 8)
    assert len(tokens) == len(parents) <= 8
    for i, p in enumerate(parents):
        assert -1 <= p < i
    siblings = {(int(p), int(t)) for p, t in zip(parents, tokens)}
    assert len(siblings) == len(tokens)  # no repeated token among siblings
    empty_tokens, empty_parents = suffix.propose_tree([5, 1, 5, 2, 5, 3, 5], 0)
    assert len(empty_tokens) == 0 and len(empty_parents) == 0
    suffix.close()


def test_suffix_drafter_and_draft_len_rule_bad_input(ctx, model):
    with pytest.raises(flashspec.OutOfRangeError, match="params->max_depth"):
        flashspec.SuffixDrafter(ctx, max_depth=0)
    with pytest.raises(flashspec.OutOfRangeError, match="params->min_probability"):
        flashspec.SuffixDrafter(ctx, min_probability=1.5)
    with pytest.raises(flashspec.OutOfRangeError, match="params->cache_max_tokens"):
        flashspec.SuffixDrafter(ctx, cache_max_tokens=-1)
    suffix = flashspec.SuffixDrafter(ctx)
    with pytest.raises(ValueError, match="max_nodes"):
        suffix.propose_tree([1, 2, 3], -1)
    with pytest.raises(flashspec.OutOfRangeError, match="context_len"):
        suffix.propose_tree([], 4)
    with pytest.raises(flashspec.OutOfRangeError, match="context"):
        suffix.propose_tree([1, -2, 3], 4)
    with pytest.raises(TypeError):
        suffix.propose_tree([1.5, 2.0], 4)
    head = ctx.lm_head(model.W)
    with pytest.raises(ValueError, match="draft_len_rule"):
        flashspec.Engine(ctx, head, model.forward, drafters=[suffix], draft_len_rule="sometimes")
    with pytest.raises(flashspec.InvalidArgumentError, match="params->draft_len_memory"):
        flashspec.Engine(ctx, head, model.forward, drafters=[suffix], draft_len_rule="adaptive", draft_len_memory=0.5)
    suffix.close()


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_drafter_the_library_refused_is_finalized_quietly(ctx):
    for make in (lambda: flashspec.SuffixDrafter(ctx, max_depth=0), lambda: flashspec.NgramDrafter(ctx, min_n=0)):
        with pytest.raises(flashspec.OutOfRangeError):
            make()
        gc.collect()  # the half-built object's __del__ runs here
