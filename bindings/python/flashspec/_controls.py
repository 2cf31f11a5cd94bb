"""Sampling controls (flashspec_sampling_controls): per-request top-k, top-p,
min-p, logit bias with a repetition penalty, allowed-token masks and typical
acceptance."""
import ctypes
from collections.abc import Mapping

import numpy as np

from . import _arrays
from . import capi as _capi

__all__ = ["SamplingControls", "MAX_TOP_K", "TOP_K_ALL", "MAX_TOP_LOGPROBS"]

MAX_TOP_K = _capi.FLASHSPEC_MAX_TOP_K
TOP_K_ALL = _capi.FLASHSPEC_TOP_K_ALL
MAX_TOP_LOGPROBS = _capi.FLASHSPEC_MAX_TOP_LOGPROBS

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


class SamplingControls:
    """What turns a row's logits into the distribution a draft samples and a
    verify verifies against (see "Sampling controls" in flashspec.h):
    penalties and logit bias, token mask, temperature, top-k, top-p, min-p,
    in that order.

    Per-request values (``top_k``, ``top_p``, ``min_p``,
    ``repetition_penalty``, ``typical_epsilon``, ``typical_delta``) are a
    scalar, the same for every request, or one entry per request (per hidden
    row in ``Context.draft``). None leaves the step out.

    Logit bias: ``logit_bias`` is a dict ``{token: bias}`` for every request
    or a sequence of such dicts (or None) per request; or give the C API's
    CSR arrays ``bias_offsets`` [R + 1], ``bias_tokens`` and ``bias_values``
    [bias_offsets[R]] instead. Entries naming one token add up. The
    ``repetition_penalty`` r applies to the tokens the bias names (a value
    of 0 names a token for the penalty alone): l becomes l / r if l > 0,
    else l * r, before the bias is added.

    ``token_mask``: one row per row the controls apply to (each target row of
    a verify, each draft-logits row for ``draft_controls``, each hidden row
    of a draft), either a bool array [rows, V] (True = allowed), packed here,
    or a uint32 array [rows, ceil(V / 32)] already packed (token i is allowed
    iff bit i % 32 of word i // 32 is set; xgrammar's layout).

    ``typical_epsilon`` (with ``typical_delta``, default sqrt(epsilon)) turns
    on Medusa's typical acceptance for a verify's target controls; it is not
    distribution-preserving.

    Every array is checked against the call it is used in before the
    library sees it. A call on device memory (the CUDA backend) takes the
    controls in device memory: per-request arrays and bias lists may be
    device arrays of the call's device (bias_offsets' last entry is then
    read back, one synchronise); host values, scalars and the token mask
    are copied to the device on the context's stream for each call.
    """

    _PER_REQUEST = (("top_k", "int32"), ("top_p", "float32"), ("min_p", "float32"),
                    ("repetition_penalty", "float32"), ("typical_epsilon", "float32"),
                    ("typical_delta", "float32"))

    def __init__(self, *, top_k=None, top_p=None, min_p=None, logit_bias=None, bias_offsets=None,
                 bias_tokens=None, bias_values=None, repetition_penalty=None, token_mask=None,
                 typical_epsilon=None, typical_delta=None):
        csr = (bias_offsets, bias_tokens, bias_values)
        if logit_bias is not None and any(a is not None for a in csr):
            raise ValueError("give logit_bias or bias_offsets/bias_tokens/bias_values, not both")
        self.top_k, self.top_p, self.min_p = top_k, top_p, min_p
        self.repetition_penalty = repetition_penalty
        self.typical_epsilon, self.typical_delta = typical_epsilon, typical_delta
        self.logit_bias = logit_bias
        self.bias_offsets, self.bias_tokens, self.bias_values = csr
        self.token_mask, self.mask_columns = _pack_mask(token_mask) if token_mask is not None else (None, None)

    def __repr__(self):
        given = [name for name in ("top_k", "top_p", "min_p", "logit_bias", "bias_offsets", "repetition_penalty",
                                   "token_mask", "typical_epsilon", "typical_delta") if getattr(self, name) is not None]
        return f"SamplingControls({', '.join(given)})"

    def check_vocab(self, vocab, prefix):
        """A bool mask must have one column per token of the vocabulary."""
        if self.mask_columns is not None and self.mask_columns != vocab:
            raise ValueError(f"{prefix}.token_mask has {self.mask_columns} columns, the vocabulary has {vocab} "
                             "tokens (a bool mask has one column per token)")

    def c_controls(self, requests, mask_rows, prefix, *, per="requests", mask_source=None,
                   memory=_arrays.HOST, device=0, stream=0, upload=True):
        """The flashspec_sampling_controls for a call of ``requests`` requests
        (rows, for a draft) and ``mask_rows`` mask rows in ``memory`` (device
        memory: of ``device``, copies made on ``stream`` when ``upload``, the
        call being on a CUDA context), and the arrays it
        points at (keep them alive while it is used). Raises ValueError
        unless every array holds what the library reads."""
        c = _capi.flashspec_sampling_controls()
        _capi.flashspec_sampling_controls_init(c)
        keep = []
        what = f"the {requests} {per}"

        def in_memory(v, name):
            """v in the call's memory: host arrays are copied to a device call's device."""
            if v.memory == memory:
                if memory == _arrays.CUDA and v.device != device:
                    raise ValueError(f"{prefix}.{name}: a device array on device {v.device}, "
                                     f"the call runs on device {device}")
            elif memory == _arrays.HOST:
                raise ValueError(f"{prefix}.{name}: a device array for a call on host memory (CPU backend)")
            elif not upload:
                raise ValueError(f"{prefix}.{name}: the call's arrays are in device memory but the context "
                                 "is not a CUDA context, so its host controls are not copied there")
            else:
                v = _arrays.upload(v, device, stream)
            keep.append(v)
            return v

        def host(value, name, dtype):
            return _arrays.vector(value, f"{prefix}.{name}", dtype, stream=stream)

        for name, dtype in self._PER_REQUEST:
            value = getattr(self, name)
            if value is None:
                continue
            if np.isscalar(value) or (isinstance(value, np.ndarray) and value.ndim == 0):
                value = np.full(requests, value, dtype=dtype)
            v = host(value, name, dtype)
            _require(f"{prefix}.{name}", v.shape[0], requests, what)
            setattr(c, name, in_memory(v, name).address)

        offsets, tokens, values = self.bias_offsets, self.bias_tokens, self.bias_values
        if self.logit_bias is not None:
            offsets, tokens, values = _bias_csr(self.logit_bias, requests, f"{prefix}.logit_bias", what)
        if offsets is not None:
            ov = host(offsets, "bias_offsets", "int32")
            _require(f"{prefix}.bias_offsets", ov.shape[0], requests + 1, f"R + 1 = {requests + 1}")
            entries = (ctypes.c_int32.from_address(ov.address + 4 * requests).value if ov.memory == _arrays.HOST
                       else _arrays.read_device_int32(ov, requests))
            c.bias_offsets = in_memory(ov, "bias_offsets").address
            for name, array, dtype in (("bias_tokens", tokens, "int32"), ("bias_values", values, "float32")):
                if array is None:
                    continue  # the library refuses a NULL list that offsets name entries of
                v = host(array, name, dtype)
                _require(f"{prefix}.{name}", v.shape[0], entries, f"bias_offsets[R] = {entries}")
                setattr(c, name, in_memory(v, name).address if v.size else None)
        else:
            # Without offsets the library reads neither list; it refuses them.
            for name, array, dtype in (("bias_tokens", tokens, "int32"), ("bias_values", values, "float32")):
                if array is not None:
                    v = host(array, name, dtype)
                    setattr(c, name, in_memory(v, name).address if v.size else None)

        if self.token_mask is not None:
            rows, words = self.token_mask.shape
            if rows != mask_rows:
                raise ValueError(f"{prefix}.token_mask has {rows} rows, expected {mask_source or mask_rows}")
            if words == 0:
                raise ValueError(f"{prefix}.token_mask has no columns")
            mask = in_memory(_arrays.view(self.token_mask, f"{prefix}.token_mask"), "token_mask")
            c.token_mask = mask.address
            # Always explicit: 0 would mean ceil(V / 32), which the array may not hold.
            c.mask_words = words
        return c, keep


