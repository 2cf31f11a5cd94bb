/* SWIG interface of the FlashSpec C API for Python: the raw layer under the
 * `flashspec` package. Every function and struct of include/flashspec.h is
 * wrapped as is; only three kinds of argument are mapped by hand:
 *   - data pointers (tensor data, index arrays, outputs, cuda_stream) are
 *     plain integer addresses, so host (numpy) and device (CUDA array
 *     interface, DLPack) memory pass through without a copy;
 *   - `T** out` handle outputs are returned after the status;
 *   - engine callbacks (function-pointer typedefs, the batched engine's
 *     included) and the engines' arrays of drafters, arms and rewards are
 *     integer addresses too: the package passes ctypes trampolines and
 *     numpy arrays;
 *   - the fixed-size arrays of flashspec_philox4x32_10 are tuples.
 * New handle types or pointer element types go in the lists below. */
%module(package="flashspec") capi

%{
#include "flashspec.h"
%}

%include <stdint.i>

/* ---- data pointers as integer addresses (None = NULL) ------------------ */
%define FLASHSPEC_ADDRESS(TYPE)
%typemap(in) TYPE {
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    void* address_ = PyLong_AsVoidPtr($input);
    if (address_ == NULL && PyErr_Occurred()) SWIG_fail;
    $1 = ($1_ltype)address_;
  }
}
%typemap(out) TYPE { $result = PyLong_FromVoidPtr((void*)$1); }
%typemap(typecheck, precedence=SWIG_TYPECHECK_POINTER) TYPE {
  $1 = ($input == Py_None || PyLong_Check($input)) ? 1 : 0;
}
%enddef

FLASHSPEC_ADDRESS(void*)
FLASHSPEC_ADDRESS(const void*)
FLASHSPEC_ADDRESS(int32_t*)
FLASHSPEC_ADDRESS(const int32_t*)
FLASHSPEC_ADDRESS(uint64_t*)
FLASHSPEC_ADDRESS(const uint64_t*)
FLASHSPEC_ADDRESS(float*)
FLASHSPEC_ADDRESS(const float*)
FLASHSPEC_ADDRESS(const double*)
FLASHSPEC_ADDRESS(const uint32_t*)

/* ---- handle outputs: status, handle = f(..) ------------------------------ */
%define FLASHSPEC_OUT_HANDLE(TYPE)
%typemap(in, numinputs=0) TYPE** out (TYPE* handle_ = NULL) { $1 = &handle_; }
%typemap(argout) TYPE** out {
  $result = SWIG_Python_AppendOutput($result, handle_$argnum ?
      SWIG_NewPointerObj(SWIG_as_voidptr(handle_$argnum), $*1_descriptor, 0) :
      SWIG_Py_Void());
}
%enddef

FLASHSPEC_OUT_HANDLE(flashspec_context)
FLASHSPEC_OUT_HANDLE(flashspec_lm_head)
FLASHSPEC_OUT_HANDLE(flashspec_summaries)

/* ---- engine: callbacks and arrays as addresses --------------------------- */
FLASHSPEC_ADDRESS(flashspec_draft_fn)
FLASHSPEC_ADDRESS(flashspec_target_forward_fn)
FLASHSPEC_ADDRESS(flashspec_target_rollback_fn)
FLASHSPEC_ADDRESS(flashspec_target_keep_fn)
FLASHSPEC_ADDRESS(flashspec_token_fn)
FLASHSPEC_ADDRESS(flashspec_drafter* const*)
FLASHSPEC_ADDRESS(const flashspec_arm*)
FLASHSPEC_OUT_HANDLE(flashspec_drafter)
FLASHSPEC_OUT_HANDLE(flashspec_engine)
FLASHSPEC_ADDRESS(flashspec_batch_target_forward_fn)
FLASHSPEC_ADDRESS(flashspec_batch_target_rollback_fn)
FLASHSPEC_ADDRESS(flashspec_batch_target_keep_fn)
FLASHSPEC_ADDRESS(flashspec_sequence_token_fn)
FLASHSPEC_OUT_HANDLE(flashspec_batch_engine)

/* ---- fixed-size uint32 arrays of the Philox helper ---------------------- */
%define FLASHSPEC_U32_IN(NAME, N)
%typemap(in) const uint32_t NAME[N] (uint32_t words_[N]) {
  if (!PySequence_Check($input) || PySequence_Size($input) != N) {
    PyErr_SetString(PyExc_ValueError, "expected a sequence of " #N " integers");
    SWIG_fail;
  }
  for (Py_ssize_t i_ = 0; i_ < N; ++i_) {
    PyObject* item_ = PySequence_GetItem($input, i_);
    unsigned long value_ = item_ ? PyLong_AsUnsignedLong(item_) : 0;
    Py_XDECREF(item_);
    if (PyErr_Occurred()) SWIG_fail;
    if (value_ > 0xffffffffUL) {
      PyErr_SetString(PyExc_OverflowError, "word does not fit in 32 bits");
      SWIG_fail;
    }
    words_[i_] = (uint32_t)value_;
  }
  $1 = words_;
}
%enddef
FLASHSPEC_U32_IN(counter, 4)
FLASHSPEC_U32_IN(key, 2)

%typemap(in, numinputs=0) uint32_t out[4] (uint32_t words_[4]) { $1 = words_; }
%typemap(argout) uint32_t out[4] {
  $result = SWIG_Python_AppendOutput($result,
      Py_BuildValue("(kkkk)", (unsigned long)$1[0], (unsigned long)$1[1],
                    (unsigned long)$1[2], (unsigned long)$1[3]));
}

%include "flashspec.h"
