# Type information for flashspec._core (Context, LMHead, Summaries,
# VerifyBatch, VerifyResult). Checked against the module by stubtest and
# used by a mypy --strict test (bindings/python/tests/typing/).
from types import TracebackType
from typing import Any, Literal, Protocol, TypeVar, Union

from numpy.typing import ArrayLike

from ._controls import SamplingControls as SamplingControls

__all__ = ["Context", "LMHead", "Summaries", "VerifyBatch", "VerifyResult", "SamplingControls", "stream_handle",
           "SHARD_RECORD_BYTES", "SHARD_RECORD_VERSION", "MAX_DRAFT_SUPPORT", "MAX_DRAFT_TOP_K"]

SHARD_RECORD_BYTES: int
SHARD_RECORD_VERSION: int
MAX_DRAFT_SUPPORT: int
MAX_DRAFT_TOP_K: int

class _DLPackArray(Protocol):
    """A DLPack producer (torch, cupy, ...): viewed in place, never copied."""
    def __dlpack__(self) -> Any: ...
    def __dlpack_device__(self) -> Any: ...

class _CudaArray(Protocol):
    """A __cuda_array_interface__ producer (numba, cupy, ...)."""
    @property
    def __cuda_array_interface__(self) -> Any: ...

# An array the library reads: anything numpy can view on the host (arrays,
# lists, buffers) or a device array (DLPack or the CUDA array interface).
_ArrayInput = Union[ArrayLike, _DLPackArray, _CudaArray]
# An array the library writes in place (a numpy array of the exact dtype or
# a device array), or one it returns: numpy for host memory, the producer's
# type (torch, cupy) for device memory.
_Array = Any

_Backend = Literal["auto", "cpu", "cuda"]
# An LM head's stored dtype; lm_head_quantized's ``stored`` also takes a
# FLASHSPEC_DTYPE_* value (flashspec.capi).
_Dtype = Literal["float32", "bfloat16", "float16", "e4m3", "int8"]
_H = TypeVar("_H", bound=_Handle)

def stream_handle(stream: object) -> int: ...

class _Handle:
    def __init__(self, raw: object) -> None: ...
    @property
    def raw(self) -> Any: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self: _H) -> _H: ...
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None: ...
    def __del__(self) -> None: ...

class Context(_Handle):
    stream: int
    seed: int
    def __init__(self, backend: _Backend = "auto", *, device: int = 0, cuda_stream: object = None, seed: int = 0,
                 cpu_threads: int = 0, max_rows: int = 512, max_requests: int = 512) -> None: ...
    @property
    def backend(self) -> Literal["cpu", "cuda"]: ...
    @property
    def last_error(self) -> str: ...
    def synchronize(self) -> None: ...
    def lm_head(self, weight: _ArrayInput, *, borrow: bool = False) -> LMHead: ...
    def lm_head_shard(self, weight: _ArrayInput, vocab_begin: int, vocab_size: int, *,
                      borrow: bool = False) -> LMHead: ...
    def lm_head_quantized(self, weight: _ArrayInput, stored: _Dtype | int, *, scales: _ArrayInput | None = None,
                          borrow: bool = False) -> LMHead: ...
    def summaries(self, max_rows: int, max_requests: int) -> Summaries: ...
    def draft(self, head: LMHead, hidden: _ArrayInput, *, temperature: float = 0.0,
              temperatures: _ArrayInput | None = None, seeds: _ArrayInput | None = None,
              request_ids: _ArrayInput | None = None, steps: _ArrayInput | None = None,
              positions: _ArrayInput | None = None, controls: SamplingControls | None = None,
              tokens_out: _Array | None = None, scores_out: _Array | None = None) -> tuple[_Array, _Array]: ...
    # (tokens int32 [rows, k], logprobs float32 [rows, k]) in hidden's memory.
    def draft_top_k(self, head: LMHead, hidden: _ArrayInput, k: int, *,
                    controls: SamplingControls | None = None) -> tuple[_Array, _Array]: ...
    def verify(self, head: LMHead, batch: VerifyBatch, summaries: Summaries) -> None: ...
    def finalize(self, batch: VerifyBatch, summaries: Summaries, *, out: VerifyResult | None = None) -> VerifyResult: ...
    def verify_and_finalize(self, head: LMHead, batch: VerifyBatch, *,
                            out: VerifyResult | None = None) -> VerifyResult: ...
    # Vocabulary shards. records: uint8 arrays the library writes in place
    # ([rows, SHARD_RECORD_BYTES] or flat) or reads, gathered ([num_shards,
    # rows, SHARD_RECORD_BYTES] or [num_shards, rows * SHARD_RECORD_BYTES]).
    def draft_shard(self, head: LMHead, hidden: _ArrayInput, records: _Array, *, temperature: float = 0.0,
                    temperatures: _ArrayInput | None = None, seeds: _ArrayInput | None = None,
                    request_ids: _ArrayInput | None = None, steps: _ArrayInput | None = None,
                    positions: _ArrayInput | None = None) -> None: ...
    def draft_from_shards(self, records: _ArrayInput, *, temperature: float = 0.0,
                          temperatures: _ArrayInput | None = None, seeds: _ArrayInput | None = None,
                          request_ids: _ArrayInput | None = None, steps: _ArrayInput | None = None,
                          positions: _ArrayInput | None = None, tokens_out: _Array | None = None,
                          scores_out: _Array | None = None) -> tuple[_Array, _Array]: ...
    def verify_shard(self, head: LMHead, batch: VerifyBatch, records: _Array) -> None: ...
    def finalize_shards(self, batch: VerifyBatch, records: _ArrayInput, *,
                        out: VerifyResult | None = None) -> VerifyResult: ...

