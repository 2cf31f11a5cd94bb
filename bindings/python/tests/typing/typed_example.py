"""A small program over the public API of flashspec, fully annotated. The
typing test checks it with mypy --strict against the package's stubs (so a
stub that drifts from the module fails) and also runs it, so what it asserts
about the values is true at run time."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
from numpy.typing import NDArray

import flashspec


def greedy_tokens(w: NDArray[np.float32], rows: NDArray[np.float32]) -> list[int]:
    return [int(np.argmax(w @ row)) for row in rows]


def main() -> None:
    w = np.array([[1, 0], [0, 1], [-1, 0], [0, -1]], dtype=np.float32)  # [V=4, d=2]
    version: str = flashspec.version()
    assert version == flashspec.__version__ and flashspec.version_number() > 0
    assert flashspec.abi_version() == flashspec.ABI_VERSION
    assert flashspec.status_name(0) == "FLASHSPEC_OK" and isinstance(flashspec.status_string(0), str)
    assert flashspec.cuda_device_count() >= 0
    words: tuple[int, int, int, int] = flashspec.philox4x32_10((0, 0, 0, 0), (0, 0))
    assert len(words) == 4
    u: float = flashspec.rng_uniform(1, 0, 0, 0, "accept_uniform", 0)
    assert 0.0 < u < 1.0 and set(flashspec.RNG_PURPOSES) >= {"draft_noise", "bonus_noise"}
    assert flashspec.get_api(flashspec.ABI_VERSION) is not None
    assert flashspec.error_class(4) is flashspec.OutOfRangeError

    with flashspec.Context("cpu", seed=1) as ctx:
        backend: str = ctx.backend
        assert backend == "cpu"
        head: flashspec.LMHead = ctx.lm_head(w)
        assert (head.vocab_size, head.hidden_size) == (4, 2)
        tokens, scores = ctx.draft(head, np.array([[0, 3]], np.float32), temperature=0.0)
        assert tokens.tolist() == [1] and float(scores[0]) == 3.0

        batch = flashspec.VerifyBatch([0, 1], tokens, np.array([[0, 3], [-2, 0]], np.float32), temperatures=[0.0])
        result: flashspec.VerifyResult = ctx.verify_and_finalize(head, batch)
        emitted: list[int] = result.tokens(0)
        assert emitted == [1, 2]

        with ctx.summaries(max_rows=2, max_requests=1) as summaries:
            ctx.verify(head, batch, summaries)
            again = ctx.finalize(batch, summaries, out=flashspec.VerifyResult.like(batch))
            assert again.tokens(0) == emitted
        assert result.logprobs is None and result.top_tokens is None  # not asked for

        # Sampling controls. The row [0, 3] has logits [0, 3, 0, -3]: a bias
        # of -10 on token 1, then top-k 2, leave tokens 0 and 2 (logit 0 each).
        assert 2 <= flashspec.MAX_TOP_K < flashspec.TOP_K_ALL and flashspec.MAX_TOP_LOGPROBS >= 2
        biased = flashspec.SamplingControls(top_k=2, logit_bias={1: -10.0})
        controlled, _ = ctx.draft(head, np.array([[0, 3]], np.float32), controls=biased)
        assert controlled.tolist() == [0]  # the controlled argmax, ties to the smaller id

        # A mask allowing tokens 0 and 2 on both target rows: draft 1 is
        # rejected, and at T = 1 the token emitted instead is 0 or 2, each
        # with p = 1/2 under the controlled distribution.
        mask: NDArray[np.bool_] = np.array([[True, False, True, False]] * 2, dtype=np.bool_)
        hidden = np.array([[0, 3], [0, 3]], np.float32)
        logits = w @ hidden[0]
        raw_logprobs = logits - math.log(float(np.exp(logits).sum()))
        masked = flashspec.SamplingControls(token_mask=mask)
        assert masked.mask_columns == 4 and masked.token_mask is not None and masked.token_mask.shape == (2, 1)
        scored = ctx.verify_and_finalize(head, flashspec.VerifyBatch([0, 1], [1], hidden, temperatures=[1.0],
                                                                      controls=masked, logprobs=True,
                                                                      top_logprobs=2))
        (token,) = scored.tokens(0)
        assert int(scored.accepted_counts[0]) == 0 and token in (0, 2)
        logprobs: list[float] = scored.token_logprobs(0)
        assert len(logprobs) == 1 and abs(logprobs[0] - math.log(0.5)) < 1e-5
        assert abs(scored.token_logprobs(0, raw=True)[0] - float(raw_logprobs[token])) < 1e-5
        assert scored.logprobs is not None and math.isnan(float(scored.logprobs[1]))  # slot past the emitted
        # The row's two tokens of largest raw logit: 1 (3), then 0 (0, tied with 2: the smaller id).
        top: list[list[tuple[int, float]]] = scored.top(0)
        assert [t for t, _ in top[0]] == [1, 0]
        assert all(abs(p - float(raw_logprobs[t])) < 1e-5 for t, p in top[0])

        # Vocabulary shards: two ranks of two tokens each, records gathered
        # in rank order, finalized as the whole head would be.
        rows: int = 2
        records: NDArray[np.uint8] = np.empty((2, rows, flashspec.SHARD_RECORD_BYTES), np.uint8)
        for rank in range(2):
            shard: flashspec.LMHead = ctx.lm_head_shard(w[2 * rank:2 * rank + 2], 2 * rank, 4)
            assert (shard.vocab_begin, shard.vocab_size, shard.global_vocab_size) == (2 * rank, 2, 4)
            ctx.verify_shard(shard, batch, records[rank])
        assert ctx.finalize_shards(batch, records).tokens(0) == emitted
        draft_records: NDArray[np.uint8] = np.empty((2, 1, flashspec.SHARD_RECORD_BYTES), np.uint8)
        for rank in range(2):
            ctx.draft_shard(ctx.lm_head_shard(w[2 * rank:2 * rank + 2], 2 * rank, 4), np.array([[0, 3]], np.float32),
                            draft_records[rank])
        assert ctx.draft_from_shards(draft_records)[0].tolist() == [1]

        # Tree verify: both drafts are children of the root. The root row's
        # argmax, 1, is node 0; node 0 has no child, so its row's argmax, 2,
        # is emitted (as a chain, node 1 would have been accepted instead).
        tree = flashspec.VerifyBatch([0, 2], [1, 2], np.array([[0, 3], [-2, 0], [0, 0]], np.float32),
                                     temperatures=[0.0], draft_parents=[-1, -1])
        walked = ctx.verify_and_finalize(head, tree)
        assert walked.tokens(0) == [1, 2] and walked.accepted_nodes is not None
        assert int(walked.accepted_nodes[0]) == 0

        try:
            ctx.verify_and_finalize(head, flashspec.VerifyBatch([0, 1], [7], np.zeros((2, 2), np.float32)))
        except flashspec.OutOfRangeError as e:
            status: int = e.status
            assert status == 4 and e.status_name == "FLASHSPEC_ERR_OUT_OF_RANGE" and "draft_tokens" in e.message
        else:
            raise AssertionError("token 7 is outside the vocabulary of 4")

        e_rows = np.array([[0, 1], [-1, 0], [0, -1], [1, 0]], dtype=np.float32)  # hidden row = e_rows[last token]
        cache: list[int] = []

        def forward(new: NDArray[np.int32], num_past: int, num_rows: int) -> NDArray[np.float32]:
            cache[num_past:] = [int(t) for t in new]
            return e_rows[cache[len(cache) - num_rows:]]

        def rollback(num_keep: int) -> None:
            del cache[num_keep:]

        ngram = flashspec.NgramDrafter(ctx, max_n=3)
        last_token: Callable[[NDArray[np.int32], int], list[int]] = lambda seq, k: [int(seq[-1])] * min(k, 1)
        repeat = flashspec.CallbackDrafter(ctx, last_token)
        streamed: list[int] = []
        with flashspec.Engine(ctx, head, forward, target_rollback=rollback, drafters=[ngram, repeat],
                              arms=[(ngram, 2), (repeat, 1), (None, 0)], policy="ucb1") as engine:
            generation: flashspec.Generation = engine.generate([0], temperature=0, max_tokens=8,
                                                               on_token=streamed.append)
            out, reason, steps = generation
            # Greedy decoding of this model cycles 0 -> 1 -> 2 -> 3 -> 0.
            assert out == [1, 2, 3, 0, 1, 2, 3, 0] == streamed and reason is flashspec.FinishReason.LENGTH
            m: flashspec.EngineMetrics = engine.metrics()
            assert m.emitted_tokens == 8 and m.steps == steps
            rates: tuple[float, ...] = m.position_acceptance
            assert all(0.0 <= r <= 1.0 for r in rates)
            arm: flashspec.ArmMetrics = m.arms[0]
            assert arm.pulls >= 0 and isinstance(m.as_dict()["arms"], tuple)
            engine.reset_metrics()

        def broken(new: NDArray[np.int32], num_past: int, num_rows: int) -> NDArray[np.float32]:
            raise KeyError("no KV cache")

        with flashspec.Engine(ctx, head, broken) as failing:
            try:
                failing.generate([0], max_tokens=4)
            except flashspec.CallbackError as e:
                assert isinstance(e.__cause__, KeyError) and e.tokens == []
            else:
                raise AssertionError("the failing target forward did not fail the call")
    print("typed example: ok")


if __name__ == "__main__":
    main()
