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
      flashspec_ngram_params_init,
      flashspec_drafter_create_ngram,
      flashspec_callback_drafter_params_init,
      flashspec_drafter_create_callback,
      flashspec_drafter_destroy,
      flashspec_engine_params_init,
      flashspec_engine_create,
      flashspec_engine_destroy,
      flashspec_generate_params_init,
      flashspec_generate_result_init,
      flashspec_engine_generate,
      flashspec_engine_cancel,
      flashspec_engine_metrics_init,
      flashspec_engine_get_metrics,
      flashspec_engine_get_position_metrics,
      flashspec_arm_metrics_init,
      flashspec_engine_get_arm_metrics,
      flashspec_engine_reset_metrics,
      flashspec_abi_version,
      flashspec_status_name,
      flashspec_tensor_make,
      flashspec_context_last_cuda_error,
      flashspec_context_backend,
      flashspec_cuda_device_count,
      flashspec_lm_head_vocab_size,
      flashspec_lm_head_hidden_size,
      flashspec_philox4x32_10,
      flashspec_rng_uniform,
  };
  return abi_version == FLASHSPEC_ABI_VERSION ? &table : nullptr;
}

}  // extern "C"
