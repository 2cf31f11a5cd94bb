// The integer a C caller stored in an enum field or argument. C allows any
// int there; in C++ reading an enum object that holds a value outside the
// enum's range (a negative one, say) is undefined, so the library reads the
// bits and checks them before the value is used as the enum.
#pragma once

#include <cstdint>
#include <cstring>

namespace flashspec {

template <class Enum>
int32_t raw_enum(const Enum& value) {
  static_assert(sizeof(Enum) == sizeof(int32_t), "flashspec enums are 32-bit");
  int32_t raw;
  std::memcpy(&raw, &value, sizeof raw);
  return raw;
}

}  // namespace flashspec
