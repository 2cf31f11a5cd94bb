// Every exported function runs its body through guarded(): C++ exceptions
// become a status and a message on the context; nothing escapes.
#pragma once

#include <new>
#include <string>

#include "capi/handles.h"
#include "util/status.h"

namespace flashspec {

// The message of the last failed call that had no context (create).
std::string& thread_error_message();

// What a Field is, for an error whose field no caller named (every call
// names the fields its backend calls can raise; this keeps a message whole
// should one slip through).
inline const char* field_description(Field field) {
  switch (field) {
    case Field::kBackend: return "backend";
    case Field::kDeviceOrdinal: return "device ordinal";
    case Field::kWeight: return "weight";
    case Field::kFlags: return "flags";
    case Field::kHead: return "head";
    case Field::kHidden: return "hidden rows";
    case Field::kTemperature: return "temperature";
    case Field::kDraftLogits: return "draft logits";
    case Field::kCpuThreads: return "CPU threads";
    default: return "argument";
  }
}

template <class Body>
flashspec_status guarded(flashspec_context* ctx, Body&& body) noexcept {
  flashspec_status status = FLASHSPEC_OK;
  std::string message;
  int cuda_error = 0;
  try {
    body();
  } catch (const Error& e) {
    status = e.status();
    message = e.field() == Field::kNone ? e.what() : std::string(field_description(e.field())) + ": " + e.what();
    cuda_error = e.cuda_error();
  } catch (const std::bad_alloc&) {
    status = FLASHSPEC_ERR_OUT_OF_MEMORY;
    message = "out of host memory";
  } catch (const std::exception& e) {
    status = FLASHSPEC_ERR_INTERNAL;
    message = std::string("internal error: ") + e.what();
  } catch (...) {
    status = FLASHSPEC_ERR_INTERNAL;
    message = "internal error: unknown exception";
  }
  try {
    std::string& target = ctx ? ctx->last_error : thread_error_message();
    target = message;
    if (ctx && status != FLASHSPEC_OK) ctx->last_cuda_error = cuda_error;
  } catch (...) {
    // Keeping the message needs memory; the status still says what happened.
  }
  return status;
}

}  // namespace flashspec
