"""The speculative engine for Python: Engine, NgramDrafter, CallbackDrafter.

The engine runs on a CPU context and calls back into Python for the target
model (``target_forward``, optional ``target_rollback``), for callback
drafters and for streamed tokens (``on_token``). The callbacks are ctypes
trampolines whose addresses go through the SWIG layer as integers; each
object keeps its trampolines alive for as long as the C side may call them.

A Python exception inside a callback never crosses into C: the trampoline
stores it and returns a failure code, the engine call fails with
FLASHSPEC_ERR_CALLBACK, and ``generate`` raises ``CallbackError`` (its
``__cause__`` the original exception). KeyboardInterrupt and SystemExit are
re-raised as they are. The engine stays usable afterwards.
"""
import ctypes
import dataclasses
import enum
import threading
from typing import NamedTuple, Tuple

import numpy as np

from . import _arrays
from . import capi as _capi
from .errors import check, error_class

__all__ = ["Engine", "NgramDrafter", "SuffixDrafter", "CallbackDrafter", "Drafter", "FinishReason", "Generation",
           "EngineMetrics", "ArmMetrics", "POLICIES", "DRAFT_LEN_RULES"]

POLICIES = {"ucb1": _capi.FLASHSPEC_BANDIT_UCB1, "thompson": _capi.FLASHSPEC_BANDIT_THOMPSON,
            "fixed": _capi.FLASHSPEC_BANDIT_FIXED, "oracle": _capi.FLASHSPEC_BANDIT_ORACLE}
DRAFT_LEN_RULES = {"arm": _capi.FLASHSPEC_DRAFT_LEN_ARM, "adaptive": _capi.FLASHSPEC_DRAFT_LEN_ADAPTIVE}


class FinishReason(enum.IntEnum):
    """Why a generation stopped (flashspec_finish_reason)."""
    NONE = _capi.FLASHSPEC_FINISH_NONE
    LENGTH = _capi.FLASHSPEC_FINISH_LENGTH
    STOP_TOKEN = _capi.FLASHSPEC_FINISH_STOP_TOKEN
    HOST_STOP = _capi.FLASHSPEC_FINISH_HOST_STOP
    CONTEXT_FULL = _capi.FLASHSPEC_FINISH_CONTEXT_FULL
    CANCELLED = _capi.FLASHSPEC_FINISH_CANCELLED


# ---- the callback structs, as ctypes sees them ------------------------------
# Mirrors of flashspec.h; each trampoline checks the struct_size the library
# sets against ctypes.sizeof, so a drifted layout fails the call instead of
# reading the wrong fields.
class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("memory", ctypes.c_int),
                ("rows", ctypes.c_int64), ("cols", ctypes.c_int64), ("row_stride", ctypes.c_int64)]


class _DraftCall(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("context", ctypes.POINTER(ctypes.c_int32)),
                ("context_len", ctypes.c_int32), ("drafted", ctypes.POINTER(ctypes.c_int32)),
                ("num_drafted", ctypes.c_int32), ("max_tokens", ctypes.c_int32), ("step", ctypes.c_uint64),
                ("tokens", ctypes.POINTER(ctypes.c_int32)), ("num_tokens", ctypes.c_int32),
                ("logits", _Tensor), ("hidden", _Tensor), ("parents", ctypes.POINTER(ctypes.c_int32))]


class _TargetCall(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("tokens", ctypes.POINTER(ctypes.c_int32)),
                ("num_tokens", ctypes.c_int32), ("num_past", ctypes.c_int32), ("num_rows", ctypes.c_int32),
                ("step", ctypes.c_uint64), ("hidden", _Tensor), ("parents", ctypes.POINTER(ctypes.c_int32))]


_DRAFT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_DraftCall))
_TARGET_FORWARD_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_TargetCall))
_TARGET_ROLLBACK_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32)
_TARGET_KEEP_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32),
                                   ctypes.c_int32)
_TOKEN_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32)


def _address(trampoline):
    return ctypes.cast(trampoline, ctypes.c_void_p).value


