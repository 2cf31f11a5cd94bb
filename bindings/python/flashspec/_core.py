"""The Pythonic layer over the SWIG module: Context, LMHead, Summaries,
VerifyBatch and VerifyResult, with RAII-style close() and exceptions."""
import ctypes
import threading
import weakref

import numpy as np

from . import _arrays
from . import capi as _capi
from ._controls import _INT32_MAX, _INT32_MIN, SamplingControls
from .errors import check

__all__ = ["Context", "LMHead", "Summaries", "VerifyBatch", "VerifyResult", "SamplingControls", "stream_handle",
           "SHARD_RECORD_BYTES", "SHARD_RECORD_VERSION", "MAX_DRAFT_SUPPORT", "MAX_DRAFT_TOP_K"]

# The per-row record of a vocabulary-shard call (see "Vocabulary shards" in
# flashspec.h): its size in bytes and the layout version it carries.
SHARD_RECORD_BYTES = _capi.FLASHSPEC_SHARD_RECORD_BYTES
SHARD_RECORD_VERSION = _capi.FLASHSPEC_SHARD_RECORD_VERSION
MAX_DRAFT_SUPPORT = _capi.FLASHSPEC_MAX_DRAFT_SUPPORT
MAX_DRAFT_TOP_K = _capi.FLASHSPEC_MAX_DRAFT_TOP_K

# The per-row arrays of flashspec_draft_params, by name and element type.
_DRAFT_ROW_ARRAYS = (("temperatures", "float32"), ("seeds", "uint64"), ("request_ids", "uint64"),
                     ("steps", "uint64"), ("positions", "int32"))
_DRAFT_OUTPUTS = (("tokens_out", "int32"), ("scores_out", "float32"))

_BACKENDS = {"auto": _capi.FLASHSPEC_BACKEND_AUTO, "cpu": _capi.FLASHSPEC_BACKEND_CPU,
             "cuda": _capi.FLASHSPEC_BACKEND_CUDA}
_BACKEND_NAMES = {v: k for k, v in _BACKENDS.items()}

# An LM head's stored dtype, by name (LMHead.dtype; the ``stored`` argument
# of Context.lm_head_quantized also takes these values or their names).
_DTYPES = {"float32": _capi.FLASHSPEC_DTYPE_F32, "bfloat16": _capi.FLASHSPEC_DTYPE_BF16,
           "float16": _capi.FLASHSPEC_DTYPE_F16, "e4m3": _capi.FLASHSPEC_DTYPE_E4M3,
           "int8": _capi.FLASHSPEC_DTYPE_I8}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}


def _stored_dtype(stored):
    """The flashspec_dtype of a ``stored`` argument: a name of _DTYPES or a
    FLASHSPEC_DTYPE_* value (passed to the library as is, which refuses any
    but E4M3 and I8 with DtypeMismatchError)."""
    if isinstance(stored, str):
        if stored not in _DTYPES:
            raise ValueError(f"stored must be one of {sorted(_DTYPES)} or a FLASHSPEC_DTYPE_* value, "
                             f"not {stored!r}")
        return _DTYPES[stored]
    if isinstance(stored, bool) or not isinstance(stored, int):
        raise TypeError(f"stored must be a dtype name or a FLASHSPEC_DTYPE_* value, not {type(stored).__name__}")
    return stored


def stream_handle(stream):
    """The cudaStream_t of ``stream`` as an integer: an int, a torch.cuda.Stream
    (``.cuda_stream``), a cupy Stream (``.ptr``), or None (0, the legacy
    default stream)."""
    if stream is None:
        return 0
    for attribute in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attribute, None)
        if isinstance(value, int):
            return value
    return int(stream)


