// The core library's side of the CUDA module (kernels/cuda_module.h): found
// next to the library itself, or at $FLASHSPEC_CUDA_MODULE, loaded once on
// first need. Without it (a build without CUDA, or a machine without the CUDA
// runtime) there is no CUDA device, and a CUDA context says why.
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "kernels/cuda_module.h"
#include "util/status.h"

namespace flashspec {
namespace {

struct LoadedModule {
  const CudaModuleTable* table = nullptr;
  std::string error;  // why there is no table
};

// The directory of the file this code was loaded from (libflashspec.so),
// with a trailing slash; empty if the loader cannot tell.
std::string own_directory() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&own_directory), &info) || !info.dli_fname) return "";
  const std::string path(info.dli_fname);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

LoadedModule load() {
  LoadedModule module;
  const char* override_path = std::getenv("FLASHSPEC_CUDA_MODULE");
  const std::string path = override_path && *override_path
                               ? std::string(override_path)
                               : own_directory() + "libflashspec-cuda.so." + std::to_string(FLASHSPEC_ABI_VERSION);
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    module.error = "the CUDA backend module " + path + " cannot be loaded (" + (why ? why : "unknown reason") +
                   "); a build without CUDA has none, and the module needs the CUDA runtime";
    return module;
  }
  using Entry = const CudaModuleTable* (*)(uint32_t);
  auto entry = reinterpret_cast<Entry>(dlsym(handle, "flashspec_cuda_module"));
  const CudaModuleTable* table = entry ? entry(kCudaModuleInterface) : nullptr;
  if (!table) {
    module.error = "the CUDA backend module " + path + " does not serve interface version " +
                   std::to_string(kCudaModuleInterface) + " (a module of another FlashSpec build)";
    dlclose(handle);
    return module;
  }
  module.table = table;  // the module stays loaded for the life of the process
  return module;
}

const LoadedModule& module() {
  static std::once_flag once;
  static LoadedModule loaded;
  std::call_once(once, [] { loaded = load(); });
  return loaded;
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const BackendConfig& config) {
  const LoadedModule& m = module();
  if (!m.table) fail(FLASHSPEC_ERR_NO_DEVICE, Field::kBackend, m.error);
  return m.table->make_backend(config);
}

int cuda_device_count() {
  const LoadedModule& m = module();
  return m.table ? m.table->device_count() : 0;
}

}  // namespace flashspec