class _Failure:
    """The first exception raised by a callback during one engine call."""

    __slots__ = ("where", "exception")

    def __init__(self):
        self.where = None
        self.exception = None

    def clear(self):
        self.where = self.exception = None

    def record(self, where, exception):
        if self.exception is None:
            self.where, self.exception = where, exception


def _guarded(failure, where, fn):
    """fn(*args) → its int result (None: 0); any exception is recorded and
    becomes a failure code."""
    def trampoline(*args):
        try:
            return int(fn(*args) or 0)
        except BaseException as e:  # noqa: B902 (nothing may unwind into C)
            failure.record(where, e)
            return 1
    return trampoline


def _check_struct(call, struct, name):
    if call.struct_size < ctypes.sizeof(struct):
        raise RuntimeError(f"{name}: the library's struct_size {call.struct_size} is smaller than "
                           f"this binding's {ctypes.sizeof(struct)}")


def _set_tensor(dst, view):
    dst.data = view.address
    dst.dtype = _arrays._TENSOR_DTYPES[view.dtype]
    dst.memory = view.memory
    dst.rows, dst.cols = view.shape
    dst.row_stride = view.strides[0]


def _int_tokens(values, what):
    tokens = np.asarray(values)
    if tokens.size and tokens.dtype.kind not in "iu":
        raise TypeError(f"{what}: expected integer token ids, got {tokens.dtype}")
    return tokens.astype(np.int32).reshape(-1)


# ---- drafters ---------------------------------------------------------------
class Drafter:
    """A drafter handle. It serves at most one engine; close the engine first."""

    _close_order = 1
    # Defaults for an object whose creation the library refused, which
    # __del__ still finalizes.
    _raw = None
    _in_use = False
    _close_pending = False

    def __init__(self, context, raw):
        self._raw = raw
        self.context = context
        self._in_use = False         # an engine that is not closed holds it
        self._close_pending = False  # collected while in use: the engine closes it
        context._children.add(self)

    @property
    def raw(self):
        if self._raw is None:
            raise ValueError(f"{type(self).__name__} is closed")
        return self._raw

    @property
    def closed(self):
        return self._raw is None

    def close(self):
        if self._in_use:
            raise ValueError(f"{type(self).__name__} is used by an engine: close the engine first")
        raw, self._raw = self._raw, None
        if raw is not None:
            _capi.flashspec_drafter_destroy(raw)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # A drafter and its engine collected together may be finalized in
        # either order: one still in use is destroyed by the engine's close().
        if self._in_use:
            self._close_pending = True
            return
        try:
            self.close()
        except Exception:
            pass

    def _release(self):
        self._in_use = False
        if self._close_pending:
            self.close()

    def _take_failure(self):
        return None


class NgramDrafter(Drafter):
    """Prompt lookup: proposes the tokens that followed the most recent
    earlier occurrence of the longest matching suffix (min_n..max_n tokens)."""

    def __init__(self, context, *, min_n=1, max_n=4, call_cost=0.0, token_cost=0.0):
        params = _capi.flashspec_ngram_params()
        _capi.flashspec_ngram_params_init(params)
        params.min_n, params.max_n = min_n, max_n
        params.call_cost, params.token_cost = call_cost, token_cost
        with context._lock:
            status, raw = _capi.flashspec_drafter_create_ngram(context.raw, params)
            check(status, context.raw)
        super().__init__(context, raw)