class _Handle:
    """Owns one C handle; close() is idempotent and also runs on collection."""

    _destroy = None

    def __init__(self, raw):
        self._raw = raw

    @property
    def raw(self):
        if self._raw is None:
            raise ValueError(f"{type(self).__name__} is closed")
        return self._raw

    @property
    def closed(self):
        return self._raw is None

    def close(self):
        raw, self._raw = self._raw, None
        if raw is not None:
            type(self)._destroy(raw)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Context(_Handle):
    """A FlashSpec context: backend, device, CUDA stream, seed and workspace.

    Use one context per thread (the C API's [context-exclusive]); the calls of
    one context are serialised by a lock, so sharing it is safe but serial.
    close() destroys the engines, drafters, LM heads and summaries created
    from it first.
    """

    _destroy = staticmethod(_capi.flashspec_context_destroy)

    def __init__(self, backend="auto", *, device=0, cuda_stream=None, seed=0, cpu_threads=0,
                 max_rows=512, max_requests=512):
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {sorted(_BACKENDS)}, not {backend!r}")
        params = _capi.flashspec_context_params()
        _capi.flashspec_context_params_init(params)
        params.backend = _BACKENDS[backend]
        params.device_ordinal = device
        self.stream = stream_handle(cuda_stream)
        params.cuda_stream = self.stream or None
        params.seed = seed
        params.cpu_threads = cpu_threads
        params.max_rows = max_rows
        params.max_requests = max_requests
        status, raw = _capi.flashspec_context_create(params)
        check(status, None)
        super().__init__(raw)
        self._lock = threading.RLock()
        self._children = weakref.WeakSet()
        self.seed = seed

    def close(self):
        if self._raw is None:
            return
        with self._lock:
            # Engines borrow drafters and heads: they go first, then drafters.
            for child in sorted(self._children, key=lambda c: getattr(c, "_close_order", 2)):
                child.close()
            super().close()

    def _call(self, fn, *args):
        with self._lock:
            raw = self.raw
            check(fn(raw, *args), raw)

    @property
    def backend(self):
        """"cpu" or "cuda": the backend actually chosen."""
        return _BACKEND_NAMES[_capi.flashspec_context_backend(self.raw)]

    @property
    def last_error(self):
        return _capi.flashspec_context_last_error(self.raw)

    def synchronize(self):
        """Wait for all work enqueued on the context."""
        self._call(_capi.flashspec_context_synchronize)

    def _sync_host_outputs(self, *memories):
        # The CUDA backend writes host outputs asynchronously too; a numpy
        # array handed back must be complete.
        if _arrays.HOST in memories and self.backend == "cuda":
            self.synchronize()

    # ---- objects -----------------------------------------------------------
    def lm_head(self, weight, *, borrow=False):
        """Upload the LM head W, [V, d] (float32, bfloat16 or float16)."""
        return LMHead(self, weight, borrow=borrow)

    def lm_head_shard(self, weight, vocab_begin, vocab_size, *, borrow=False):
        """Upload one rank's slice of a vocabulary-sharded LM head: weight
        holds the rows of the global tokens [vocab_begin, vocab_begin +
        weight rows) of a vocabulary of vocab_size tokens. A shard head
        serves only the shard calls (verify_shard, draft_shard)."""
        return LMHead(self, weight, borrow=borrow, vocab_begin=vocab_begin, global_vocab_size=vocab_size)

    def lm_head_quantized(self, weight, stored, *, scales=None, borrow=False):
        """Upload an 8-bit LM head (flashspec_lm_head_create_quantized):
        vocabulary row v is stored as codes q_v and one float32 scale s_v,
        and the head is the dequantised W = diag(s) · Q.

        stored: "e4m3" or "int8" (or capi.FLASHSPEC_DTYPE_E4M3 / _I8).
        weight: [V, d] float32, bfloat16 or float16 (host arrays of other
        float dtypes become float32), quantised by the library row by row
        (s_v = amax_v / 448 for e4m3, amax_v / 127 for int8; codes rounded
        to nearest, ties to even); scales must then be None. Or codes
        already quantised: uint8 e4m3 bit patterns (or an ml_dtypes
        float8_e4m3fn array) for "e4m3", int8 for "int8", with ``scales``
        the [V] or [V, 1] float32 scales (finite, >= 0) in the same memory.
        Device arrays (torch, cupy) work as for lm_head; borrow=True keeps
        device codes by pointer (CUDA backend) and this object keeps them
        alive. Errors are the library's: DtypeMismatchError (stored not
        8-bit, codes of the other dtype), InvalidArgumentError (scales
        given for a weight to quantise, missing for codes, or not V of
        them), NonFiniteError (a negative or non-finite scale)."""
        return LMHead(self, weight, borrow=borrow, stored=stored, scales=scales)

    def summaries(self, max_rows, max_requests):
        """Reserve summaries for verify/finalize."""
        return Summaries(self, max_rows, max_requests)

    # ---- draft -------------------------------------------------------------
    def draft(self, head, hidden, *, temperature=0.0, temperatures=None, seeds=None,
              request_ids=None, steps=None, positions=None, controls=None, tokens_out=None, scores_out=None):
        """Draft one token per hidden row. Returns (tokens, scores): int32
        token ids and, per row, the token's logit (T = 0) or log q(x) (T > 0).
        Outputs (unless given) live with the per-row arrays, else with
        ``hidden``: numpy on the host, torch or cupy arrays on the device.
        ``controls`` (a SamplingControls) apply per row: its per-request
        values have one entry per hidden row, its mask one row per hidden
        row; then T = 0 is the argmax over the controlled set and T > 0
        samples the controlled q (scores are log q(x))."""
        hv = _arrays.tensor(hidden, "hidden", stream=self.stream)
        rows = hv.shape[0]
        memory, views = self._draft_views(
            rows, hv, dict(temperatures=temperatures, seeds=seeds, request_ids=request_ids, steps=steps,
                           positions=positions), dict(tokens_out=tokens_out, scores_out=scores_out))
        tv, sv = views.pop("tokens_out"), views.pop("scores_out")
        c_controls, _keep = _draft_controls(controls, head, rows, memory, hv.device, self.stream,
                                            self.backend == "cuda")
        params = _draft_params(memory, temperature, views)
        params.controls = c_controls
        self._call(_capi.flashspec_draft, head.raw, _arrays.c_tensor(hv), params, tv.address, sv.address)
        self._sync_host_outputs(memory)
        return tv.source, sv.source

    def draft_top_k(self, head, hidden, k, *, controls=None):
        """The fused top-k draft: per hidden row, the k allowed tokens of
        largest logit + bias in rank order (larger first, ties by smaller id)
        and their log-probabilities at temperature 1 (log-softmax over the
        allowed tokens). Returns (tokens, logprobs), int32 and float32
        [rows, k], allocated in the memory of ``hidden``. A row with fewer
        than k allowed tokens ends in -1 / -inf. ``controls`` as for draft,
        but only its bias, repetition penalty and mask (top_k, top_p, min_p
        and typical are InvalidArgumentError). k outside 1..MAX_DRAFT_TOP_K
        is the library's OutOfRangeError."""
        if isinstance(k, bool) or not isinstance(k, int):
            raise TypeError(f"k: expected an int, got {type(k).__name__}")
        hv = _arrays.tensor(hidden, "hidden", stream=self.stream)
        rows = hv.shape[0]
        c_controls, _keep = _draft_controls(controls, head, rows, hv.memory, hv.device, self.stream,
                                            self.backend == "cuda")
        # The library refuses a k outside 1..MAX_DRAFT_TOP_K before writing
        # anything; the outputs are sized for the k it can accept, and k is
        # clamped into int32 so any int reaches that check.
        slots = min(max(k, 0), MAX_DRAFT_TOP_K)
        outputs = [_arrays.view(_arrays.empty_like_memory(hv, (rows, slots), dtype), name, stream=self.stream,
                                dtype=dtype, output=True)
                   for name, dtype in (("tokens", "int32"), ("logprobs", "float32"))]
        tv, lv = outputs
        params = _draft_params(hv.memory, 0.0, {})
        params.controls = c_controls
        c_k = min(max(k, _INT32_MIN), _INT32_MAX)
        self._call(_capi.flashspec_draft_top_k, head.raw, _arrays.c_tensor(hv), params, c_k, tv.address, lv.address)
        self._sync_host_outputs(hv.memory)
        return tv.source, lv.source

    def _draft_views(self, rows, default, per_row, outputs):
        """Views of a draft call's per-row arrays (per_row: name -> array or
        None) and outputs (outputs: name -> array, or None to allocate one),
        each checked to hold the rows, and the memory they share
        (params->memory): that of the arrays given, else that of default (a
        View). Allocated outputs live there, of the framework of the first
        array given (else of default)."""
        given = [(name, per_row[name], dtype, False) for name, dtype in _DRAFT_ROW_ARRAYS
                 if per_row.get(name) is not None]
        given += [(name, outputs[name], dtype, True) for name, dtype in _DRAFT_OUTPUTS
                  if outputs.get(name) is not None]
        views = {name: _arrays.vector(value, name, dtype, stream=self.stream, output=output)
                 for name, value, dtype, output in given}
        memory = _common_memory(views.values(), default=default.memory)
        proto = next(iter(views.values()), default)
        for name, dtype in _DRAFT_OUTPUTS:
            if name in outputs and name not in views:
                created = _arrays.empty_like_memory(proto, (rows,), dtype)
                views[name] = _arrays.vector(created, name, dtype, stream=self.stream, output=True)
        for name, v in views.items():
            _require_rows(name, v, rows)
        return memory, views

    # ---- vocabulary shards -------------------------------------------------
    def draft_shard(self, head, hidden, records, *, temperature=0.0, temperatures=None, seeds=None,
                    request_ids=None, steps=None, positions=None):
        """One rank's draft pass over its slice (head from lm_head_shard):
        writes one record per hidden row to ``records``, a writable
        C-contiguous uint8 array of at least rows * SHARD_RECORD_BYTES bytes
        ([rows, SHARD_RECORD_BYTES] or flat), in the memory of the per-row
        arrays. Gather every rank's records, then draft_from_shards."""
        hv = _arrays.tensor(hidden, "hidden", stream=self.stream)
        rows = hv.shape[0]
        rv = _arrays.records(records, "records", stream=self.stream, output=True)
        _require_records(rv, "records", rows, f"the {rows} hidden rows")
        memory, views = self._draft_views(
            rows, rv, dict(temperatures=temperatures, seeds=seeds, request_ids=request_ids, steps=steps,
                           positions=positions), {})
        _require_memory([("records", rv)], memory, like="the per-row arrays")
        params = _draft_params(memory, temperature, views)
        self._call(_capi.flashspec_draft_shard, head.raw, _arrays.c_tensor(hv), params, rv.address)
        self._sync_host_outputs(memory)

    def draft_from_shards(self, records, *, temperature=0.0, temperatures=None, seeds=None, request_ids=None,
                          steps=None, positions=None, tokens_out=None, scores_out=None):
        """The drafts from the gathered records of every rank: ``records`` is
        uint8 [num_shards, rows, SHARD_RECORD_BYTES] (or [num_shards, rows *
        SHARD_RECORD_BYTES]), rank order. Returns (tokens, scores) as draft
        on the whole head with the same per-row arguments; outputs (unless
        given) live with the records."""
        rv = _arrays.records(records, "records", stream=self.stream)
        num_shards, rows = _gathered_records_shape(rv, "records")
        memory, views = self._draft_views(
            rows, rv, dict(temperatures=temperatures, seeds=seeds, request_ids=request_ids, steps=steps,
                           positions=positions), dict(tokens_out=tokens_out, scores_out=scores_out))
        _require_memory([("records", rv)], memory, like="the per-row arrays and outputs")
        tv, sv = views.pop("tokens_out"), views.pop("scores_out")
        params = _draft_params(memory, temperature, views)
        self._call(_capi.flashspec_draft_from_shards, params, rv.address, num_shards, rows, tv.address, sv.address)
        self._sync_host_outputs(memory)
        return tv.source, sv.source

    def verify_shard(self, head, batch, records):
        """One rank's verify pass over its slice (head from lm_head_shard):
        writes one record per target row to ``records``, a writable
        C-contiguous uint8 array of at least rows * SHARD_RECORD_BYTES bytes
        ([rows, SHARD_RECORD_BYTES] or flat; rows = draft_offsets[R] + R), in
        the memory of the batch's index arrays. Gather every rank's records,
        then finalize_shards."""
        c_batch = batch.c_batch(self.stream, cuda_context=self.backend == "cuda")
        batch.check_vocab(head.global_vocab_size)
        rv = _arrays.records(records, "records", stream=self.stream, output=True)
        _require_records(rv, "records", batch.total_rows, f"draft_offsets[R] + R = {batch.total_rows} rows")
        _require_memory([("records", rv)], batch.memory, like="the batch's index arrays")
        self._call(_capi.flashspec_verify_shard, head.raw, c_batch, rv.address)
        self._sync_host_outputs(batch.memory)

    def finalize_shards(self, batch, records, *, out=None):
        """Algorithm 1 on the gathered records of every rank for this batch:
        ``records`` is uint8 [num_shards, rows, SHARD_RECORD_BYTES] (or
        [num_shards, rows * SHARD_RECORD_BYTES]), rank order, rows =
        draft_offsets[R] + R exactly. Emits what verify_and_finalize on the
        whole head would; ``out`` as for finalize."""
        c_batch, result, c_result = self._batch_and_result(batch, out)
        rv = _arrays.records(records, "records", stream=self.stream)
        num_shards, _ = _gathered_records_shape(rv, "records", rows=batch.total_rows)
        _require_memory([("records", rv)], batch.memory, like="the batch's index arrays")
        self._call(_capi.flashspec_finalize_shards, c_batch, rv.address, num_shards, c_result)
        self._sync_host_outputs(batch.memory, result.memory)
        return result

    # ---- verify / finalize -------------------------------------------------
    def verify(self, head, batch, summaries):
        """One pass over W for the batch, writing only the per-row summaries."""
        c_batch = batch.c_batch(self.stream, cuda_context=self.backend == "cuda")
        batch.check_vocab(head.vocab_size)
        self._call(_capi.flashspec_verify, head.raw, c_batch, summaries.raw)

    def finalize(self, batch, summaries, *, out=None):
        """Algorithm 1 on the summaries of the last verify of this batch.
        ``out`` (a VerifyResult) is written in place; its arrays are checked
        against the batch first."""
        c_batch, result, c_result = self._batch_and_result(batch, out)
        self._call(_capi.flashspec_finalize, c_batch, summaries.raw, c_result)
        self._sync_host_outputs(batch.memory, result.memory)
        return result

    def verify_and_finalize(self, head, batch, *, out=None):
        """verify then finalize with summaries the context keeps."""
        c_batch, result, c_result = self._batch_and_result(batch, out)
        batch.check_vocab(head.vocab_size)
        self._call(_capi.flashspec_verify_and_finalize, head.raw, c_batch, c_result)
        self._sync_host_outputs(batch.memory, result.memory)
        return result

    def _batch_and_result(self, batch, out):
        # Every length is checked (by c_batch and c_result) before the call.
        c_batch = batch.c_batch(self.stream, cuda_context=self.backend == "cuda")
        result = out if out is not None else VerifyResult.like(batch, self.stream)
        return c_batch, result, result.c_result(self.stream, batch)


