// The plugin entry: one symbol a host resolves after dlopen.
#include "flashspec.h"

extern "C" {

const flashspec_api* flashspec_get_api(unsigned abi_version) {
  static const flashspec_api table = {
      sizeof(flashspec_api),
      FLASHSPEC_ABI_VERSION,
      flashspec_version_number,
      flashspec_version_string,
      flashspec_status_string,
      flashspec_context_params_init,
      flashspec_context_create,
      flashspec_context_destroy,
      flashspec_context_last_error,
      flashspec_context_synchronize,
      flashspec_lm_head_create,
      flashspec_lm_head_destroy,
      flashspec_draft_params_init,
      flashspec_draft,
      flashspec_verify_batch_init,
      flashspec_verify_result_init,
      flashspec_summaries_create,
      flashspec_summaries_destroy,
      flashspec_verify,
      flashspec_finalize,
      flashspec_verify_and_finalize,
  };
  return abi_version == FLASHSPEC_ABI_VERSION ? &table : nullptr;
}

}  // extern "C"
