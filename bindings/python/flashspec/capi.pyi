# flashspec.capi is the raw SWIG layer: every C function, struct and
# constant of flashspec.h as is, data pointers as integer addresses. It is
# typed as Any; the typed API is the flashspec package.
from typing import Any

def __getattr__(name: str) -> Any: ...