def _require(name, have, count, what):
    if have < count:
        raise ValueError(f"{name} has {have} entries, fewer than {what}")


def _bias_csr(logit_bias, requests, name, what):
    """CSR arrays of a dict {token: bias} (every request) or a sequence of
    dicts (or None) per request."""
    if isinstance(logit_bias, Mapping):
        per_request = [logit_bias] * requests
    else:
        per_request = list(logit_bias)
        _require(name, len(per_request), requests, what)
        per_request = per_request[:requests]
    offsets, tokens, values = [0], [], []
    for r, bias in enumerate(per_request):
        if bias is None:
            bias = {}
        if not isinstance(bias, Mapping):
            raise TypeError(f"{name}[{r}]: expected a dict {{token: bias}} or None, got {type(bias).__name__}")
        for token, value in bias.items():
            token = int(token)
            if not _INT32_MIN <= token <= _INT32_MAX:
                raise ValueError(f"{name}[{r}]: token {token} is not an int32 token id")
            tokens.append(token)
            values.append(float(value))
        offsets.append(len(tokens))
    return (np.array(offsets, np.int32), np.array(tokens, np.int32), np.array(values, np.float32))


def _pack_mask(mask):
    """(uint32 [rows, words] C-contiguous, columns of a bool mask or None)."""
    arr = np.asarray(mask)
    if arr.ndim == 1:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2:
        raise ValueError(f"token_mask: expected a 2-D array [rows, V] or [rows, words], got shape {arr.shape}")
    if arr.dtype == np.bool_:
        rows, columns = arr.shape
        words = (columns + 31) // 32
        packed = np.packbits(arr, axis=1, bitorder="little")  # byte k, bit b = token 8k + b
        padded = np.zeros((rows, words * 4), np.uint8)
        padded[:, :packed.shape[1]] = packed
        # Word w is bytes 4w .. 4w + 3, little-endian: bit j of it is token 32w + j.
        return np.ascontiguousarray(padded.view("<u4").astype(np.uint32)), columns
    if arr.dtype == np.uint32:
        return np.ascontiguousarray(arr), None
    raise TypeError(f"token_mask: expected a bool array [rows, V] or a uint32 array [rows, ceil(V / 32)] "
                    f"of packed bits, got {arr.dtype}")
