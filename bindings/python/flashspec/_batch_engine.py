"""The batched engine for Python: BatchEngine runs many sequences at once
(flashspec_batch_engine), the way a server's parallel slots share one model.

Callbacks are ctypes trampolines, as for Engine (see _engine.py): a Python
exception never crosses into C. What it ends follows the C API's rule:
- the target forward or rollback raising fails the whole step: ``step``
  raises CallbackError (its ``__cause__`` the exception), no sequence emits
  a token in that step and a later step repeats it;
- a sequence's own callback drafter raising ends that sequence alone (the
  library's CALLBACK status for it);
- a sequence's ``on_token`` raising also ends that sequence alone, after
  the token it was given: the library sees a host stop, and the binding
  reports the sequence as failed with CALLBACK and the exception.
KeyboardInterrupt and SystemExit raised by a callback are re-raised by the
call that ran it.
"""
import ctypes
import threading
from typing import NamedTuple

import numpy as np

from . import _arrays
from . import _engine
from . import capi as _capi
from ._engine import (DRAFT_LEN_RULES, POLICIES, Drafter, EngineMetrics, FinishReason, _address, _check_struct, _Failure,
                      _guarded, _int_tokens, _set_tensor, _Tensor)
from .errors import check, error_class

__all__ = ["BatchEngine", "BatchForward", "SequenceState"]


class _BatchTargetCall(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("num_sequences", ctypes.c_int32),
                ("sequence_ids", ctypes.POINTER(ctypes.c_uint64)), ("num_past", ctypes.POINTER(ctypes.c_int32)),
                ("token_offsets", ctypes.POINTER(ctypes.c_int32)), ("tokens", ctypes.POINTER(ctypes.c_int32)),
                ("row_offsets", ctypes.POINTER(ctypes.c_int32)), ("num_tokens", ctypes.c_int32),
                ("num_rows", ctypes.c_int32), ("step", ctypes.c_uint64), ("hidden", _Tensor),
                ("parents", ctypes.POINTER(ctypes.c_int32))]


_BATCH_FORWARD_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_BatchTargetCall))
_BATCH_ROLLBACK_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int32)
_BATCH_KEEP_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int32,
                                  ctypes.POINTER(ctypes.c_int32), ctypes.c_int32)
_SEQUENCE_TOKEN_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int32)


class BatchForward(NamedTuple):
    """One ragged target forward (flashspec_batch_target_call), as copies.

    Sequence s (in the order the sequences joined) is ``sequence_ids[s]``:
    drop its cached tokens beyond ``num_past[s]`` (0: a new sequence), append
    ``tokens_of(s)``, and give the hidden rows of its last ``rows_of(s)``
    tokens; they go at rows ``row_offsets[s] .. row_offsets[s + 1]`` of the
    ``[num_rows, d]`` array the callback returns. ``parents`` is None
    unless a sequence of this step drafted a tree; then one entry per token,
    per sequence those of Engine's ``parents`` for its own tokens (indices
    from its first token; a chain's all -1): run its tree with tree
    attention (see Tree steps in flashspec.h)."""
    sequence_ids: np.ndarray  # uint64 [S]
    num_past: np.ndarray      # int32 [S]
    token_offsets: np.ndarray  # int32 [S + 1]
    tokens: np.ndarray        # int32 [token_offsets[S]]
    row_offsets: np.ndarray   # int32 [S + 1]
    step: int
    parents: object = None    # int32 [token_offsets[S]] or None

    @property
    def num_rows(self):
        return int(self.row_offsets[-1])

    def tokens_of(self, s):
        return self.tokens[self.token_offsets[s]:self.token_offsets[s + 1]]

    def rows_of(self, s):
        return int(self.row_offsets[s + 1] - self.row_offsets[s])

    def parents_of(self, s):
        """Sequence s's parents (indices into tokens_of(s)), or None."""
        if self.parents is None:
            return None
        return self.parents[self.token_offsets[s]:self.token_offsets[s + 1]]


