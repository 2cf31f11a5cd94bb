#include "kernels/backend.h"

#include <cstring>
#include <new>

namespace flashspec {

void* Backend::allocate_staging(size_t bytes) { return ::operator new(bytes); }
void Backend::release_staging(void* data) noexcept { ::operator delete(data); }
void Backend::copy_in(void* dst, const void* host_src, size_t bytes) { std::memcpy(dst, host_src, bytes); }
void Backend::copy_out(void* host_dst, const void* src, size_t bytes) { std::memcpy(host_dst, src, bytes); }

}  // namespace flashspec