class SuffixDrafter(Drafter):
    """SuffixDecoding: drafts from counted suffix tries over the sequence and
    over the outputs of this drafter's earlier generations (at most
    ``cache_max_tokens`` tokens), as deep as the counts are confident
    (``min_probability``, at most ``max_depth`` tokens); see
    flashspec_drafter_create_suffix. With ``propose_trees=True`` it drafts
    trees of at most k nodes in an engine (the tree of ``propose_tree``),
    whose forward then sees them (``Engine(with_parents=True)``)."""

    def __init__(self, context, *, max_match_len=16, max_depth=16, min_probability=0.1, cache_max_tokens=16384,
                 call_cost=0.0, token_cost=0.0, propose_trees=False):
        params = _capi.flashspec_suffix_params()
        _capi.flashspec_suffix_params_init(params)
        params.max_match_len, params.max_depth = max_match_len, max_depth
        params.min_probability, params.cache_max_tokens = min_probability, cache_max_tokens
        params.call_cost, params.token_cost = call_cost, token_cost
        params.propose_trees = 1 if propose_trees else 0
        with context._lock:
            status, raw = _capi.flashspec_drafter_create_suffix(context.raw, params)
            check(status, context.raw)
        super().__init__(context, raw)

    def propose_tree(self, sequence, max_nodes):
        """A draft tree after ``sequence`` (token ids): ``(tokens, parents)``,
        int32 arrays of at most ``max_nodes`` entries, parents[i] in [-1, i)
        (-1: a child of the sequence's last token), ready for
        ``VerifyBatch(draft_parents=)``. A sequence that extends the one
        indexed last costs only its new tokens; any other starts a new
        sequence (the previous one's output enters the cache)."""
        tokens = np.ascontiguousarray(_int_tokens(sequence, "sequence"))
        max_nodes = int(max_nodes)
        if not 0 <= max_nodes <= _capi.FLASHSPEC_MAX_DRAFT_LEN:
            raise ValueError(f"max_nodes must be in [0, {_capi.FLASHSPEC_MAX_DRAFT_LEN}], got {max_nodes}")
        # The binding owns the output arrays, sized to max_nodes: the library
        # never writes past them.
        out_tokens = np.empty(max(max_nodes, 1), dtype=np.int32)
        out_parents = np.empty(max(max_nodes, 1), dtype=np.int32)
        count = np.zeros(1, dtype=np.int32)
        with self.context._lock:
            status = _capi.flashspec_suffix_drafter_propose_tree(
                self.raw, tokens.ctypes.data, tokens.size, max_nodes,
                out_tokens.ctypes.data, out_parents.ctypes.data, count.ctypes.data)
            check(status, self.context.raw)
        n = int(count[0])
        return out_tokens[:n].copy(), out_parents[:n].copy()


class CallbackDrafter(Drafter):
    """A drafter backed by a Python callable ``fn(context, max_tokens)``.

    ``context`` is the sequence so far (prompt, then emitted tokens) as an
    int32 numpy array (a copy); the callable returns up to ``max_tokens``
    token ids (an empty sequence: no draft this step). With ``logits=True``
    it returns ``(tokens, logits)``: the tokens it sampled and the draft
    logits rows ``[len(tokens), V]`` they were sampled from, with
    q = softmax(row / draft_temperature); verification then uses the whole
    rows, so the result stays exact. Logits may be float32, float16 or
    bfloat16 host arrays. With ``tree=True`` it returns ``(tokens, parents)``:
    a tree of point-mass drafts, node i's parent in [-1, i) (-1: a child of
    the context's last token; parents before children); its engine runs
    tree steps (``Engine(with_parents=True)``), and a parent out of range
    fails the generation with CallbackError naming the node.
    """

    def __init__(self, context, fn, *, logits=False, tree=False, draft_temperature=1.0, call_cost=0.0,
                 token_cost=0.0):
        if not callable(fn):
            raise TypeError("fn must be callable")
        if logits and tree:
            raise ValueError("a drafter returns logits or a tree, not both")
        self._fn = fn
        self._logits = bool(logits)
        self._tree = bool(tree)
        self._failure = _Failure()
        self._held = None  # the last logits view: the engine reads it until the step ends
        self._trampoline = _DRAFT_FN(_guarded(self._failure, "draft callback", self._draft))
        params = _capi.flashspec_callback_drafter_params()
        _capi.flashspec_callback_drafter_params_init(params)
        params.kind = (_capi.FLASHSPEC_DRAFT_LOGITS if self._logits else
                       _capi.FLASHSPEC_DRAFT_TREE if self._tree else _capi.FLASHSPEC_DRAFT_TOKENS)
        params.draft = _address(self._trampoline)
        params.draft_temperature = draft_temperature
        params.call_cost, params.token_cost = call_cost, token_cost
        with context._lock:
            status, raw = _capi.flashspec_drafter_create_callback(context.raw, params)
            check(status, context.raw)
        super().__init__(context, raw)

    def _draft(self, _user_data, call_ptr):
        call = call_ptr.contents
        _check_struct(call, _DraftCall, "draft callback")
        self._held = None
        sequence = np.ctypeslib.as_array(call.context, (call.context_len,)).copy()
        out = self._fn(sequence, int(call.max_tokens))
        parents = None
        if self._logits:
            tokens, logits = out
        elif self._tree:
            (tokens, parents), logits = out, None
        else:
            tokens, logits = out, None
        tokens = _int_tokens(tokens, "draft callback tokens")
        n = tokens.shape[0]
        if n > call.max_tokens:
            raise ValueError(f"draft callback returned {n} tokens, more than max_tokens = {call.max_tokens}")
        if n:
            np.ctypeslib.as_array(call.tokens, (call.max_tokens,))[:n] = tokens
        if self._tree:
            parents = _int_tokens(parents, "draft callback parents")
            if parents.shape[0] != n:
                raise ValueError(f"draft callback returned {parents.shape[0]} parents for {n} tokens")
            if n:
                np.ctypeslib.as_array(call.parents, (call.max_tokens,))[:n] = parents
        if self._logits and n:
            view = _arrays.tensor(logits, "draft callback logits")
            if view.shape[0] != n:
                raise ValueError(f"draft callback returned {view.shape[0]} logits rows for {n} tokens")
            self._held = view
            _set_tensor(call.logits, view)
        call.num_tokens = n

    def _take_failure(self):
        if self._failure.exception is None:
            return None
        where, exception = self._failure.where, self._failure.exception
        self._failure.clear()
        return where, exception


