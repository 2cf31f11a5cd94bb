// The *_init symbols of the structs that grew after their first release. A
// binary built against an older header calls them with a struct of its
// layout (0.1 for draft params and verify batch and result, 0.2 for engine
// params), so they fill exactly that layout. A caller compiled against today's header never
// reaches them: its *_init is the header's macro, which calls *_init_sized
// with the caller's sizeof.
#include "capi/params.h"
#include "flashspec.h"

#undef flashspec_draft_params_init
#undef flashspec_verify_batch_init
#undef flashspec_verify_result_init
#undef flashspec_engine_params_init

using flashspec::FirstLayout;

extern "C" {

void flashspec_draft_params_init(flashspec_draft_params* params) {
  flashspec_draft_params_init_sized(params, FirstLayout<flashspec_draft_params>::size);
}

void flashspec_verify_batch_init(flashspec_verify_batch* batch) {
  flashspec_verify_batch_init_sized(batch, FirstLayout<flashspec_verify_batch>::size);
}

void flashspec_verify_result_init(flashspec_verify_result* result) {
  flashspec_verify_result_init_sized(result, FirstLayout<flashspec_verify_result>::size);
}

void flashspec_engine_params_init(flashspec_engine_params* params) {
  flashspec_engine_params_init_sized(params, FirstLayout<flashspec_engine_params>::size);
}

}  // extern "C"
