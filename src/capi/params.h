// The structs of flashspec.h that start with struct_size, across library
// versions. They only ever grow at their end, so a caller built against an
// older header passes a shorter struct: the library reads the prefix that
// caller knows and keeps the defaults of the rest; a struct the library
// fills is written only as far as the caller's struct_size.
#pragma once

#include <cstddef>
#include <cstring>
#include <string>

#include "flashspec.h"
#include "util/status.h"

namespace flashspec {

// The size of T's first published layout. No struct has grown since its
// first release, so each is sizeof(T) today; when fields are appended to T,
// specialise this with the old size (as a sizeof of a frozen copy of the old
// layout), so callers of either header keep working.
template <class T>
struct FirstLayout {
  static constexpr size_t size = sizeof(T);
};

// A struct_size between T's first published size and today's.
template <class T>
void check_struct_size(uint32_t given, const std::string& argument) {
  const size_t first = FirstLayout<T>::size, current = sizeof(T);
  if (given >= first && given <= current) return;
  const std::string accepted = first == current ? "expected " + std::to_string(current)
                                                : "expected " + std::to_string(first) + " to " + std::to_string(current);
  fail(FLASHSPEC_ERR_STRUCT_SIZE, argument + "->struct_size: is " + std::to_string(given) + ", " + accepted +
                                      " (call the matching *_init first)");
}

// *given as today's T: its first struct_size bytes over the defaults that
// `init` fills. `argument` names the struct ("params", "batch").
template <class T>
T load_struct(const T* given, void (*init)(T*), const std::string& argument) {
  require(given != nullptr, FLASHSPEC_ERR_NULL_POINTER, argument.c_str(), "is NULL");
  check_struct_size<T>(given->struct_size, argument);
  T loaded;
  init(&loaded);
  std::memcpy(static_cast<void*>(&loaded), static_cast<const void*>(given), given->struct_size);
  loaded.struct_size = sizeof(T);
  return loaded;
}

// The same where NULL means "all defaults".
template <class T>
T load_struct_or_defaults(const T* given, void (*init)(T*), const std::string& argument) {
  if (given) return load_struct(given, init, argument);
  T defaults;
  init(&defaults);
  return defaults;
}

// Writes `value` into the caller's *out, as far as out->struct_size (checked
// with check_struct_size before any work).
template <class T>
void store_struct(const T& value, T* out) {
  const uint32_t size = out->struct_size;
  std::memcpy(static_cast<void*>(out), static_cast<const void*>(&value), size);
  out->struct_size = size;
}

}  // namespace flashspec
