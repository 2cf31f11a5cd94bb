/* error.h — how the runtime's functions report an error: a message written
 * into the caller's buffer err (err_size bytes, always terminated, cut to
 * fit), alongside a -1 return. NULL err or err_size 0 keep no message. */
#ifndef FLASHSPEC_LLAMA_ERROR_H
#define FLASHSPEC_LLAMA_ERROR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
void llama_set_error(char* err, size_t err_size, const char* format, ...);

#ifdef __cplusplus
}
#endif
#endif
