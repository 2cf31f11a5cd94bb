"""FlashSpec for Python: a fused LM head + speculative-decoding sampler.

    import flashspec
    with flashspec.Context("cpu", seed=7) as ctx:
        head = ctx.lm_head(W)                       # [V, d] numpy / torch / cupy
        tokens, logprobs = ctx.draft(head, h, temperature=1.0)
        batch = flashspec.VerifyBatch(offsets, drafts, target_hidden)
        result = ctx.verify_and_finalize(head, batch)

        controls = flashspec.SamplingControls(top_k=40, top_p=0.95, logit_bias={7: -2.0})
        batch = flashspec.VerifyBatch(offsets, drafts, target_hidden, controls=controls,
                                      logprobs=True, top_logprobs=5)
        result = ctx.verify_and_finalize(head, batch)   # result.logprobs, .top_tokens, ...

        # Vocabulary shards (tensor parallelism): each rank verifies its
        # slice into fixed-size records; any rank finalizes the gathered ones.
        shard = ctx.lm_head_shard(W[begin:end], begin, len(W))
        ctx.verify_shard(shard, batch, records[rank])     # all-gather records
        result = ctx.finalize_shards(batch, records)      # [ranks, rows, 48]

        engine = flashspec.Engine(ctx, head, target_forward,
                                  drafters=[flashspec.NgramDrafter(ctx)])
        tokens, finish_reason, steps = engine.generate(prompt, temperature=0)

        # Many sequences, one ragged target forward and one verify per step.
        batch = flashspec.BatchEngine(ctx, head, batch_forward, num_drafters=1)
        batch.add_sequence(7, prompt, drafters=[flashspec.NgramDrafter(ctx)], temperature=0)
        batch.run()
        tokens = batch.sequence(7).tokens

The raw SWIG layer is flashspec.capi (every C function and struct as is).
"""
from . import capi
from ._controls import MAX_TOP_K, MAX_TOP_LOGPROBS, TOP_K_ALL, SamplingControls
from ._core import (MAX_DRAFT_SUPPORT, MAX_DRAFT_TOP_K, SHARD_RECORD_BYTES, SHARD_RECORD_VERSION, Context, LMHead, Summaries, VerifyBatch, VerifyResult,
                    stream_handle)
from .errors import FlashSpecError, error_class
from .errors import *  # noqa: F401,F403  (one exception class per status)
from ._engine import (ArmMetrics, CallbackDrafter, Drafter, Engine, EngineMetrics, FinishReason, Generation,
                      NgramDrafter, SuffixDrafter)
from ._batch_engine import BatchEngine, BatchForward, SequenceState

from . import errors as _errors

__version__ = capi.flashspec_version_string()
ABI_VERSION = capi.FLASHSPEC_ABI_VERSION

# The public names (help(flashspec) lists them; the raw SWIG layer stays in
# flashspec.capi).
__all__ = [
    "Context", "LMHead", "Summaries", "VerifyBatch", "VerifyResult", "stream_handle",
    "SHARD_RECORD_BYTES", "SHARD_RECORD_VERSION", "MAX_DRAFT_SUPPORT", "MAX_DRAFT_TOP_K",
    "SamplingControls", "MAX_TOP_K", "TOP_K_ALL", "MAX_TOP_LOGPROBS",
    "Engine", "Drafter", "NgramDrafter", "SuffixDrafter", "CallbackDrafter", "Generation", "FinishReason",
    "EngineMetrics",
    "ArmMetrics", "BatchEngine", "BatchForward", "SequenceState",
    "FlashSpecError", "error_class",
    "version", "version_number", "abi_version", "ABI_VERSION", "status_string", "status_name",
    "cuda_device_count", "philox4x32_10", "rng_uniform", "RNG_PURPOSES", "get_api",
] + [name for name in _errors.__all__ if name not in ("FlashSpecError", "error_class")]


def version():
    """Version string of the library actually loaded."""
    return capi.flashspec_version_string()


def version_number():
    return capi.flashspec_version_number()


def abi_version():
    """ABI version of the library actually loaded."""
    return capi.flashspec_abi_version()


def status_string(status):
    return capi.flashspec_status_string(status)


def status_name(status):
    return capi.flashspec_status_name(status)


def cuda_device_count():
    """CUDA devices usable by this build of the library (0 without CUDA)."""
    return capi.flashspec_cuda_device_count()


def philox4x32_10(counter, key):
    """Philox4x32-10 of a 4-word counter and 2-word key: a 4-tuple of words."""
    return capi.flashspec_philox4x32_10(counter, key)


RNG_PURPOSES = {"draft_noise": capi.FLASHSPEC_RNG_DRAFT_NOISE,
                "accept_uniform": capi.FLASHSPEC_RNG_ACCEPT_UNIFORM,
                "residual_noise": capi.FLASHSPEC_RNG_RESIDUAL_NOISE,
                "bonus_noise": capi.FLASHSPEC_RNG_BONUS_NOISE}


def rng_uniform(seed, request_id, step, position, purpose, token):
    """The contract's uniform in (0, 1); purpose is a name of RNG_PURPOSES or its value."""
    purpose = RNG_PURPOSES.get(purpose, purpose)
    return capi.flashspec_rng_uniform(seed, request_id, step, position, purpose, token)


def get_api(abi_version=capi.FLASHSPEC_ABI_VERSION):
    """The plugin table (flashspec_api) for abi_version, or None."""
    return capi.flashspec_get_api(abi_version)
