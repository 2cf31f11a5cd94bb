"""Exceptions carrying a FlashSpec status and the library's detail message.

One class per status of the C status table, derived from the table itself
(``FLASHSPEC_ERR_*`` constants of the SWIG layer), so a status added to the
header gets its exception without a change here.
"""
from . import capi as _capi

__all__ = ["FlashSpecError", "error_class"]


class FlashSpecError(RuntimeError):
    """A FlashSpec call failed.

    ``status`` is the numeric flashspec_status, ``status_name`` its C name
    ("FLASHSPEC_ERR_OUT_OF_RANGE") and ``message`` the detail message the
    library recorded (it names the argument that was wrong).
    """

    def __init__(self, status, message=""):
        self.status = int(status)
        self.status_name = _capi.flashspec_status_name(self.status)
        self.message = message
        text = _capi.flashspec_status_string(self.status)
        super().__init__(f"{self.status_name}: {message}" if message else f"{self.status_name}: {text}")


# Statuses that also read naturally as a built-in exception type.
_BUILTIN_BASES = {
    "INVALID_ARGUMENT": ValueError,
    "NULL_POINTER": ValueError,
    "STRUCT_SIZE": ValueError,
    "OUT_OF_RANGE": ValueError,
    "DTYPE_MISMATCH": TypeError,
    "DEVICE_MISMATCH": ValueError,
    "NON_FINITE": ValueError,
    "OUT_OF_MEMORY": MemoryError,
}

_BY_STATUS = {}


def _class_name(suffix):
    return "".join(part.capitalize() for part in suffix.split("_")) + "Error"


for _name in sorted(dir(_capi)):
    if not _name.startswith("FLASHSPEC_ERR_"):
        continue
    _suffix = _name[len("FLASHSPEC_ERR_"):]
    _bases = (FlashSpecError,) + ((_BUILTIN_BASES[_suffix],) if _suffix in _BUILTIN_BASES else ())
    _cls = type(_class_name(_suffix), _bases, {"__module__": __name__,
                                               "__doc__": f"{_name}: {_capi.flashspec_status_string(getattr(_capi, _name))}."})
    _BY_STATUS[getattr(_capi, _name)] = _cls
    globals()[_cls.__name__] = _cls
    __all__.append(_cls.__name__)


def error_class(status):
    """The exception class for a status (FlashSpecError for unknown ones)."""
    return _BY_STATUS.get(int(status), FlashSpecError)


def check(status, context=None):
    """Raise the exception for a non-OK status, with the detail message of
    ``context`` (a raw flashspec_context pointer, or None for a failed create)."""
    if status == _capi.FLASHSPEC_OK:
        return
    message = _capi.flashspec_context_last_error(context)
    raise error_class(status)(status, message)
