# Type information for the flashspec package (PEP 561: py.typed beside it).
# Checked against the module by stubtest and by a name-for-name comparison
# of __all__ (bindings/python/tests/typing/check_typing.py), and used by a
# mypy --strict test over a typed example.
from typing import Any, Literal, Union

from . import capi as capi
from . import errors as errors
from ._controls import MAX_TOP_K as MAX_TOP_K
from ._controls import MAX_TOP_LOGPROBS as MAX_TOP_LOGPROBS
from ._controls import TOP_K_ALL as TOP_K_ALL
from ._controls import SamplingControls as SamplingControls
from ._core import Context as Context
from ._core import MAX_DRAFT_SUPPORT as MAX_DRAFT_SUPPORT
from ._core import MAX_DRAFT_TOP_K as MAX_DRAFT_TOP_K
from ._core import SHARD_RECORD_BYTES as SHARD_RECORD_BYTES
from ._core import SHARD_RECORD_VERSION as SHARD_RECORD_VERSION
from ._core import LMHead as LMHead
from ._core import Summaries as Summaries
from ._core import VerifyBatch as VerifyBatch
from ._core import VerifyResult as VerifyResult
from ._core import stream_handle as stream_handle
from ._batch_engine import BatchEngine as BatchEngine
from ._batch_engine import BatchForward as BatchForward
from ._batch_engine import SequenceState as SequenceState
from ._engine import ArmMetrics as ArmMetrics
from ._engine import CallbackDrafter as CallbackDrafter
from ._engine import Drafter as Drafter
from ._engine import Engine as Engine
from ._engine import EngineMetrics as EngineMetrics
from ._engine import FinishReason as FinishReason
from ._engine import Generation as Generation
from ._engine import NgramDrafter as NgramDrafter
from ._engine import SuffixDrafter as SuffixDrafter
from .errors import CallbackError as CallbackError
from .errors import CancelledError as CancelledError
from .errors import CudaError as CudaError
from .errors import DeviceMismatchError as DeviceMismatchError
from .errors import DtypeMismatchError as DtypeMismatchError
from .errors import FlashSpecError as FlashSpecError
from .errors import InternalError as InternalError
from .errors import InvalidArgumentError as InvalidArgumentError
from .errors import NoDeviceError as NoDeviceError
from .errors import NonFiniteError as NonFiniteError
from .errors import NullPointerError as NullPointerError
from .errors import OutOfMemoryError as OutOfMemoryError
from .errors import OutOfRangeError as OutOfRangeError
from .errors import StructSizeError as StructSizeError
from .errors import UnsupportedError as UnsupportedError
from .errors import WorkspaceExceededError as WorkspaceExceededError
from .errors import error_class as error_class

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
    "CallbackError", "CancelledError", "CudaError", "DeviceMismatchError", "DtypeMismatchError", "InternalError",
    "InvalidArgumentError", "NonFiniteError", "NoDeviceError", "NullPointerError", "OutOfMemoryError",
    "OutOfRangeError", "StructSizeError", "UnsupportedError", "WorkspaceExceededError",
]

__version__: str
ABI_VERSION: int
RNG_PURPOSES: dict[str, int]
_RngPurpose = Union[Literal["draft_noise", "accept_uniform", "residual_noise", "bonus_noise"], int]

def version() -> str: ...
def version_number() -> int: ...
def abi_version() -> int: ...
def status_string(status: int) -> str: ...
def status_name(status: int) -> str: ...
def cuda_device_count() -> int: ...
def philox4x32_10(counter: tuple[int, int, int, int] | list[int],
                  key: tuple[int, int] | list[int]) -> tuple[int, int, int, int]: ...
def rng_uniform(seed: int, request_id: int, step: int, position: int, purpose: _RngPurpose, token: int) -> float: ...
# The plugin table (a capi.flashspec_api) for abi_version, or None.
def get_api(abi_version: int = ...) -> Any: ...
