"""Zero-copy views of caller arrays for the C API.

Host memory: anything numpy can view (``__array_interface__``, the buffer
protocol, or a host ``__dlpack__`` such as a CPU torch tensor). Device
memory: any object with ``__dlpack__`` on a CUDA device, or with
``__cuda_array_interface__`` (PyTorch, CuPy, Numba). Device arrays are never
copied; a device array of the wrong dtype or layout is an error.

Outputs (arrays the library writes) are never copied either, on the host
too: an output that cannot be written in place (another dtype, not
contiguous, read-only, or not an array at all) is refused. An int64 array
stands for uint64 (the same bits), as torch has no usable uint64.

Streams. The library works on its context's CUDA stream. For DLPack the
context stream is passed to ``__dlpack__(stream=...)``, so the producer
orders its pending work before it (the DLPack contract). For the CUDA array
interface, a producer ``stream`` other than the context's is waited on with
an event (cudaEventRecord + cudaStreamWaitEvent), as that protocol asks of
consumers; neither path blocks the host.
"""
import ctypes

import numpy as np

from . import capi as _capi

HOST = _capi.FLASHSPEC_MEMORY_HOST
CUDA = _capi.FLASHSPEC_MEMORY_CUDA

# DLPack device types and dtype codes (dlpack.h, stable since v0.2).
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT = 0, 1, 2, 4

# Element types the C API takes, by name.
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4, "uint64": 8, "int64": 8, "uint8": 1,
             "int8": 1, "uint32": 4}
_TENSOR_DTYPES = {"float32": _capi.FLASHSPEC_DTYPE_F32, "bfloat16": _capi.FLASHSPEC_DTYPE_BF16,
                  "float16": _capi.FLASHSPEC_DTYPE_F16}
# The 8-bit codes of a quantised LM head (code_tensor): uint8 arrays hold
# e4m3 bit patterns, int8 arrays int8 codes.
_CODE_DTYPES = {"uint8": _capi.FLASHSPEC_DTYPE_E4M3, "int8": _capi.FLASHSPEC_DTYPE_I8}


