# Type information for flashspec._engine (Engine, drafters, metrics).
import dataclasses
import enum
from types import TracebackType
from typing import Any, Callable, Iterable, Literal, NamedTuple, TypeVar, Union, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._core import Context, LMHead, _ArrayInput

__all__ = ["Engine", "NgramDrafter", "SuffixDrafter", "CallbackDrafter", "Drafter", "FinishReason", "Generation",
           "EngineMetrics", "ArmMetrics", "POLICIES", "DRAFT_LEN_RULES"]

_Policy = Literal["ucb1", "thompson", "fixed", "oracle"]
POLICIES: dict[str, int]
DRAFT_LEN_RULES: dict[str, int]

class FinishReason(enum.IntEnum):
    NONE = 0
    LENGTH = 1
    STOP_TOKEN = 2
    HOST_STOP = 3
    CONTEXT_FULL = 4
    CANCELLED = 5

_D = TypeVar("_D", bound=Drafter)
_E = TypeVar("_E", bound=Engine)

class Drafter:
    context: Context
    def __init__(self, context: Context, raw: object) -> None: ...
    @property
    def raw(self) -> Any: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self: _D) -> _D: ...
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None: ...
    def __del__(self) -> None: ...

class NgramDrafter(Drafter):
    def __init__(self, context: Context, *, min_n: int = 1, max_n: int = 4, call_cost: float = 0.0,
                 token_cost: float = 0.0) -> None: ...

class SuffixDrafter(Drafter):
    def __init__(self, context: Context, *, max_match_len: int = 16, max_depth: int = 16,
                 min_probability: float = 0.1, cache_max_tokens: int = 16384, call_cost: float = 0.0,
                 token_cost: float = 0.0, propose_trees: bool = False) -> None: ...
    def propose_tree(self, sequence: ArrayLike, max_nodes: int) -> tuple[NDArray[np.int32], NDArray[np.int32]]: ...

# A draft callback gets the sequence so far (an int32 copy) and max_tokens;
# it returns token ids, or with logits=True (token ids, logits rows).
_Sequence = NDArray[np.int32]

class CallbackDrafter(Drafter):
    @overload
    def __init__(self, context: Context, fn: Callable[[_Sequence, int], ArrayLike], *,
                 logits: Literal[False] = False, tree: Literal[False] = False, draft_temperature: float = 1.0,
                 call_cost: float = 0.0, token_cost: float = 0.0) -> None: ...
    @overload
    def __init__(self, context: Context, fn: Callable[[_Sequence, int], tuple[ArrayLike, _ArrayInput]], *,
                 logits: Literal[True], tree: Literal[False] = False, draft_temperature: float = 1.0,
                 call_cost: float = 0.0, token_cost: float = 0.0) -> None: ...
    @overload
    def __init__(self, context: Context, fn: Callable[[_Sequence, int], tuple[ArrayLike, ArrayLike]], *,
                 logits: Literal[False] = False, tree: Literal[True], draft_temperature: float = 1.0,
                 call_cost: float = 0.0, token_cost: float = 0.0) -> None: ...

class Generation(NamedTuple):
    tokens: list[int]
    finish_reason: FinishReason
    steps: int

@dataclasses.dataclass(frozen=True)
class ArmMetrics:
    drafter: int
    draft_len: int
    pulls: int
    draft_tokens: int
    accepted_tokens: int
    mean_reward: float
    mean_cost: float

@dataclasses.dataclass(frozen=True)
class EngineMetrics:
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
    position_drafted: tuple[int, ...]
    position_accepted: tuple[int, ...]
    arms: tuple[ArmMetrics, ...]
    @property
    def position_acceptance(self) -> tuple[float, ...]: ...
    def as_dict(self) -> dict[str, Any]: ...

# target_forward(tokens, num_past, num_rows) -> hidden rows [num_rows, d];
# with with_parents=True also the parents (None for a chain step).
_TargetForward = Union[Callable[[_Sequence, int, int], _ArrayInput],
                       Callable[[_Sequence, int, int, _Sequence | None], _ArrayInput]]
# An arm: (drafter object, its index, or None for k = 0; draft length).
_Arm = tuple[Union[Drafter, int, None], int]

class Engine:
    context: Context
    head: LMHead
    drafters: tuple[Drafter, ...]
    arms: tuple[tuple[int, int], ...] | None
    def __init__(self, context: Context, head: LMHead, target_forward: _TargetForward, *,
                 target_rollback: Callable[[int], object] | None = None, drafters: Iterable[Drafter] = (),
                 arms: Iterable[_Arm] | None = None, default_draft_len: int = 4, policy: _Policy = "ucb1",
                 bandit_seed: int = 0, ucb_exploration: float = 1.0, fixed_arm: int = 0,
                 oracle_rewards: ArrayLike | None = None, target_step_cost: float = 1.0,
                 target_row_cost: float = 0.02, max_context: int = 0,
                 draft_len_rule: Literal["arm", "adaptive"] = "arm", draft_len_memory: float = 64.0,
                 with_parents: bool = False,
                 target_keep: Callable[[int, _Sequence], object] | None = None) -> None: ...
    @property
    def raw(self) -> Any: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self: _E) -> _E: ...
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None: ...
    def __del__(self) -> None: ...
    def generate(self, prompt: ArrayLike, *, temperature: float = 1.0, seed: int = 0, request_id: int = 0,
                 max_tokens: int = 256, stop_tokens: Iterable[int] = (),
                 on_token: Callable[[int], object] | None = None) -> Generation: ...
    def cancel(self) -> None: ...
    def metrics(self) -> EngineMetrics: ...
    def reset_metrics(self) -> None: ...