# ---- results and metrics ----------------------------------------------------
class Generation(NamedTuple):
    """What generate() produced: the emitted tokens, why it stopped, and the
    number of verify steps it ran."""
    tokens: list
    finish_reason: FinishReason
    steps: int


@dataclasses.dataclass(frozen=True)
class ArmMetrics:
    """Statistics of one arm (flashspec_arm_metrics); drafter is -1 for k = 0."""
    drafter: int
    draft_len: int
    pulls: int
    draft_tokens: int
    accepted_tokens: int
    mean_reward: float
    mean_cost: float


@dataclasses.dataclass(frozen=True)
class EngineMetrics:
    """Totals since creation or reset_metrics() (flashspec_engine_metrics),
    with the per-position counts: position_drafted[j] steps drafted at least
    j + 1 tokens, position_accepted[j] accepted at least j + 1."""
    steps: int
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    emitted_tokens: int
    acceptance_rate: float
    mean_accepted_length: float
    tokens_per_step: float
    step_latency_p50_us: float
    step_latency_p99_us: float
    position_drafted: Tuple[int, ...]
    position_accepted: Tuple[int, ...]
    arms: Tuple[ArmMetrics, ...]

    @property
    def position_acceptance(self):
        """Acceptance rate at each draft position: accepted[j] / drafted[j]."""
        return tuple(a / d if d else 0.0 for a, d in zip(self.position_accepted, self.position_drafted))

    def as_dict(self):
        return dataclasses.asdict(self)


def _arm_metrics(a):
    """ArmMetrics of a flashspec_arm_metrics."""
    return ArmMetrics(a.drafter, a.draft_len, int(a.pulls), int(a.draft_tokens), int(a.accepted_tokens),
                      a.mean_reward, a.mean_cost)


def _engine_metrics(m, drafted, accepted, arms):
    """EngineMetrics of a flashspec_engine_metrics, its per-position counts
    and its ArmMetrics (shared by Engine and BatchEngine)."""
    return EngineMetrics(int(m.steps), int(m.drafts), int(m.draft_tokens), int(m.accepted_tokens),
                         int(m.emitted_tokens), m.acceptance_rate, m.mean_accepted_length, m.tokens_per_step,
                         m.step_latency_p50_us, m.step_latency_p99_us,
                         tuple(int(x) for x in drafted), tuple(int(x) for x in accepted), tuple(arms))


