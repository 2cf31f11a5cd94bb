/*
 * dlopen_host.c — a host that loads FlashSpec as a plugin.
 *
 * It links nothing from FlashSpec: it dlopens the library, resolves the one
 * symbol flashspec_get_api, and calls everything through the versioned
 * table (flashspec.h is included for the types only). Then it runs a tiny
 * greedy draft and checks the tokens against its own float64 argmax.
 *
 *   dlopen_host [path/to/libflashspec.so.0]
 *
 * Without a path it asks the dynamic loader for "libflashspec.so.0", which it
 * finds once the library is installed in a system directory (or through
 * LD_LIBRARY_PATH); in a build tree, name the file:
 *   ./build/examples/dlopen_host build/src/libflashspec.so.0
 * Build (installed library):  cc dlopen_host.c $(pkg-config --cflags flashspec) -ldl -lm -o dlopen_host
 */
#include <flashspec.h>

#include <dlfcn.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

enum { VOCAB = 64, HIDDEN = 8, ROWS = 3 };

typedef const flashspec_api* (*get_api_fn)(unsigned);

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "libflashspec.so.0";
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    fprintf(stderr, "dlopen_host: cannot load %s: %s\n", path, dlerror());
    return 1;
  }
  int exit_code = 1;
  flashspec_context* ctx = NULL;
  flashspec_lm_head* head = NULL;
  const flashspec_api* api = NULL;

  get_api_fn get_api;
  *(void**)&get_api = dlsym(library, "flashspec_get_api"); /* POSIX idiom for function pointers */
  if (!get_api) {
    fprintf(stderr, "dlopen_host: %s has no flashspec_get_api: %s\n", path, dlerror());
    goto done;
  }
  api = get_api(FLASHSPEC_ABI_VERSION);
  /* The table may have grown since this host was built; it may not be
   * smaller than the members this host calls. */
  if (!api || api->abi_version != FLASHSPEC_ABI_VERSION ||
      api->struct_size < offsetof(flashspec_api, verify_and_finalize) + sizeof api->verify_and_finalize) {
    fprintf(stderr, "dlopen_host: %s does not serve ABI %d\n", path, FLASHSPEC_ABI_VERSION);
    goto done;
  }
  printf("loaded %s: FlashSpec %s, table of %u bytes\n", path, api->version_string(), api->struct_size);

  flashspec_context_params params;
  api->context_params_init(&params);
  params.backend = FLASHSPEC_BACKEND_CPU;
  params.cpu_threads = 1;
  flashspec_status s = api->context_create(&params, &ctx);
  if (s != FLASHSPEC_OK) {
    fprintf(stderr, "dlopen_host: context_create: %s: %s\n", api->status_string(s), api->context_last_error(NULL));
    goto done;
  }

  float w[VOCAB * HIDDEN], h[ROWS * HIDDEN];
  for (int i = 0; i < VOCAB * HIDDEN; ++i) w[i] = (float)sin(0.37 * i + 0.1 * (i % 7));
  for (int i = 0; i < ROWS * HIDDEN; ++i) h[i] = (float)cos(1.3 * i);
  flashspec_tensor wt = {w, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, VOCAB, HIDDEN, HIDDEN};
  s = api->lm_head_create(ctx, &wt, FLASHSPEC_LM_HEAD_COPY, &head);
  if (s != FLASHSPEC_OK) {
    fprintf(stderr, "dlopen_host: lm_head_create: %s: %s\n", api->status_string(s), api->context_last_error(ctx));
    goto done;
  }
  flashspec_tensor ht = {h, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, ROWS, HIDDEN, HIDDEN};
  int32_t tokens[ROWS];
  float logits[ROWS];
  s = api->draft(ctx, head, &ht, NULL, tokens, logits);
  if (s != FLASHSPEC_OK) {
    fprintf(stderr, "dlopen_host: draft: %s: %s\n", api->status_string(s), api->context_last_error(ctx));
    goto done;
  }
  for (int r = 0; r < ROWS; ++r) {
    int best = 0;
    double best_logit = -INFINITY, second = -INFINITY;
    for (int v = 0; v < VOCAB; ++v) {
      double l = 0.0;
      for (int c = 0; c < HIDDEN; ++c) l += (double)w[v * HIDDEN + c] * h[r * HIDDEN + c];
      if (l > best_logit) {
        second = best_logit;
        best_logit = l;
        best = v;
      } else if (l > second) {
        second = l;
      }
    }
    printf("row %d: drafted token %d (logit %.4f), float64 argmax %d\n", r, tokens[r], logits[r], best);
    /* The rows here have clear winners (gap far above fp32 error). */
    if (best_logit - second > 1e-3 && tokens[r] != best) {
      fprintf(stderr, "dlopen_host: token mismatch on row %d\n", r);
      goto done;
    }
  }
  exit_code = 0;

done:
  if (api) {
    api->lm_head_destroy(head);
    api->context_destroy(ctx);
  }
  dlclose(library);
  return exit_code;
}