def _draft_controls(controls, head, rows, memory, device, stream, upload):
    """The flashspec_sampling_controls of a draft call's per-row controls (a
    SamplingControls or None) in the call's memory, and the arrays it points
    at (keep them alive for the call): None, None without controls."""
    if controls is None:
        return None, None
    controls.check_vocab(head.vocab_size, "controls")
    return controls.c_controls(rows, rows, "controls", per="rows", mask_source=f"the {rows} rows",
                               memory=memory, device=device, stream=stream, upload=upload)


def _draft_params(memory, temperature, views):
    """The flashspec_draft_params of the per-row array views (name -> View)."""
    params = _capi.flashspec_draft_params()
    _capi.flashspec_draft_params_init(params)
    params.memory = memory
    params.temperature = temperature
    for name, v in views.items():
        setattr(params, name, v.address)
    return params


def _require_records(v, name, rows, what):
    """ValueError unless the records View v, [rows, SHARD_RECORD_BYTES] or
    flat, holds at least ``rows`` records (the library writes that many);
    ``what`` says where rows comes from."""
    if len(v.shape) == 2 and v.shape[1] != SHARD_RECORD_BYTES or len(v.shape) not in (1, 2):
        raise ValueError(f"{name}: expected [rows, {SHARD_RECORD_BYTES}] or a flat array, got shape {v.shape}")
    needed = rows * SHARD_RECORD_BYTES
    if v.size < needed:
        raise ValueError(f"{name} has {v.size} bytes, fewer than {what} * {SHARD_RECORD_BYTES} = {needed}")


