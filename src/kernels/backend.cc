#include "kernels/backend.h"

#include <cstring>
#include <new>

#include "util/status.h"

namespace flashspec {

void* Backend::allocate_staging(size_t bytes) { return ::operator new(bytes); }
void Backend::release_staging(void* data) noexcept { ::operator delete(data); }
void Backend::copy_in(void* dst, const void* host_src, size_t bytes) { std::memcpy(dst, host_src, bytes); }
void Backend::copy_out(void* host_dst, const void* src, size_t bytes) { std::memcpy(host_dst, src, bytes); }

namespace {
[[noreturn]] void no_shards() {
  fail(FLASHSPEC_ERR_UNSUPPORTED, Field::kBackend, "this backend does not serve vocabulary shards in this version");
}
}  // namespace

void Backend::verify_records(const LmHeadStorage&, const VerifyArgs&, ShardRecord*) { no_shards(); }
void Backend::draft_records(const LmHeadStorage&, const DraftArgs&, ShardRecord*) { no_shards(); }
void Backend::finalize_records(const VerifyArgs&, const ShardRecord*, int32_t, const ResultArgs&) { no_shards(); }
void Backend::draft_from_records(const DraftArgs&, const ShardRecord*, int32_t) { no_shards(); }

}  // namespace flashspec