class LMHead(_Handle):
    context: Context
    def __init__(self, context: Context, weight: _ArrayInput, *, borrow: bool = False,
                 vocab_begin: int | None = None, global_vocab_size: int | None = None,
                 stored: _Dtype | int | None = None, scales: _ArrayInput | None = None) -> None: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def dtype(self) -> _Dtype: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def vocab_begin(self) -> int: ...
    @property
    def global_vocab_size(self) -> int: ...

class Summaries(_Handle):
    context: Context
    def __init__(self, context: Context, max_rows: int, max_requests: int) -> None: ...

class VerifyBatch:
    target_hidden: _ArrayInput
    draft_logits: _ArrayInput | None
    max_draft_len: int
    controls: SamplingControls | None
    draft_controls: SamplingControls | None
    logprobs: bool
    top_logprobs: int
    greedy: bool
    # Set once the batch has been built for a call (c_batch):
    memory: int
    num_requests: int
    total_rows: int
    def __init__(self, draft_offsets: _ArrayInput, draft_tokens: _ArrayInput, target_hidden: _ArrayInput, *,
                 draft_logits: _ArrayInput | None = None, temperatures: _ArrayInput | None = None,
                 draft_temperatures: _ArrayInput | None = None, seeds: _ArrayInput | None = None,
                 request_ids: _ArrayInput | None = None, steps: _ArrayInput | None = None,
                 accept_uniforms: _ArrayInput | None = None, max_draft_len: int = 0,
                 controls: SamplingControls | None = None, draft_controls: SamplingControls | None = None,
                 logprobs: bool = False, top_logprobs: int = 0, draft_parents: _ArrayInput | None = None,
                 draft_support_offsets: _ArrayInput | None = None, draft_support_tokens: _ArrayInput | None = None,
                 draft_support_probs: _ArrayInput | None = None, greedy: bool = False) -> None: ...
    def c_batch(self, stream: int, cuda_context: bool = True) -> Any: ...
    @property
    def draft_offsets(self) -> _ArrayInput: ...
    @property
    def draft_parents(self) -> _ArrayInput | None: ...
    def check_vocab(self, vocab: int) -> None: ...

class VerifyResult:
    accepted_counts: _Array
    emitted_tokens: _Array
    next_steps: _Array | None
    # None unless the batch asked for them (logprobs=True, top_logprobs=n):
    # [rows] float32, [rows] float32, [rows, n] int32, [rows, n] float32.
    logprobs: _Array | None
    raw_logprobs: _Array | None
    top_tokens: _Array | None
    top_logprobs: _Array | None
    # [rows] int32 tree verify: the accepted path's node indices (like()
    # allocates it for a batch with draft_parents).
    accepted_nodes: _Array | None
    memory: int | None
    def __init__(self, accepted_counts: _Array, emitted_tokens: _Array, next_steps: _Array | None = None, *,
                 logprobs: _Array | None = None, raw_logprobs: _Array | None = None,
                 top_tokens: _Array | None = None, top_logprobs: _Array | None = None,
                 accepted_nodes: _Array | None = None, draft_offsets: _ArrayInput | None = None) -> None: ...
    @classmethod
    def like(cls, batch: VerifyBatch, stream: int = 0) -> VerifyResult: ...
    def c_result(self, stream: int, batch: VerifyBatch | None = None) -> Any: ...
    def tokens(self, request: int) -> list[int]: ...
    def token_logprobs(self, request: int, *, raw: bool = False) -> list[float]: ...
    # Per emitted token, its row's top (token, raw logprob) pairs, largest first.
    def top(self, request: int) -> list[list[tuple[int, float]]]: ...