def _gathered_records_shape(v, name, rows=None):
    """(num_shards, rows) of gathered records, the View v: [num_shards, rows,
    SHARD_RECORD_BYTES] or [num_shards, rows * SHARD_RECORD_BYTES]. With
    ``rows``, the records must be exactly that many per shard."""
    if len(v.shape) == 3 and v.shape[2] == SHARD_RECORD_BYTES:
        shards, per_shard = v.shape[0], v.shape[1]
    elif len(v.shape) == 2 and v.shape[1] % SHARD_RECORD_BYTES == 0:
        shards, per_shard = v.shape[0], v.shape[1] // SHARD_RECORD_BYTES
    else:
        raise ValueError(f"{name}: expected [num_shards, rows, {SHARD_RECORD_BYTES}] or [num_shards, rows * "
                         f"{SHARD_RECORD_BYTES}], got shape {v.shape}")
    if rows is not None and per_shard != rows:
        raise ValueError(f"{name} has {per_shard} records per shard ({v.size} bytes over {shards} shards), "
                         f"expected draft_offsets[R] + R = {rows}")
    return shards, per_shard


def _common_memory(views, default):
    memories = {v.memory for v in views}
    if len(memories) > 1:
        raise ValueError("index arrays must all live in host memory or all on the device")
    return memories.pop() if memories else default


def _require_memory(named_views, memory, like="the other index arrays"):
    for name, v in named_views:
        if v.memory != memory:
            where = "the device" if memory == _arrays.CUDA else "host memory"
            raise ValueError(f"{name} must live in {where}, like {like}")


def _require_rows(name, v, rows):
    _require_entries(name, v, rows, f"the {rows} rows")


def _require_entries(name, v, count, what):
    """ValueError unless the 1-D view v has at least count entries (the C
    library reads count of them); ``what`` says where count comes from."""
    if v.shape[0] < count:
        raise ValueError(f"{name} has {v.shape[0]} entries, fewer than {what}")


