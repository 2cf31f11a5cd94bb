/* Links flashspec::flashspec from find_package and makes a CPU context. */
#include <flashspec.h>
#include <stdio.h>

int main(void) {
  flashspec_context_params params;
  flashspec_context_params_init(&params);
  params.backend = FLASHSPEC_BACKEND_CPU;
  flashspec_context* ctx = NULL;
  if (flashspec_context_create(&params, &ctx) != FLASHSPEC_OK) {
    fprintf(stderr, "%s\n", flashspec_context_last_error(NULL));
    return 1;
  }
  printf("FlashSpec %s through find_package(flashspec)\n", flashspec_version_string());
  flashspec_context_destroy(ctx);
  return 0;
}
