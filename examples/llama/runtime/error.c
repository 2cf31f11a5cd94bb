#include "error.h"

#include <stdarg.h>
#include <stdio.h>

void llama_set_error(char* err, size_t err_size, const char* format, ...) {
  if (err == NULL || err_size == 0) return;
  va_list args;
  va_start(args, format);
  vsnprintf(err, err_size, format, args);
  va_end(args);
}