class LMHead(_Handle):
    """An uploaded LM head (immutable). borrow=True keeps a device W by
    pointer (CUDA backend); the array is then kept alive by this object.
    With vocab_begin and global_vocab_size (both or neither), W holds the
    vocabulary slice [vocab_begin, vocab_begin + W rows) of a sharded head.
    With stored ("e4m3" or "int8"), an 8-bit head: see
    Context.lm_head_quantized."""

    _destroy = staticmethod(_capi.flashspec_lm_head_destroy)

    def __init__(self, context, weight, *, borrow=False, vocab_begin=None, global_vocab_size=None,
                 stored=None, scales=None):
        if (vocab_begin is None) != (global_vocab_size is None):
            raise ValueError("vocab_begin and global_vocab_size: give both (a shard head) or neither")
        if stored is None and scales is not None:
            raise ValueError("scales are for an 8-bit head: pass stored too")
        if stored is not None and vocab_begin is not None:
            raise ValueError("an 8-bit head is unsharded: pass stored or vocab_begin, not both")
        if stored is None:
            wv, sv = _arrays.tensor(weight, "weight", stream=context.stream), None
        else:
            stored = _stored_dtype(stored)
            wv = _arrays.code_tensor(weight, "weight", stream=context.stream)
            sv = None if scales is None else _arrays.scale_tensor(scales, "scales", stream=context.stream)
        flags = _capi.FLASHSPEC_LM_HEAD_BORROW if borrow else _capi.FLASHSPEC_LM_HEAD_COPY
        with context._lock:
            if stored is not None:
                status, raw = _capi.flashspec_lm_head_create_quantized(
                    context.raw, _arrays.c_tensor(wv), None if sv is None else _arrays.c_tensor(sv), stored, flags)
            elif vocab_begin is None:
                status, raw = _capi.flashspec_lm_head_create(context.raw, _arrays.c_tensor(wv), flags)
            else:
                status, raw = _capi.flashspec_lm_head_create_shard(context.raw, _arrays.c_tensor(wv), flags,
                                                                   vocab_begin, global_vocab_size)
            check(status, context.raw)
        super().__init__(raw)
        self.context = context
        self._borrowed = wv if borrow else None
        if not borrow and wv.memory == _arrays.CUDA:
            # The device-to-device copy is asynchronous: W must outlive it.
            context.synchronize()
        context._children.add(self)

    @property
    def vocab_size(self):
        return _capi.flashspec_lm_head_vocab_size(self.raw)

    @property
    def hidden_size(self):
        return _capi.flashspec_lm_head_hidden_size(self.raw)

    @property
    def dtype(self):
        """The stored dtype: "float32", "bfloat16" or "float16" (as given to
        lm_head), or "e4m3" / "int8" for an 8-bit head."""
        return _DTYPE_NAMES[_capi.flashspec_lm_head_dtype(self.raw)]

    @property
    def vocab_begin(self):
        """The global id of the head's first token (0 unless a shard)."""
        return _capi.flashspec_lm_head_vocab_begin(self.raw)

    @property
    def global_vocab_size(self):
        """The size of the global vocabulary (vocab_size unless a shard)."""
        return _capi.flashspec_lm_head_global_vocab_size(self.raw)


class Summaries(_Handle):
    """Per-row summaries written by verify and read by finalize."""

    _destroy = staticmethod(_capi.flashspec_summaries_destroy)

    def __init__(self, context, max_rows, max_requests):
        with context._lock:
            status, raw = _capi.flashspec_summaries_create(context.raw, max_rows, max_requests)
            check(status, context.raw)
        super().__init__(raw)
        self.context = context
        context._children.add(self)


