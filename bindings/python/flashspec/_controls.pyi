# Type information for flashspec._controls (SamplingControls and the
# limits of the sampling controls). Checked against the module by stubtest
# and used by a mypy --strict test (bindings/python/tests/typing/).
from collections.abc import Mapping, Sequence
from typing import Any, Union

import numpy as np
from numpy.typing import NDArray

from ._core import _DLPackArray

__all__ = ["SamplingControls", "MAX_TOP_K", "TOP_K_ALL", "MAX_TOP_LOGPROBS"]

MAX_TOP_K: int
TOP_K_ALL: int
MAX_TOP_LOGPROBS: int

# Per-request values and the CSR bias arrays are host arrays, converted to
# int32 or float32 (a copy) when they are not already: a scalar (the same
# for every request), a sequence, a numpy array or a CPU tensor (DLPack).
_Ints = Union[int, np.integer[Any], Sequence[int], NDArray[np.integer[Any]], _DLPackArray]
_Floats = Union[float, np.floating[Any], Sequence[float], NDArray[np.floating[Any]], NDArray[np.integer[Any]],
                _DLPackArray]
# {token: bias} for every request, or one such dict (or None) per request.
_Bias = Mapping[int, float]
_LogitBias = Union[_Bias, Sequence[Union[_Bias, None]]]
# A bool mask [rows, V] (True = allowed), or uint32 words [rows, ceil(V / 32)]
# already packed; 1-D is one row.
_TokenMask = Union[NDArray[np.bool_], NDArray[np.uint32], Sequence[Sequence[bool]], Sequence[bool]]

class SamplingControls:
    top_k: _Ints | None
    top_p: _Floats | None
    min_p: _Floats | None
    repetition_penalty: _Floats | None
    typical_epsilon: _Floats | None
    typical_delta: _Floats | None
    logit_bias: _LogitBias | None
    bias_offsets: _Ints | None
    bias_tokens: _Ints | None
    bias_values: _Floats | None
    # The mask as the library reads it (packed uint32 words, C-contiguous),
    # and the columns of the bool mask it was packed from (None: given packed).
    token_mask: NDArray[np.uint32] | None
    mask_columns: int | None
    def __init__(self, *, top_k: _Ints | None = None, top_p: _Floats | None = None, min_p: _Floats | None = None,
                 logit_bias: _LogitBias | None = None, bias_offsets: _Ints | None = None,
                 bias_tokens: _Ints | None = None, bias_values: _Floats | None = None,
                 repetition_penalty: _Floats | None = None, token_mask: _TokenMask | None = None,
                 typical_epsilon: _Floats | None = None, typical_delta: _Floats | None = None) -> None: ...
    def check_vocab(self, vocab: int, prefix: str) -> None: ...
    # The flashspec_sampling_controls (a capi struct) and the arrays it
    # points at, which must outlive its use.
    def c_controls(self, requests: int, mask_rows: int, prefix: str, *, per: str = "requests",
                   mask_source: str | None = None, memory: int = ..., device: int = 0, stream: int = 0,
                   upload: bool = True) -> tuple[Any, list[object]]: ...