class SequenceState(NamedTuple):
    """Where a sequence stands: its emitted tokens, whether steps still run
    it, why it finished (NONE while active or after an error), the verify
    steps it took part in, and the error that ended it (a FlashSpecError
    whose ``__cause__`` is the callback's exception, if one raised) or None."""
    tokens: list
    active: bool
    finish_reason: FinishReason
    steps: int
    error: object


class _Sequence:
    """What the binding holds for one sequence while it is in the engine."""

    __slots__ = ("drafters", "token_tramp", "failure")

    def __init__(self, drafters, token_tramp, failure):
        self.drafters = drafters
        self.token_tramp = token_tramp  # called by the library until the sequence is removed
        self.failure = failure          # the first exception of its drafters or on_token


class BatchEngine:
    """Speculative decoding of many sequences in one engine
    (flashspec_batch_engine); each step runs ONE target forward over every
    active sequence and ONE verify pass.

    ``target_forward(call)`` gets a BatchForward and returns the hidden rows
    of every sequence, ``[call.num_rows, d]`` (float32, float16 or bfloat16
    host array; kept alive until the step ends). ``target_rollback(sequence_id,
    num_keep)`` (optional) truncates one sequence's cache after a rejection;
    ``target_keep(sequence_id, num_past, keep)`` (optional) keeps a
    sequence's accepted path after its tree steps, as Engine's.

    Each sequence brings ``num_drafters`` drafters of its own
    (``add_sequence(..., drafters=)``); ``arms`` lists (drafter index,
    draft_len) pairs, an index into those lists (None for a k = 0 arm);
    None gives one arm per drafter of length ``default_draft_len``. Each
    sequence runs its own bandit of kind ``policy``; the other arguments
    mean what they mean for Engine. ``max_sequences`` (0: as many as the
    context's workspace holds) bounds the sequences in the engine at once.
    ``draft_len_rule`` "adaptive" (with ``draft_len_memory``) picks each
    step's k as Engine does, from acceptance estimates each sequence keeps
    for its own drafters; "arm" drafts the arm's k.

    A sequence emits exactly the tokens Engine.generate emits for the same
    prompt, parameters and drafters, at any temperature.
    """

    _close_order = 0

    def __init__(self, context, head, target_forward, *, target_rollback=None, num_drafters=0, arms=None,
                 default_draft_len=4, policy="ucb1", bandit_seed=0, ucb_exploration=1.0, fixed_arm=0,
                 oracle_rewards=None, target_step_cost=1.0, target_row_cost=0.02, max_context=0, max_sequences=0,
                 draft_len_rule="arm", draft_len_memory=64.0, target_keep=None):
        if not callable(target_forward):
            raise TypeError("target_forward must be callable")
        if target_rollback is not None and not callable(target_rollback):
            raise TypeError("target_rollback must be callable or None")
        if target_keep is not None and not callable(target_keep):
            raise TypeError("target_keep must be callable or None")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {sorted(POLICIES)}, not {policy!r}")
        if draft_len_rule not in DRAFT_LEN_RULES:
            raise ValueError(f"draft_len_rule must be one of {sorted(DRAFT_LEN_RULES)}, not {draft_len_rule!r}")
        self._raw = None
        self.context = context
        self.head = head
        self.num_drafters = int(num_drafters)
        self._target_forward = target_forward
        self._target_rollback = target_rollback
        self._target_keep = target_keep
        self._failure = _Failure()
        self._held = None  # the hidden rows of the current step
        self._sequences = {}
        self._lock = threading.RLock()
        self._forward_tramp = _BATCH_FORWARD_FN(_guarded(self._failure, "target forward", self._forward))
        self._rollback_tramp = (_BATCH_ROLLBACK_FN(_guarded(self._failure, "target rollback", self._rollback))
                                if target_rollback is not None else None)
        self._keep_tramp = (_BATCH_KEEP_FN(_guarded(self._failure, "target keep", self._keep))
                            if target_keep is not None else None)

        params = _capi.flashspec_batch_engine_params()
        _capi.flashspec_batch_engine_params_init(params)
        params.target_forward = _address(self._forward_tramp)
        params.target_rollback = _address(self._rollback_tramp) if self._rollback_tramp else None
        params.target_keep = _address(self._keep_tramp) if self._keep_tramp else None
        params.num_drafters = self.num_drafters
        self.arms = None
        if arms is not None:
            table = []
            for arm in arms:
                drafter, draft_len = arm
                if drafter is None and int(draft_len) != 0:
                    raise ValueError(f"arm {arm!r}: only a k = 0 arm has no drafter")
                table.append((-1 if drafter is None else int(drafter), int(draft_len)))
            self.arms = tuple(table)
            self._arm_array = np.array(table or [(0, 0)], dtype=np.int32).reshape(-1, 2)
            params.arms = self._arm_array.ctypes.data if table else None
            params.num_arms = len(table)
        params.default_draft_len = default_draft_len
        params.policy = POLICIES[policy]
        params.bandit_seed = bandit_seed
        params.ucb_exploration = ucb_exploration
        params.fixed_arm = fixed_arm
        if oracle_rewards is not None:
            self._oracle = np.ascontiguousarray(oracle_rewards, dtype=np.float64).reshape(-1)
            # The library reads one reward per arm: the arms given, else one
            # per drafter (at least one).
            num_arms = params.num_arms or max(self.num_drafters, 1)
            if policy == "oracle" and self._oracle.size < num_arms:
                raise ValueError(f"oracle_rewards has {self._oracle.size} entries, fewer than the {num_arms} arms")
            params.oracle_rewards = self._oracle.ctypes.data
        params.target_step_cost = target_step_cost
        params.target_row_cost = target_row_cost
        params.max_context = max_context
        params.max_sequences = max_sequences
        params.draft_len_rule = DRAFT_LEN_RULES[draft_len_rule]
        params.draft_len_memory = draft_len_memory
        with context._lock:
            status, raw = _capi.flashspec_batch_engine_create(context.raw, head.raw, params)
            check(status, context.raw)
        self._raw = raw
        context._children.add(self)

    # ---- handle ------------------------------------------------------------
    @property
    def raw(self):
        if self._raw is None:
            raise ValueError("BatchEngine is closed")
        return self._raw

    @property
    def closed(self):
        return self._raw is None

    @property
    def sequence_ids(self):
        """The ids of the sequences in the engine, in the order they joined."""
        return tuple(self._sequences)

    def close(self):
        """Destroy the engine; every sequence's drafters are released (close
        them, or give them to another sequence or engine). Idempotent."""
        raw, self._raw = self._raw, None
        if raw is not None:
            with self.context._lock:
                _capi.flashspec_batch_engine_destroy(raw)
            sequences, self._sequences = self._sequences, {}
            for seq in sequences.values():
                for d in seq.drafters:
                    d._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---- callbacks ---------------------------------------------------------
    def _forward(self, _user_data, call_ptr):
        call = call_ptr.contents
        _check_struct(call, _BatchTargetCall, "target forward")
        self._held = None
        s = call.num_sequences
        batch = BatchForward(np.ctypeslib.as_array(call.sequence_ids, (s,)).copy(),
                             np.ctypeslib.as_array(call.num_past, (s,)).copy(),
                             np.ctypeslib.as_array(call.token_offsets, (s + 1,)).copy(),
                             np.ctypeslib.as_array(call.tokens, (call.num_tokens,)).copy(),
                             np.ctypeslib.as_array(call.row_offsets, (s + 1,)).copy(), int(call.step),
                             np.ctypeslib.as_array(call.parents, (call.num_tokens,)).copy() if call.parents else None)
        view = _arrays.tensor(self._target_forward(batch), "target forward: hidden")
        self._held = view
        _set_tensor(call.hidden, view)

    def _rollback(self, _user_data, sequence_id, num_keep):
        self._target_rollback(int(sequence_id), int(num_keep))

    def _keep(self, _user_data, sequence_id, num_past, keep, num_keep):
        self._target_keep(int(sequence_id), int(num_past),
                          np.ctypeslib.as_array(keep, (num_keep,)).copy() if num_keep else np.zeros(0, dtype=np.int32))

    # ---- sequences ---------------------------------------------------------
    def add_sequence(self, sequence_id, prompt, *, drafters=(), temperature=1.0, seed=0, request_id=0,
                     max_tokens=256, stop_tokens=(), on_token=None):
        """Add a sequence with the host's ``sequence_id`` (an integer in
        [0, 2^64)) and ``prompt``; it joins at the next step. ``drafters``
        are this sequence's own Drafter objects, ``num_drafters`` of them,
        none created with logits=True; each serves this sequence until it
        is removed. ``on_token(sequence_id, token)`` is called for each
        token as it is emitted; a true return value finishes the sequence
        (FinishReason.HOST_STOP). The other arguments mean what they mean
        for Engine.generate. Raises the status's FlashSpecError (the
        engine unchanged) on bad input."""
        if on_token is not None and not callable(on_token):
            raise TypeError("on_token must be callable or None")
        sequence_id = int(sequence_id)
        if not 0 <= sequence_id < 1 << 64:
            raise OverflowError(f"sequence_id {sequence_id} is outside [0, 2^64)")
        drafters = list(drafters)
        for d in drafters:
            if not isinstance(d, Drafter):
                raise TypeError(f"drafters must be Drafter objects, not {type(d).__name__}")
            if d.context is not self.context:
                raise ValueError("a drafter was created on another context")
        prompt_arr = np.ascontiguousarray(_int_tokens(prompt, "prompt"))
        stops = np.ascontiguousarray(_int_tokens(list(stop_tokens), "stop_tokens"))
        drafter_array = np.array([int(d.raw) for d in drafters] or [0], dtype=np.uintp)
        token_failure = _Failure()
        token_tramp = None
        if on_token is not None:
            def emit(_user_data, seq_id, token):
                return 1 if on_token(int(seq_id), int(token)) else 0
            token_tramp = _SEQUENCE_TOKEN_FN(_guarded(token_failure, "token callback", emit))

        params = _capi.flashspec_sequence_params()
        _capi.flashspec_sequence_params_init(params)
        params.drafters = drafter_array.ctypes.data if drafters else None
        params.num_drafters = len(drafters)
        params.temperature = temperature
        params.seed = seed
        params.request_id = request_id
        params.max_tokens = max_tokens
        params.stop_tokens = stops.ctypes.data if stops.size else None
        params.num_stop_tokens = int(stops.size)
        params.on_token = _address(token_tramp) if token_tramp else None
        with self._lock, self.context._lock:
            check(_capi.flashspec_batch_engine_add_sequence(self.raw, sequence_id, prompt_arr.ctypes.data,
                                                            int(prompt_arr.size), params), self.context.raw)
            self._sequences[sequence_id] = _Sequence(tuple(drafters), token_tramp, token_failure)
            for d in drafters:
                d._in_use = True

    def remove_sequence(self, sequence_id):
        """Remove a sequence, active (cancelling it) or finished, and
        release its drafters; its tokens, state and metrics go with it (its
        steps stay in the engine's totals). Raises OutOfRangeError for an
        id not in the engine."""
        sequence_id = self._sequence_key(sequence_id)
        with self._lock, self.context._lock:
            check(_capi.flashspec_batch_engine_remove_sequence(self.raw, sequence_id), self.context.raw)
            seq = self._sequences.pop(sequence_id, None)
        if seq is not None:
            for d in seq.drafters:
                d._release()

    def step(self):
        """Run one step for every active sequence; returns how many are
        still active. A sequence's own failure ends that sequence (see
        ``sequence``) and is not raised here. Raises the status's
        FlashSpecError when the step as a whole fails (CallbackError when
        the target forward or rollback raised, chained to the exception):
        then no sequence emitted a token and a later step repeats it."""
        active = np.zeros(1, dtype=np.int32)
        with self._lock, self.context._lock:
            raw = self.raw
            self._failure.clear()
            try:
                status = _capi.flashspec_batch_engine_step(raw, active.ctypes.data)
                message = _capi.flashspec_context_last_error(self.context.raw) if status else ""
            finally:
                self._held = None
            cause = (self._failure.where, self._failure.exception) if self._failure.exception else None
            self._failure.clear()
            # A sequence's own callback that raised has ended that sequence:
            # keep its exception for sequence(); re-raise the host's interrupts.
            for seq in self._sequences.values():
                for d in seq.drafters:
                    failure = d._take_failure()
                    if failure is not None:
                        seq.failure.record(*failure)
                if seq.failure.exception is not None and not isinstance(seq.failure.exception, Exception):
                    interrupt, seq.failure.exception = seq.failure.exception, None
                    raise interrupt
        if status != _capi.FLASHSPEC_OK:
            if cause is not None:
                message = f"{message} ({cause[0]} raised {type(cause[1]).__name__}: {cause[1]})"
                if not isinstance(cause[1], Exception):
                    raise cause[1]
            raise error_class(status)(status, message) from (cause[1] if cause is not None else None)
        return int(active[0])

    def run(self):
        """Step until no sequence is active."""
        while self.step():
            pass

    def sequence(self, sequence_id):
        """A SequenceState for the sequence. Raises OutOfRangeError for an id
        not in the engine."""
        sequence_id = self._sequence_key(sequence_id)
        with self._lock, self.context._lock:
            raw = self.raw
            info = _capi.flashspec_sequence_info()
            _capi.flashspec_sequence_info_init(info)
            check(_capi.flashspec_batch_engine_get_sequence(raw, sequence_id, None, 0, info), self.context.raw)
            out = np.zeros(max(info.num_tokens, 1), dtype=np.int32)
            check(_capi.flashspec_batch_engine_get_sequence(raw, sequence_id, out.ctypes.data, info.num_tokens,
                                                            info), self.context.raw)
            message = _capi.flashspec_batch_engine_sequence_error(raw, sequence_id) or ""
            seq = self._sequences.get(sequence_id)
        tokens = [int(t) for t in out[:info.num_tokens]]
        status, reason, cause = info.status, FinishReason(info.finish_reason), None
        if seq is not None and seq.failure.exception is not None:
            where, cause = seq.failure.where, seq.failure.exception
            if status == _capi.FLASHSPEC_OK:
                # on_token can only ask to stop: its exception turns that
                # host stop into the sequence's failure.
                status, reason, message = _capi.FLASHSPEC_ERR_CALLBACK, FinishReason.NONE, f"{where}: reported failure"
            message = f"{message} ({where} raised {type(cause).__name__}: {cause})"
        error = None
        if status != _capi.FLASHSPEC_OK:
            error = error_class(status)(status, message)
            error.__cause__ = cause
        return SequenceState(tokens, bool(info.active), reason, int(info.steps), error)

    def _sequence_key(self, sequence_id):
        sequence_id = int(sequence_id)
        if not 0 <= sequence_id < 1 << 64:
            raise OverflowError(f"sequence_id {sequence_id} is outside [0, 2^64)")
        return sequence_id

    # ---- metrics -----------------------------------------------------------
    def metrics(self, sequence_id=None):
        """An EngineMetrics snapshot: totals over every sequence since the
        engine was created, with the arms summed over every sequence, or of
        ``sequence_id`` alone (no arms: the library sums them). The batched
        engine keeps no per-position counts: position_drafted and
        position_accepted are empty."""
        with self._lock, self.context._lock:
            raw = self.raw
            m = _capi.flashspec_engine_metrics()
            _capi.flashspec_engine_metrics_init(m)
            if sequence_id is None:
                check(_capi.flashspec_batch_engine_get_metrics(raw, m), self.context.raw)
            else:
                check(_capi.flashspec_batch_engine_get_sequence_metrics(raw, self._sequence_key(sequence_id), m),
                      self.context.raw)
            arms = []
            for i in range(m.num_arms if sequence_id is None else 0):
                a = _capi.flashspec_arm_metrics()
                _capi.flashspec_arm_metrics_init(a)
                check(_capi.flashspec_batch_engine_get_arm_metrics(raw, i, a), self.context.raw)
                arms.append(_engine._arm_metrics(a))
        return _engine._engine_metrics(m, (), (), arms)