class VerifyBatch:
    """A ragged batch of requests to verify (see flashspec_verify_batch).

    draft_offsets: [R+1] int32; draft_tokens: [offsets[R]] int32;
    target_hidden: [offsets[R] + R, d]; draft_logits: None (greedy drafts)
    or [offsets[R], V]. Per-request arrays are optional. Index arrays must
    all be host arrays (numpy, lists) or all device arrays.

    draft_parents: None (each request's drafts are a chain) or
    [offsets[R]] int32, a tree: node k of request r has parent
    draft_parents[offsets[r] + k] in [-1, k) (-1: the root), and target row
    k + 1 of the request is the target after the path to node k (tree
    verify, see flashspec.h). With draft_logits or a sparse support the
    tree's children are stochastic candidates (SpecInfer's multi-step
    speculative sampling, CPU backend).

    draft_support_offsets / draft_support_tokens / draft_support_probs: a
    sparse q per draft row instead of draft_logits (all three or none):
    offsets [offsets[R] + 1] int32, then tokens (int32) and probs (float32)
    of support_offsets[offsets[R]] entries each; row k's support is entries
    [support_offsets[k], support_offsets[k + 1]), 1..MAX_DRAFT_SUPPORT
    distinct tokens whose probabilities sum to 1 (see flashspec.h, "Sparse
    draft distributions"). A point-mass draft is the support {x} with q = 1.

    Every size is checked before the library is called (ValueError naming
    the array): temperatures, draft_temperatures, seeds, request_ids and
    steps need R entries, draft_tokens, draft_parents and accept_uniforms
    offsets[R], target_hidden offsets[R] + R rows and draft_logits offsets[R] rows
    (longer 1-D arrays are allowed; their first entries are read). With host
    index arrays offsets[R] is read from draft_offsets; device offsets
    cannot be read without a sync, so there offsets[R] is taken as
    target_hidden's rows − R, and the library checks the offsets themselves
    on the device. Empty arrays (no drafts) are passed as NULL.

    ``controls`` (a SamplingControls) define the target distribution p of
    each request (per-request values: R entries; mask: one row per target
    row, offsets[R] + R); ``draft_controls`` the controls a stochastic
    draft's q was sampled under (mask: one row per draft_logits row,
    offsets[R]). ``greedy=True``: every request's target is greedy (T = 0),
    as temperatures of 0 make it, without an array (temperatures must be
    None); with device arrays it lets the CUDA backend take its kernels
    for greedy rows (see flashspec.h, "Greedy batches"). ``logprobs=True``
    returns the emitted tokens' logprobs
    (VerifyResult.logprobs, .raw_logprobs); ``top_logprobs=n`` (at most
    MAX_TOP_LOGPROBS) each slot's n tokens of largest raw logit
    (.top_tokens, .top_logprobs). With device index arrays (CUDA backend)
    the controls go to the device too (see SamplingControls).
    """

    _ARRAYS = (("draft_offsets", "int32"), ("draft_tokens", "int32"), ("temperatures", "float32"),
               ("draft_temperatures", "float32"), ("seeds", "uint64"), ("request_ids", "uint64"),
               ("steps", "uint64"), ("accept_uniforms", "float32"), ("draft_parents", "int32"),
               ("draft_support_offsets", "int32"), ("draft_support_tokens", "int32"),
               ("draft_support_probs", "float32"))

    def __init__(self, draft_offsets, draft_tokens, target_hidden, *, draft_logits=None,
                 temperatures=None, draft_temperatures=None, seeds=None, request_ids=None,
                 steps=None, accept_uniforms=None, max_draft_len=0, controls=None, draft_controls=None,
                 logprobs=False, top_logprobs=0, draft_parents=None, draft_support_offsets=None,
                 draft_support_tokens=None, draft_support_probs=None, greedy=False):
        given = dict(draft_offsets=draft_offsets, draft_tokens=draft_tokens, temperatures=temperatures,
                     draft_temperatures=draft_temperatures, seeds=seeds, request_ids=request_ids,
                     steps=steps, accept_uniforms=accept_uniforms, draft_parents=draft_parents,
                     draft_support_offsets=draft_support_offsets, draft_support_tokens=draft_support_tokens,
                     draft_support_probs=draft_support_probs)
        self._inputs = {k: v for k, v in given.items() if v is not None}
        self.target_hidden = target_hidden
        self.draft_logits = draft_logits
        self.max_draft_len = max_draft_len
        for name, value in (("controls", controls), ("draft_controls", draft_controls)):
            if value is not None and not isinstance(value, SamplingControls):
                raise TypeError(f"{name}: expected a SamplingControls, got {type(value).__name__}")
        self.controls = controls
        self.draft_controls = draft_controls
        self.logprobs = bool(logprobs)
        self.top_logprobs = int(top_logprobs)
        self.greedy = bool(greedy)
        self._stream = None
        self._built = None

    def c_batch(self, stream, cuda_context=True):
        """The flashspec_verify_batch (built once per stream; keeps its views)."""
        if self._built is not None and self._stream == stream:
            return self._built[0]
        views = {name: _arrays.vector(self._inputs[name], name, dtype, stream=stream)
                 for name, dtype in self._ARRAYS if name in self._inputs}
        memory = _common_memory(views.values(), default=_arrays.HOST)
        hidden = _arrays.tensor(self.target_hidden, "target_hidden", stream=stream)
        logits = (_arrays.tensor(self.draft_logits, "draft_logits", stream=stream)
                  if self.draft_logits is not None else None)
        offsets = views["draft_offsets"]
        drafts = _check_batch_sizes(views, hidden, logits)
        controls = {}
        if (self.controls is not None or self.draft_controls is not None) and drafts is not None:
            requests = offsets.shape[0] - 1
            where = dict(memory=memory, device=hidden.device, stream=stream, upload=cuda_context)
            if self.controls is not None:
                controls["controls"] = self.controls.c_controls(
                    requests, hidden.shape[0], "controls", mask_source=f"draft_offsets[R] + R = {hidden.shape[0]}",
                    **where)
            if self.draft_controls is not None:
                controls["draft_controls"] = self.draft_controls.c_controls(
                    requests, drafts, "draft_controls", mask_source=f"draft_offsets[R] = {drafts}", **where)
        if logits is not None and logits.shape[0] == 0:
            logits = None  # no drafts: nothing to score against
        batch = _capi.flashspec_verify_batch()
        _capi.flashspec_verify_batch_init(batch)
        batch.memory = memory
        batch.num_requests = offsets.shape[0] - 1
        for name, v in views.items():
            setattr(batch, name, v.address if v.size else None)
        hidden_c = _arrays.c_tensor(hidden)
        batch.target_hidden = hidden_c
        logits_c = _arrays.c_tensor(logits) if logits is not None else None
        batch.draft_logits = logits_c
        batch.max_draft_len = self.max_draft_len
        for name, (c_controls, _keep) in controls.items():
            setattr(batch, name, c_controls)
        batch.logprobs = 1 if self.logprobs else 0
        batch.top_logprobs = self.top_logprobs
        batch.greedy = 1 if self.greedy else 0
        self.memory = memory
        self._proto = offsets
        self.num_requests = batch.num_requests
        self.total_rows = hidden.shape[0]
        self._built = (batch, views, hidden, logits, hidden_c, logits_c, controls)
        self._stream = stream
        return batch

    @property
    def draft_offsets(self):
        return self._inputs["draft_offsets"]

    @property
    def draft_parents(self):
        """The tree's parent array, or None for chains."""
        return self._inputs.get("draft_parents")

    def check_vocab(self, vocab):
        """ValueError unless a bool token mask has one column per token."""
        for name in ("controls", "draft_controls"):
            controls = getattr(self, name)
            if controls is not None:
                controls.check_vocab(vocab, name)