# ---- the engine -------------------------------------------------------------
class Engine:
    """Speculative decoding of one sequence at a time (flashspec_engine).

    ``target_forward(tokens, num_past, num_rows)`` is the host's target
    model: drop any cached tokens beyond ``num_past`` (0: a new sequence),
    append ``tokens`` (int32 array) to the KV cache and return the final
    hidden rows of the last ``num_rows`` tokens, ``[num_rows, d]`` (float32,
    float16 or bfloat16 host array; kept alive until the step ends).
    ``target_rollback(num_keep)`` (optional) truncates the cache to its first
    ``num_keep`` tokens after a rejection.

    Trees (drafters with ``tree=True``, ``SuffixDrafter(propose_trees=True)``;
    see Tree steps in flashspec.h): with ``with_parents=True`` the forward is
    ``target_forward(tokens, num_past, num_rows, parents)``, ``parents``
    None for a chain step, else an int32 array with one entry per token, -1
    (it follows the token before it) or the index in ``tokens`` of its
    parent; run it with tree attention. A tree step reaching a forward
    without ``with_parents`` fails with CallbackError.
    ``target_keep(num_past, keep)`` (optional), after a tree step, keeps the
    cache's first ``num_past`` tokens and then the last forward's tokens at
    the indices ``keep`` (increasing), dropping the rest; without it the
    engine sends the accepted path again.

    ``drafters`` are NgramDrafter / SuffixDrafter / CallbackDrafter objects (each serves one
    engine). ``arms`` lists (drafter, draft_len) pairs — drafter an object of
    ``drafters``, its index, or None for a k = 0 arm; None gives one arm per
    drafter of length ``default_draft_len``. ``policy`` is "ucb1",
    "thompson", "fixed" (``fixed_arm``) or "oracle" (``oracle_rewards``, one
    per arm). Costs are in units of one target forward (see
    flashspec_engine_params). ``draft_len_rule`` "adaptive" drafts, each
    step, the k (at most the arm's) that maximises expected tokens per cost
    from live per-position acceptance, remembered over about
    ``draft_len_memory`` steps; "arm" drafts the arm's k. The context must
    use the CPU backend.
    """

    _close_order = 0

    def __init__(self, context, head, target_forward, *, target_rollback=None, drafters=(), arms=None,
                 default_draft_len=4, policy="ucb1", bandit_seed=0, ucb_exploration=1.0, fixed_arm=0,
                 oracle_rewards=None, target_step_cost=1.0, target_row_cost=0.02, max_context=0,
                 draft_len_rule="arm", draft_len_memory=64.0, with_parents=False, target_keep=None):
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
        drafters = list(drafters)
        for d in drafters:
            if not isinstance(d, Drafter):
                raise TypeError(f"drafters must be Drafter objects, not {type(d).__name__}")
            if d.context is not context:
                raise ValueError("a drafter was created on another context")
        self.context = context
        self.head = head
        self.drafters = tuple(drafters)
        self._target_forward = target_forward
        self._target_rollback = target_rollback
        self._target_keep = target_keep
        self._with_parents = bool(with_parents)
        self._failure = _Failure()
        self._held = None  # the hidden rows of the current step
        # One generate at a time (re-entrant, so a nested call from a callback
        # reaches the library, which refuses it); cancel() never takes it.
        self._lock = threading.RLock()
        self._busy = False
        self._forward_tramp = _TARGET_FORWARD_FN(_guarded(self._failure, "target forward", self._forward))
        self._rollback_tramp = (_TARGET_ROLLBACK_FN(_guarded(self._failure, "target rollback", self._rollback))
                                if target_rollback is not None else None)
        self._keep_tramp = (_TARGET_KEEP_FN(_guarded(self._failure, "target keep", self._keep))
                            if target_keep is not None else None)

        params = _capi.flashspec_engine_params()
        _capi.flashspec_engine_params_init(params)
        params.target_forward = _address(self._forward_tramp)
        params.target_rollback = _address(self._rollback_tramp) if self._rollback_tramp else None
        params.target_keep = _address(self._keep_tramp) if self._keep_tramp else None
        self._drafter_array = np.array([int(d.raw) for d in drafters] or [0], dtype=np.uintp)
        params.drafters = self._drafter_array.ctypes.data if drafters else None
        params.num_drafters = len(drafters)
        self.arms = None
        if arms is not None:
            table = []
            for arm in arms:
                drafter, draft_len = arm
                if drafter is None:
                    index = -1 if draft_len == 0 else None
                elif isinstance(drafter, Drafter):
                    index = next((i for i, d in enumerate(drafters) if d is drafter), None)
                else:
                    index = int(drafter)
                if index is None:
                    raise ValueError(f"arm {arm!r}: its drafter is not one of this engine's drafters")
                table.append((index, int(draft_len)))
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
            num_arms = params.num_arms or max(len(drafters), 1)
            if policy == "oracle" and self._oracle.size < num_arms:
                raise ValueError(f"oracle_rewards has {self._oracle.size} entries, fewer than the {num_arms} arms")
            params.oracle_rewards = self._oracle.ctypes.data
        params.target_step_cost = target_step_cost
        params.target_row_cost = target_row_cost
        params.max_context = max_context
        params.draft_len_rule = DRAFT_LEN_RULES[draft_len_rule]
        params.draft_len_memory = draft_len_memory
        with context._lock:
            status, raw = _capi.flashspec_engine_create(context.raw, head.raw, params)
            check(status, context.raw)
        self._raw = raw
        for d in drafters:
            d._in_use = True
        context._children.add(self)

    # ---- handle ------------------------------------------------------------
    @property
    def raw(self):
        if self._raw is None:
            raise ValueError("Engine is closed")
        return self._raw

    @property
    def closed(self):
        return self._raw is None

    def close(self):
        """Destroy the engine; its drafters are released (close them, or give
        them to another engine). Idempotent."""
        raw, self._raw = self._raw, None
        if raw is not None:
            with self.context._lock:
                _capi.flashspec_engine_destroy(raw)
            for d in self.drafters:
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
        _check_struct(call, _TargetCall, "target forward")
        self._held = None
        tokens = np.ctypeslib.as_array(call.tokens, (call.num_tokens,)).copy()
        parents = np.ctypeslib.as_array(call.parents, (call.num_tokens,)).copy() if call.parents else None
        if self._with_parents:
            rows = self._target_forward(tokens, int(call.num_past), int(call.num_rows), parents)
        elif parents is not None:
            raise RuntimeError("a tree step needs a forward that takes the parents (Engine(with_parents=True))")
        else:
            rows = self._target_forward(tokens, int(call.num_past), int(call.num_rows))
        view = _arrays.tensor(rows, "target forward: hidden")
        self._held = view
        _set_tensor(call.hidden, view)

    def _rollback(self, _user_data, num_keep):
        self._target_rollback(int(num_keep))

    def _keep(self, _user_data, num_past, keep, num_keep):
        self._target_keep(int(num_past), np.ctypeslib.as_array(keep, (num_keep,)).copy() if num_keep else
                          np.zeros(0, dtype=np.int32))

    # ---- generation --------------------------------------------------------
    def generate(self, prompt, *, temperature=1.0, seed=0, request_id=0, max_tokens=256, stop_tokens=(),
                 on_token=None):
        """Generate up to max_tokens tokens after prompt; returns a Generation
        (tokens, finish_reason, steps). ``on_token(token)`` is called for each
        token as it is emitted; a true return value stops the generation
        (FinishReason.HOST_STOP). At temperature 0 the tokens are the target's
        greedy tokens, whatever the drafters propose.

        On failure raises the status's FlashSpecError subclass (CallbackError
        when a callback raised, chained to that exception; CancelledError after
        cancel()), with ``.tokens`` (those emitted before the failure) and
        ``.finish_reason`` set."""
        if on_token is not None and not callable(on_token):
            raise TypeError("on_token must be callable or None")
        prompt_arr = np.ascontiguousarray(_int_tokens(prompt, "prompt"))
        stops = np.ascontiguousarray(_int_tokens(list(stop_tokens), "stop_tokens"))
        capacity = max(int(max_tokens), 0)
        out = np.zeros(max(capacity, 1), dtype=np.int32)

        def emit(_user_data, token):
            return 1 if on_token(int(token)) else 0

        token_failure = _Failure()
        token_tramp = _TOKEN_FN(_guarded(token_failure, "token callback", emit)) if on_token else None

        params = _capi.flashspec_generate_params()
        _capi.flashspec_generate_params_init(params)
        params.temperature = temperature
        params.seed = seed
        params.request_id = request_id
        params.max_tokens = max_tokens
        params.stop_tokens = stops.ctypes.data if stops.size else None
        params.num_stop_tokens = int(stops.size)
        params.on_token = _address(token_tramp) if token_tramp else None
        result = _capi.flashspec_generate_result()
        _capi.flashspec_generate_result_init(result)

        with self._lock, self.context._lock:
            raw = self.raw
            if self._busy:
                # Called from one of this engine's own callbacks: the library
                # refuses (INVALID_ARGUMENT) and the generation in progress goes on.
                check(_capi.flashspec_engine_generate(raw, prompt_arr.ctypes.data, int(prompt_arr.size), params,
                                                      out.ctypes.data, capacity, result), self.context.raw)
                raise AssertionError("flashspec_engine_generate accepted a nested call")
            self._busy = True
            self._failure.clear()
            for d in self.drafters:
                d._take_failure()
            try:
                status = _capi.flashspec_engine_generate(raw, prompt_arr.ctypes.data, int(prompt_arr.size), params,
                                                         out.ctypes.data, capacity, result)
                message = _capi.flashspec_context_last_error(self.context.raw) if status else ""
            finally:
                self._busy = False
                self._held = None
            failures = []
            if self._failure.exception is not None:
                failures.append((self._failure.where, self._failure.exception))
                self._failure.clear()
            failures += [f for f in (d._take_failure() for d in self.drafters) if f is not None]
        tokens = [int(t) for t in out[:result.num_tokens]]
        reason = FinishReason(result.finish_reason)

        if token_failure.exception is not None:
            # on_token can only ask to stop: its exception is reported here.
            failures.append((token_failure.where, token_failure.exception))
            if status == _capi.FLASHSPEC_OK:
                status = _capi.FLASHSPEC_ERR_CALLBACK
                message = "token callback: reported failure"
        if status != _capi.FLASHSPEC_OK:
            cause = failures[0] if failures else None
            if cause is not None:
                message = f"{message} ({cause[0]} raised {type(cause[1]).__name__}: {cause[1]})"
                if not isinstance(cause[1], Exception):
                    raise cause[1]  # KeyboardInterrupt, SystemExit: not ours to wrap
            error = error_class(status)(status, message)
            error.tokens, error.finish_reason = tokens, reason
            raise error from (cause[1] if cause is not None else None)
        return Generation(tokens, reason, int(result.steps))

    def cancel(self):
        """Ask the generation in progress (on another thread, or from a
        callback) to stop before its next step; it then raises
        CancelledError. No effect when idle. Thread-safe."""
        raw = self._raw
        if raw is not None:
            _capi.flashspec_engine_cancel(raw)

    # ---- metrics -----------------------------------------------------------
    def metrics(self):
        """An EngineMetrics snapshot (totals, per position, per arm)."""
        with self.context._lock:
            raw = self.raw
            m = _capi.flashspec_engine_metrics()
            _capi.flashspec_engine_metrics_init(m)
            check(_capi.flashspec_engine_get_metrics(raw, m), self.context.raw)
            n = m.num_positions
            drafted = np.zeros(max(n, 1), dtype=np.uint64)
            accepted = np.zeros(max(n, 1), dtype=np.uint64)
            check(_capi.flashspec_engine_get_position_metrics(raw, n, drafted.ctypes.data, accepted.ctypes.data,
                                                              None), self.context.raw)
            arms = []
            for i in range(m.num_arms):
                a = _capi.flashspec_arm_metrics()
                _capi.flashspec_arm_metrics_init(a)
                check(_capi.flashspec_engine_get_arm_metrics(raw, i, a), self.context.raw)
                arms.append(_arm_metrics(a))
        return _engine_metrics(m, drafted[:n], accepted[:n], arms)

    def reset_metrics(self):
        """Zero the metrics (the policy keeps what it learned)."""
        with self.context._lock:
            check(_capi.flashspec_engine_reset_metrics(self.raw), self.context.raw)
