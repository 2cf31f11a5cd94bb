// Version, ABI and status-string queries.
#include "flashspec.h"
#include "util/raw_enum.h"

#define FLASHSPEC_STRINGIFY_(x) #x
#define FLASHSPEC_STRINGIFY(x) FLASHSPEC_STRINGIFY_(x)

extern "C" {

unsigned flashspec_version_number(void) { return FLASHSPEC_VERSION_NUMBER; }

const char* flashspec_version_string(void) {
  return FLASHSPEC_STRINGIFY(FLASHSPEC_VERSION_MAJOR) "." FLASHSPEC_STRINGIFY(
      FLASHSPEC_VERSION_MINOR) "." FLASHSPEC_STRINGIFY(FLASHSPEC_VERSION_PATCH);
}

unsigned flashspec_abi_version(void) { return FLASHSPEC_ABI_VERSION; }

const char* flashspec_status_string(flashspec_status status) {
  switch (flashspec::raw_enum(status)) {
#define FLASHSPEC_STATUS_TEXT_(name, value, text) \
  case FLASHSPEC_##name: return text;
    FLASHSPEC_STATUS_TABLE(FLASHSPEC_STATUS_TEXT_)
#undef FLASHSPEC_STATUS_TEXT_
    default: return "unknown status";
  }
}

const char* flashspec_status_name(flashspec_status status) {
  switch (flashspec::raw_enum(status)) {
#define FLASHSPEC_STATUS_NAME_(name, value, text) \
  case FLASHSPEC_##name: return "FLASHSPEC_" #name;
    FLASHSPEC_STATUS_TABLE(FLASHSPEC_STATUS_NAME_)
#undef FLASHSPEC_STATUS_NAME_
    default: return "FLASHSPEC_UNKNOWN_STATUS";
  }
}

}  // extern "C"