def _read_int32(v, index):
    """Entry index of a contiguous host int32 View (any host producer)."""
    return ctypes.c_int32.from_address(v.address + 4 * index).value


def _check_batch_sizes(views, hidden, logits):
    """Raise ValueError unless every array of the batch is as long as the C
    library will read. R comes from draft_offsets' length; offsets[R] from
    its last entry (host) or from target_hidden's rows (device). Returns
    offsets[R] (None when R < 1, which the library refuses unread)."""
    offsets = views["draft_offsets"]
    requests = offsets.shape[0] - 1
    if requests < 1:
        return None  # the library refuses num_requests < 1 before reading any array
    rows = hidden.shape[0]
    if offsets.memory == _arrays.HOST:
        drafts = _read_int32(offsets, requests)
        if drafts < 0 or rows != drafts + requests:
            raise ValueError(f"target_hidden has {rows} rows, expected draft_offsets[R] + R = {drafts + requests}")
        source = f"draft_offsets[R] = {drafts}"
    else:
        if rows < requests:
            raise ValueError(f"target_hidden has {rows} rows, fewer than the {requests} requests "
                             "(one row per request at least)")
        drafts = rows - requests
        source = f"draft_offsets[R] = {drafts} (target_hidden rows - R)"
    _require_entries("draft_tokens", views.get("draft_tokens", _EMPTY), drafts, source)
    for name in ("accept_uniforms", "draft_parents"):
        if name in views:
            _require_entries(name, views[name], drafts, source)
    for name in ("temperatures", "draft_temperatures", "seeds", "request_ids", "steps"):
        if name in views:
            _require_entries(name, views[name], requests, f"the {requests} requests")
    if logits is not None and logits.shape[0] != drafts:
        raise ValueError(f"draft_logits has {logits.shape[0]} rows, expected {source}")
    _check_support_sizes(views, drafts, source)
    return drafts


_SUPPORT = ("draft_support_offsets", "draft_support_tokens", "draft_support_probs")


def _check_support_sizes(views, drafts, source):
    """ValueError unless the sparse support arrays come together and are as
    long as the library reads: offsets[R] + 1 offsets, then as many tokens
    and probabilities as the last offset says (device offsets: that entry
    is copied to the host after a device synchronise, the one sync a
    device batch with sparse supports costs)."""
    given = [name for name in _SUPPORT if name in views]
    if not given:
        return
    missing = [name for name in _SUPPORT if name not in views]
    if missing:
        raise ValueError(f"{missing[0]}: needed with {given[0]} (a sparse q takes all three arrays)")
    support = views["draft_support_offsets"]
    _require_entries("draft_support_offsets", support, drafts + 1, f"{source}, plus 1")
    if support.memory == _arrays.HOST:
        entries = _read_int32(support, drafts)
    else:
        entries = _arrays.read_device_int32(support, drafts)
    if entries < 0:
        raise ValueError(f"draft_support_offsets[{drafts}] is {entries}, below 0")
    for name in ("draft_support_tokens", "draft_support_probs"):
        _require_entries(name, views[name], entries, f"draft_support_offsets[{drafts}] = {entries}")


class _Empty:
    shape = (0,)


_EMPTY = _Empty()