class View:
    """A strided view: address, element type name, shape, strides in
    elements, memory kind, CUDA device id, the object keeping the memory
    alive (owner) and the object the caller passed (source)."""

    __slots__ = ("address", "dtype", "shape", "strides", "memory", "device", "owner", "source")

    def __init__(self, address, dtype, shape, strides, memory, device, owner, source=None):
        self.address, self.dtype, self.shape = address, dtype, tuple(shape)
        self.strides, self.memory, self.device, self.owner = tuple(strides), memory, device, owner
        self.source = owner if source is None else source

    def reshaped(self, shape, strides):
        return View(self.address, self.dtype, shape, strides, self.memory, self.device,
                    self.owner, self.source)

    @property
    def size(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def is_contiguous(self):
        if self.size == 0:
            return True  # no element: whatever strides the producer reports
        expected = 1
        for extent, stride in zip(reversed(self.shape), reversed(self.strides)):
            if extent != 1 and stride != expected:
                return False
            expected *= extent
        return True


def _c_strides(shape):
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return list(reversed(strides))


def _typestr_name(typestr, descr_name=None):
    if descr_name == "bfloat16":
        return "bfloat16"
    kind, size = typestr[1], int(typestr[2:])
    return {("f", 4): "float32", ("f", 2): "float16", ("i", 4): "int32", ("u", 8): "uint64",
            ("i", 8): "int64", ("u", 1): "uint8", ("i", 1): "int8"}.get((kind, size), typestr)


def _byte_strides_to_elements(strides, shape, itemsize, what):
    if strides is None:
        return _c_strides(shape)
    out = []
    for s in strides:
        if s % itemsize:
            raise ValueError(f"{what}: stride {s} bytes is not a multiple of the element size")
        out.append(s // itemsize)
    return out


# ---- DLPack ---------------------------------------------------------------
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

_DL_DTYPES = {(_DL_FLOAT, 32): "float32", (_DL_FLOAT, 16): "float16", (_DL_BFLOAT, 16): "bfloat16",
              (_DL_INT, 32): "int32", (_DL_UINT, 64): "uint64", (_DL_INT, 64): "int64",
              (_DL_UINT, 8): "uint8", (_DL_INT, 8): "int8"}


def _from_dlpack(obj, what, stream):
    device_type, device_id = obj.__dlpack_device__()
    device_type = int(device_type)
    if device_type in (_DL_CUDA, _DL_CUDA_MANAGED):
        # DLPack: 1 is the legacy default stream; 0 is not allowed for CUDA.
        capsule = obj.__dlpack__(stream=stream if stream else 1)
        memory = CUDA
    elif device_type in (_DL_CPU, _DL_CUDA_HOST):
        capsule = obj.__dlpack__()
        memory = HOST
    else:
        raise ValueError(f"{what}: DLPack device type {device_type} is neither host nor CUDA")
    # The capsule keeps its name "dltensor": its destructor then calls the
    # producer's deleter once the view (which owns the capsule) is released.
    managed = _DLManagedTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    t = managed.dl_tensor
    dtype = _DL_DTYPES.get((t.dtype.code, t.dtype.bits))
    if dtype is None or t.dtype.lanes != 1:
        raise TypeError(f"{what}: unsupported DLPack dtype (code {t.dtype.code}, bits {t.dtype.bits}); "
                        "tensors are float32, bfloat16 or float16, index arrays int32, int64 or uint64, "
                        "shard records and e4m3 codes uint8, int8 codes int8")
    shape = [t.shape[i] for i in range(t.ndim)]
    strides = [t.strides[i] for i in range(t.ndim)] if t.strides else _c_strides(shape)
    address = (t.data or 0) + t.byte_offset
    return View(address, dtype, shape, strides, memory, int(device_id), capsule, obj)


# ---- CUDA array interface -------------------------------------------------
_cudart = None


def _cuda_runtime():
    global _cudart
    if _cudart is None:
        for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"):
            try:
                _cudart = ctypes.CDLL(name)
                break
            except OSError:
                continue
        else:
            raise RuntimeError("the CUDA runtime library (libcudart) could not be loaded "
                               "to order a __cuda_array_interface__ producer stream")
    return _cudart


def _order_after(producer_stream, consumer_stream):
    """Make consumer_stream wait for the work enqueued so far on producer_stream."""
    rt = _cuda_runtime()
    event = ctypes.c_void_p()
    disable_timing = 0x02
    for call in (lambda: rt.cudaEventCreateWithFlags(ctypes.byref(event), disable_timing),
                 lambda: rt.cudaEventRecord(event, ctypes.c_void_p(producer_stream)),
                 lambda: rt.cudaStreamWaitEvent(ctypes.c_void_p(consumer_stream), event, 0)):
        err = call()
        if err != 0:
            if event.value:
                rt.cudaEventDestroy(event)
            raise RuntimeError(f"CUDA error {err} while ordering array-interface streams")
    rt.cudaEventDestroy(event)


def read_device_int32(v, index):
    """Entry `index` of a device int32 View: the device is synchronised (the
    producer's work done, whatever its stream), then 4 bytes are copied."""
    rt = _cuda_runtime()
    previous = ctypes.c_int()
    out = ctypes.c_int32()
    device_to_host = 2  # cudaMemcpyDeviceToHost
    err = rt.cudaGetDevice(ctypes.byref(previous))
    if err == 0:
        err = rt.cudaSetDevice(ctypes.c_int(v.device))
    if err == 0:
        err = rt.cudaDeviceSynchronize()
    if err == 0:
        err = rt.cudaMemcpy(ctypes.byref(out), ctypes.c_void_p(v.address + 4 * index), ctypes.c_size_t(4),
                            ctypes.c_int(device_to_host))
    if previous.value != v.device:
        rt.cudaSetDevice(previous)
    if err != 0:
        raise RuntimeError(f"CUDA error {err} while reading a device array's entry {index}")
    return out.value


class _DeviceCopy:
    """Device memory holding a copy of a host array, allocated and filled on
    `stream` (stream-ordered) and freed on it when the copy is dropped, so
    the free follows every call enqueued there that reads it."""

    __slots__ = ("address", "device", "stream")

    def __init__(self, host, nbytes, device, stream):
        rt = _cuda_runtime()
        self.address, self.device, self.stream = None, device, stream
        ptr = ctypes.c_void_p()
        with _on_device(rt, device):
            err = rt.cudaMallocAsync(ctypes.byref(ptr), ctypes.c_size_t(max(nbytes, 1)), ctypes.c_void_p(stream))
            if err != 0:
                raise RuntimeError(f"CUDA error {err} while allocating {nbytes} bytes for a host array's copy")
            self.address = ptr.value
            host_to_device = 1  # cudaMemcpyHostToDevice
            err = rt.cudaMemcpyAsync(ctypes.c_void_p(self.address), ctypes.c_void_p(host), ctypes.c_size_t(nbytes),
                                     ctypes.c_int(host_to_device), ctypes.c_void_p(stream))
            if err != 0:
                raise RuntimeError(f"CUDA error {err} while copying a host array to the device")

    def __del__(self):
        if self.address:
            rt = _cuda_runtime()
            with _on_device(rt, self.device):
                rt.cudaFreeAsync(ctypes.c_void_p(self.address), ctypes.c_void_p(self.stream))
            self.address = None


class _on_device:
    """Makes `device` current for a block, then restores the previous one."""

    def __init__(self, rt, device):
        self.rt, self.device, self.previous = rt, device, ctypes.c_int(device)

    def __enter__(self):
        self.rt.cudaGetDevice(ctypes.byref(self.previous))
        if self.previous.value != self.device:
            self.rt.cudaSetDevice(ctypes.c_int(self.device))

    def __exit__(self, *exc):
        if self.previous.value != self.device:
            self.rt.cudaSetDevice(self.previous)


def upload(v, device, stream):
    """A device View of a contiguous host View, copied on `stream` of
    `device`. The host array may be dropped once this returns (a copy from
    pageable memory is staged before cudaMemcpyAsync returns)."""
    if v.memory != HOST:
        raise ValueError("upload: the array is not in host memory")
    if not v.is_contiguous():
        raise ValueError("upload: the host array must be contiguous")
    nbytes = v.size * _ITEMSIZE[v.dtype]
    copy = _DeviceCopy(v.address, nbytes, device, stream)
    return View(copy.address, v.dtype, v.shape, v.strides, CUDA, device, copy, v.source)


def _from_cuda_array_interface(obj, what, stream):
    cai = obj.__cuda_array_interface__
    if cai.get("mask") is not None:
        raise ValueError(f"{what}: masked CUDA arrays are not supported")
    shape = list(cai["shape"])
    dtype = _typestr_name(cai["typestr"])
    if dtype not in _ITEMSIZE:
        raise TypeError(f"{what}: unsupported CUDA array dtype {cai['typestr']}")
    strides = _byte_strides_to_elements(cai.get("strides"), shape, _ITEMSIZE[dtype], what)
    producer = cai.get("stream")
    consumer = stream if stream else 1  # a NULL context stream is the legacy default stream
    if producer is not None and producer != consumer:
        _order_after(producer, consumer)
    device = _cuda_device_of(obj)
    return View(cai["data"][0], dtype, shape, strides, CUDA, device, obj)


def _cuda_device_of(obj):
    device = getattr(obj, "device", None)
    index = getattr(device, "index", None)  # torch.device
    if index is None:
        index = getattr(device, "id", None)  # cupy.cuda.Device
    return int(index) if index is not None else 0


# ---- entry point ----------------------------------------------------------
def view(obj, what, *, stream=0, dtype=None, output=False):
    """A zero-copy View of obj. ``dtype`` (a name) converts host inputs that
    are not numpy arrays of that type (a copy, which only host memory allows);
    device inputs must already have it. ``output=True``: obj is written by
    the library, so it is never converted or copied (see _output)."""
    if isinstance(obj, View):
        return obj
    if output:
        return _output(obj, what, stream, dtype)
    if not isinstance(obj, np.ndarray) and not hasattr(obj, "__array_interface__"):
        if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
            v = _from_dlpack(obj, what, stream)
            if v.memory == CUDA or dtype is None or v.dtype == dtype:
                return _checked(v, what, dtype)
            obj = np.from_dlpack(obj)
        elif hasattr(obj, "__cuda_array_interface__"):
            return _checked(_from_cuda_array_interface(obj, what, stream), what, dtype)
    arr = np.asarray(obj)
    if dtype is not None and arr.dtype.name != dtype:
        if dtype == "bfloat16":
            raise TypeError(f"{what}: expected a bfloat16 array, got {arr.dtype}")
        if dtype in ("int32", "uint64") and arr.size and arr.dtype.kind not in "iub":
            raise TypeError(f"{what}: expected integers, got {arr.dtype}")
        arr = arr.astype(dtype)
    return _checked(_host_view(arr, what), what, dtype)


def _host_view(arr, what):
    name = "bfloat16" if arr.dtype.name == "bfloat16" else arr.dtype.name
    if name not in _ITEMSIZE:
        raise TypeError(f"{what}: unsupported dtype {arr.dtype}")
    strides = _byte_strides_to_elements(arr.strides, arr.shape, arr.itemsize, what)
    address = arr.__array_interface__["data"][0]
    return View(address, name, arr.shape, strides, HOST, 0, arr)


def _checked(v, what, dtype):
    if dtype == "uint64" and v.dtype == "int64":
        # Same width; torch has no usable uint64, so int64 carries the bits.
        v.dtype = "uint64"
    if dtype is not None and v.dtype != dtype:
        raise TypeError(f"{what}: expected a {dtype} array on the device, got {v.dtype} "
                        "(device arrays are never converted)")
    return v


def _supports_buffer(obj):
    try:
        memoryview(obj)
    except TypeError:
        return False
    return True


def _output(obj, what, stream, dtype):
    """A View of an output array, on its own memory: a numpy array, an object
    numpy views without a copy (array interface, buffer protocol), or a
    DLPack / CUDA-array-interface producer. Anything else would be written
    through a copy the caller never sees, so it is refused."""
    if isinstance(obj, np.ndarray) or hasattr(obj, "__array_interface__"):
        v = _host_view(np.asarray(obj), what)
    elif hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        v = _from_dlpack(obj, what, stream)
    elif hasattr(obj, "__cuda_array_interface__"):
        v = _from_cuda_array_interface(obj, what, stream)
    elif _supports_buffer(obj):
        v = _host_view(np.asarray(obj), what)
    else:
        raise TypeError(f"{what}: an output must be an array the library can write in place "
                        f"(numpy, torch, cupy, ...), not {type(obj).__name__}")
    if isinstance(v.owner, np.ndarray) and not v.owner.flags.writeable:
        raise ValueError(f"{what}: the output array is read-only")
    if dtype == "uint64" and v.dtype == "int64":
        v.dtype = "uint64"  # the same bits, written in place
    if dtype is not None and v.dtype != dtype:
        raise TypeError(f"{what}: expected a {dtype} output array, got {v.dtype} "
                        "(outputs are written in place, never converted)")
    return v


def vector(obj, what, dtype, *, stream=0, output=False):
    """A contiguous 1-D view. Host inputs are made contiguous by a copy;
    device inputs and outputs (``output=True``) must be contiguous."""
    v = view(obj, what, stream=stream, dtype=dtype, output=output)
    if len(v.shape) != 1:
        raise ValueError(f"{what}: expected a 1-D array, got shape {v.shape}")
    if not v.is_contiguous():
        if output:
            raise ValueError(f"{what}: outputs must be contiguous (they are written in place)")
        if v.memory == CUDA:
            raise ValueError(f"{what}: device arrays must be contiguous")
        v = view(np.ascontiguousarray(v.source), what, dtype=dtype)
    return v


def records(obj, what, *, stream=0, output=False):
    """A C-contiguous View of a uint8 array of shard records, any shape (the
    caller checks it). Records are bytes: an array of another dtype is
    refused, never converted. Outputs (records the library writes) must be
    contiguous and writable; a strided host input is made contiguous by a
    copy, a strided device input is refused."""
    try:
        v = view(obj, what, stream=stream, dtype="uint8", output=True) if output else view(obj, what, stream=stream)
    except TypeError:
        dtype = getattr(obj, "dtype", None)
        if dtype is None:
            raise
        v = None  # a dtype views cannot take: refused below, by name
    if v is None or v.dtype != "uint8":  # inputs are viewed without a dtype: never converted
        raise TypeError(f"{what}: expected a uint8 array of shard records, got {v.dtype if v else dtype}")
    if not v.is_contiguous():
        if output:
            raise ValueError(f"{what}: records must be C-contiguous (they are written in place)")
        if v.memory == CUDA:
            raise ValueError(f"{what}: device records must be C-contiguous")
        v = _host_view(np.ascontiguousarray(v.source), what)
    return v


def tensor(obj, what, *, stream=0):
    """A 2-D row-major view (1-D means one row) for a flashspec_tensor: unit
    column stride, row stride ≥ columns; host inputs are fixed up by a copy."""
    v = view(obj, what, stream=stream)
    if v.dtype not in _TENSOR_DTYPES:
        if v.memory == CUDA:
            raise TypeError(f"{what}: expected float32, bfloat16 or float16, got {v.dtype}")
        v = view(np.asarray(v.source, dtype=np.float32), what)
    if len(v.shape) == 1:
        v = v.reshaped((1, v.shape[0]), (v.shape[0], 1))
    if len(v.shape) != 2:
        raise ValueError(f"{what}: expected a 2-D array, got shape {v.shape}")
    rows, cols = v.shape
    if rows == 0 or cols == 0:
        return v.reshaped(v.shape, (cols, 1))  # no element: strides are moot
    row_stride = v.strides[0] if rows > 1 else max(cols, v.strides[0])
    if (cols > 1 and v.strides[1] != 1) or row_stride < cols:
        if v.memory == CUDA:
            raise ValueError(f"{what}: device tensors need unit column stride and row stride >= columns")
        return tensor(np.ascontiguousarray(v.source), what)
    return v.reshaped(v.shape, (row_stride, 1))


def code_tensor(obj, what, *, stream=0):
    """A 2-D row-major view of a quantised head's weight: 8-bit codes (uint8:
    e4m3 bit patterns, int8: int8 codes; an ml_dtypes float8_e4m3fn array is
    read as its bit patterns) or, for any other dtype, a weight the library
    quantises (as tensor(): host arrays of other dtypes become float32)."""
    if isinstance(obj, np.ndarray) and obj.dtype.name == "float8_e4m3fn":
        obj = obj.view(np.uint8)
    v = view(obj, what, stream=stream)
    if v.dtype not in _CODE_DTYPES:
        return tensor(v, what, stream=stream)
    if len(v.shape) == 1:
        v = v.reshaped((1, v.shape[0]), (v.shape[0], 1))
    if len(v.shape) != 2:
        raise ValueError(f"{what}: expected a 2-D array, got shape {v.shape}")
    rows, cols = v.shape
    if rows == 0 or cols == 0:
        return v.reshaped(v.shape, (cols, 1))
    row_stride = v.strides[0] if rows > 1 else max(cols, v.strides[0])
    if (cols > 1 and v.strides[1] != 1) or row_stride < cols:
        if v.memory == CUDA:
            raise ValueError(f"{what}: device tensors need unit column stride and row stride >= columns")
        return code_tensor(np.ascontiguousarray(v.source), what)
    return v.reshaped(v.shape, (row_stride, 1))


def scale_tensor(obj, what, *, stream=0):
    """A float32 tensor view of per-row scales: [V] becomes the column
    [V, 1]; a 2-D array is passed with its own shape (the library wants
    [V, 1] and checks V). Host inputs of another dtype are converted and
    strided 1-D ones copied; device scales must be float32."""
    v = view(obj, what, stream=stream, dtype="float32")
    if len(v.shape) == 2:
        return tensor(v, what, stream=stream)
    if len(v.shape) != 1:
        raise ValueError(f"{what}: expected shape [V] or [V, 1], got {v.shape}")
    if not v.is_contiguous():
        if v.memory == CUDA:
            raise ValueError(f"{what}: device arrays must be contiguous")
        v = view(np.ascontiguousarray(v.source, dtype=np.float32), what)
    return v.reshaped((v.shape[0], 1), (1, 1))


def c_tensor(v):
    """The flashspec_tensor of a 2-D View from tensor(), code_tensor() or
    scale_tensor()."""
    t = _capi.flashspec_tensor()
    t.data = v.address
    t.dtype = _TENSOR_DTYPES[v.dtype] if v.dtype in _TENSOR_DTYPES else _CODE_DTYPES[v.dtype]
    t.memory = v.memory
    t.rows, t.cols = v.shape
    t.row_stride = v.strides[0]
    return t


def empty_like_memory(proto, shape, dtype):
    """An output array in the memory of ``proto`` (a View): numpy on the host;
    on the device, an array of the framework proto came from (torch or cupy).
    torch gets int64 where the C API writes uint64 (same bits)."""
    if proto is None or proto.memory == HOST:
        return np.empty(shape, dtype=dtype)
    module = type(proto.source).__module__.split(".")[0]
    if module == "torch":
        import torch
        torch_dtype = torch.int64 if dtype == "uint64" else getattr(torch, dtype)
        return torch.empty(shape, dtype=torch_dtype, device=f"cuda:{proto.device}")
    if module == "cupy":
        import cupy
        with cupy.cuda.Device(proto.device):
            return cupy.empty(shape, dtype=dtype)
    raise TypeError("pass the output arrays (tokens_out=, out=...) for device inputs that are "
                    "neither torch tensors nor cupy arrays")
