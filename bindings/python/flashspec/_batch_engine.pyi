# Type information for flashspec._batch_engine (BatchEngine).
from types import TracebackType
from typing import Any, Callable, Iterable, Literal, NamedTuple, TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._core import Context, LMHead, _ArrayInput
from ._engine import Drafter, EngineMetrics, FinishReason, _Policy
from .errors import FlashSpecError

__all__ = ["BatchEngine", "BatchForward", "SequenceState"]

class BatchForward(NamedTuple):
    sequence_ids: NDArray[np.uint64]
    num_past: NDArray[np.int32]
    token_offsets: NDArray[np.int32]
    tokens: NDArray[np.int32]
    row_offsets: NDArray[np.int32]
    step: int
    parents: NDArray[np.int32] | None = None
    @property
    def num_rows(self) -> int: ...
    def tokens_of(self, s: int) -> NDArray[np.int32]: ...
    def rows_of(self, s: int) -> int: ...
    def parents_of(self, s: int) -> NDArray[np.int32] | None: ...

class SequenceState(NamedTuple):
    tokens: list[int]
    active: bool
    finish_reason: FinishReason
    steps: int
    error: FlashSpecError | None

_B = TypeVar("_B", bound=BatchEngine)

class BatchEngine:
    context: Context
    head: LMHead
    num_drafters: int
    arms: tuple[tuple[int, int], ...] | None
    def __init__(self, context: Context, head: LMHead, target_forward: Callable[[BatchForward], _ArrayInput], *,
                 target_rollback: Callable[[int, int], object] | None = None, num_drafters: int = 0,
                 arms: Iterable[tuple[int | None, int]] | None = None, default_draft_len: int = 4,
                 policy: _Policy = "ucb1", bandit_seed: int = 0, ucb_exploration: float = 1.0, fixed_arm: int = 0,
                 oracle_rewards: ArrayLike | None = None, target_step_cost: float = 1.0,
                 target_row_cost: float = 0.02, max_context: int = 0, max_sequences: int = 0,
                 draft_len_rule: Literal["arm", "adaptive"] = "arm", draft_len_memory: float = 64.0,
                 target_keep: Callable[[int, int, NDArray[np.int32]], object] | None = None) -> None: ...
    @property
    def raw(self) -> Any: ...
    @property
    def closed(self) -> bool: ...
    @property
    def sequence_ids(self) -> tuple[int, ...]: ...
    def close(self) -> None: ...
    def __enter__(self: _B) -> _B: ...
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None: ...
    def __del__(self) -> None: ...
    def add_sequence(self, sequence_id: int, prompt: ArrayLike, *, drafters: Iterable[Drafter] = (),
                     temperature: float = 1.0, seed: int = 0, request_id: int = 0, max_tokens: int = 256,
                     stop_tokens: Iterable[int] = (),
                     on_token: Callable[[int, int], object] | None = None) -> None: ...
    def remove_sequence(self, sequence_id: int) -> None: ...
    def step(self) -> int: ...
    def run(self) -> None: ...
    def sequence(self, sequence_id: int) -> SequenceState: ...
    def metrics(self, sequence_id: int | None = None) -> EngineMetrics: ...