class VerifyResult:
    """accepted_counts [R], emitted_tokens [offsets[R] + R] and next_steps [R]
    (optional), by default in the memory of the batch's index arrays. Given
    arrays (``out=``) are written in place: each must be at least that long,
    contiguous, writable and of its dtype (int32, int32, uint64 or int64);
    nothing is copied or converted.

    For a batch with ``logprobs=True``: ``logprobs`` (float32 [offsets[R] +
    R], log p of each emitted token under the controlled target
    distribution it was verified against; 0 for a T = 0 row) and
    ``raw_logprobs`` (log softmax of the raw logits). For ``top_logprobs=n``:
    ``top_tokens`` (int32) and ``top_logprobs`` (float32), [offsets[R] + R,
    n], each slot's n tokens of largest raw logit (ties: smaller id) and
    their raw logprobs. Slots are indexed as emitted_tokens; a slot past a
    request's emitted tokens holds NaN (logprobs) and -1 (tokens). Given as
    ``out=``, the top arrays are [rows, n] or flat with rows * n entries.
    Each is None when not asked for.

    ``accepted_nodes`` (int32 [offsets[R] + R], optional; like() allocates
    it for a batch with draft_parents): slot k < accepted_counts[r] of
    request r holds the node index of its k-th accepted draft, -1 the rest
    (a chain's accepted draft k is node k).
    """

    _OUTPUTS = (("logprobs", "float32"), ("raw_logprobs", "float32"), ("top_tokens", "int32"),
                ("top_logprobs", "float32"), ("accepted_nodes", "int32"))
    # The outputs with one entry per slot of emitted_tokens.
    _PER_SLOT = ("logprobs", "raw_logprobs", "accepted_nodes")

    def __init__(self, accepted_counts, emitted_tokens, next_steps=None, *, logprobs=None, raw_logprobs=None,
                 top_tokens=None, top_logprobs=None, accepted_nodes=None, draft_offsets=None):
        self.accepted_counts = accepted_counts
        self.emitted_tokens = emitted_tokens
        self.next_steps = next_steps
        self.logprobs = logprobs
        self.raw_logprobs = raw_logprobs
        self.top_tokens = top_tokens
        self.top_logprobs = top_logprobs
        self.accepted_nodes = accepted_nodes
        self._draft_offsets = draft_offsets
        self._top_n = None
        self.memory = None

    @classmethod
    def like(cls, batch, stream=0):
        """Outputs sized for batch, in the memory of its draft_offsets
        (with the logprob arrays the batch asks for, and accepted_nodes for
        a tree)."""
        batch.c_batch(stream)
        count, total = max(batch.num_requests, 0), max(batch.total_rows, 0)
        make = lambda shape, dtype: _arrays.empty_like_memory(batch._proto, shape, dtype)  # noqa: E731
        extra = {}
        if batch.logprobs:
            extra["logprobs"] = make((total,), "float32")
            extra["raw_logprobs"] = make((total,), "float32")
        n = batch.top_logprobs
        if 0 < n <= _capi.FLASHSPEC_MAX_TOP_LOGPROBS:  # else the library refuses the batch
            extra["top_tokens"] = make((total, n), "int32")
            extra["top_logprobs"] = make((total, n), "float32")
        if batch.draft_parents is not None:
            extra["accepted_nodes"] = make((total,), "int32")
        return cls(make((count,), "int32"), make((total,), "int32"), make((count,), "uint64"),
                   draft_offsets=batch.draft_offsets, **extra)

    def c_result(self, stream, batch=None):
        """The flashspec_verify_result; with ``batch``, each array is first
        checked to hold what the library writes for that batch."""
        result = _capi.flashspec_verify_result()
        _capi.flashspec_verify_result_init(result)
        views = [_arrays.vector(self.accepted_counts, "accepted_counts", "int32", stream=stream, output=True),
                 _arrays.vector(self.emitted_tokens, "emitted_tokens", "int32", stream=stream, output=True)]
        if self.next_steps is not None:
            views.append(_arrays.vector(self.next_steps, "next_steps", "uint64", stream=stream, output=True))
        extra = {name: _output_array(getattr(self, name), name, dtype, stream)
                 for name, dtype in self._OUTPUTS if getattr(self, name) is not None}
        _require_memory([("result arrays", v) for v in views[1:] + list(extra.values())], views[0].memory)
        if batch is not None:
            batch.c_batch(stream)
            requests, rows = batch.num_requests, batch.total_rows
            for name, v in zip(("accepted_counts", "emitted_tokens", "next_steps"), views):
                if name == "emitted_tokens":
                    _require_entries(name, v, rows, f"draft_offsets[R] + R = {rows}")
                else:
                    _require_entries(name, v, requests, f"the {requests} requests")
            # n outside [0, MAX_TOP_LOGPROBS]: the library refuses the batch
            # before writing anything.
            n = batch.top_logprobs if 0 <= batch.top_logprobs <= _capi.FLASHSPEC_MAX_TOP_LOGPROBS else 0
            self._top_n = n
            for name, v in extra.items():
                if name in self._PER_SLOT:
                    _require_entries(name, v, rows, f"draft_offsets[R] + R = {rows}")
                    continue
                if len(v.shape) == 2 and v.shape[1] != n:
                    raise ValueError(f"{name} has {v.shape[1]} columns, the batch asks for top_logprobs = {n}")
                if v.size < rows * n:
                    raise ValueError(f"{name} has {v.size} entries, fewer than (draft_offsets[R] + R) * "
                                     f"top_logprobs = {rows} * {n}")
        self.memory = views[0].memory
        result.memory = views[0].memory
        result.accepted_counts = views[0].address
        result.emitted_tokens = views[1].address
        result.next_steps = views[2].address if len(views) > 2 else None
        for name, _ in self._OUTPUTS:
            setattr(result, name, extra[name].address if name in extra else None)
        self._views = views + list(extra.values())
        return result

    def _slots(self, request):
        offsets = np.asarray(self._draft_offsets)
        counts = np.asarray(self.accepted_counts)
        start = int(offsets[request]) + request
        return start, int(counts[request]) + 1

    def tokens(self, request):
        """The emitted tokens of one request (host results): the accepted
        drafts, then the recovered or bonus token."""
        start, count = self._slots(request)
        return [int(t) for t in np.asarray(self.emitted_tokens)[start:start + count]]

    def token_logprobs(self, request, *, raw=False):
        """The logprobs of one request's emitted tokens (host results): under
        the controlled target distribution, or with raw=True under the raw
        logits. Needs a batch with logprobs=True."""
        array = self.raw_logprobs if raw else self.logprobs
        if array is None:
            raise ValueError("no logprobs: verify a batch with logprobs=True")
        start, count = self._slots(request)
        return [float(x) for x in np.asarray(array)[start:start + count]]

    def top(self, request):
        """For each emitted token of one request (host results), its row's
        top tokens as [(token, raw logprob), ...], largest first. Needs a
        batch with top_logprobs=n."""
        if self.top_tokens is None or self.top_logprobs is None:
            raise ValueError("no top logprobs: verify a batch with top_logprobs=n")
        start, count = self._slots(request)
        tokens, logprobs = np.asarray(self.top_tokens), np.asarray(self.top_logprobs)
        n = tokens.shape[1] if tokens.ndim == 2 else self._top_n
        if not n:
            return [[] for _ in range(count)]
        tokens = tokens.reshape(-1)[:(start + count) * n].reshape(-1, n)
        logprobs = logprobs.reshape(-1)[:(start + count) * n].reshape(-1, n)
        return [[(int(t), float(p)) for t, p in zip(tokens[slot], logprobs[slot])]
                for slot in range(start, start + count)]


def _output_array(obj, name, dtype, stream):
    """A contiguous output View of any shape (written in place)."""
    v = _arrays.view(obj, name, stream=stream, dtype=dtype, output=True)
    if len(v.shape) not in (1, 2):
        raise ValueError(f"{name}: expected a 1-D or 2-D array, got shape {v.shape}")
    if not v.is_contiguous():
        raise ValueError(f"{name}: outputs must be contiguous (they are written in place)")
    return v
