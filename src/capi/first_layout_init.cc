// The *_init symbols of the structs that grew after 0.1. A binary built
// against the 0.1 header calls them with a struct of the 0.1 layout, so they
// fill exactly that layout. A caller compiled against today's header never
// reaches them: its *_init is the header's macro, which calls *_init_sized
// with the caller's sizeof.
#include "capi/params.h"
#include "flashspec.h"

#undef flashspec_draft_params_init
#undef flashspec_verify_batch_init
#undef flashspec_verify_result_init

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

}  // extern "C"
