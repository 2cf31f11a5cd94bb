// The CUDA backend as a module (src/kernels/cuda_module.cc), through the
// shared library as a host links it. Run twice by meson: with the module the
// build made (if any), and with FLASHSPEC_CUDA_MODULE naming a file that does
// not exist, as on a machine without the module or the CUDA runtime.
//
// Usage: test_cuda_module built|missing
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "flashspec.h"

namespace {

std::string g_mode;

flashspec_status create(flashspec_backend backend, flashspec_context** ctx) {
  flashspec_context_params p;
  flashspec_context_params_init(&p);
  p.backend = backend;
  p.max_rows = 8;
  p.max_requests = 2;
  return flashspec_context_create(&p, ctx);
}

TEST(CudaModule, AutoPicksTheCudaBackendOnlyWithADevice) {
  flashspec_context* ctx = nullptr;
  ASSERT_EQ(create(FLASHSPEC_BACKEND_AUTO, &ctx), FLASHSPEC_OK) << flashspec_context_last_error(nullptr);
  EXPECT_EQ(flashspec_context_backend(ctx),
            flashspec_cuda_device_count() > 0 ? FLASHSPEC_BACKEND_CUDA : FLASHSPEC_BACKEND_CPU);
  flashspec_context_destroy(ctx);
}

TEST(CudaModule, ACudaContextSaysWhyThereIsNone) {
  flashspec_context* ctx = nullptr;
  const flashspec_status s = create(FLASHSPEC_BACKEND_CUDA, &ctx);
  const std::string message = flashspec_context_last_error(nullptr);
  if (g_mode == "missing") {
    EXPECT_EQ(s, FLASHSPEC_ERR_NO_DEVICE);
    EXPECT_EQ(ctx, nullptr);
    EXPECT_EQ(flashspec_cuda_device_count(), 0);
    EXPECT_EQ(message.rfind("params->backend: the CUDA backend module", 0), 0u) << message;
    EXPECT_NE(message.find("cannot be loaded"), std::string::npos) << message;
  } else if (s == FLASHSPEC_OK) {
    EXPECT_GT(flashspec_cuda_device_count(), 0);
    EXPECT_EQ(flashspec_context_backend(ctx), FLASHSPEC_BACKEND_CUDA);
    flashspec_context_destroy(ctx);
  } else {
    // The module loaded: what is missing is a device.
    EXPECT_EQ(s, FLASHSPEC_ERR_NO_DEVICE);
    EXPECT_EQ(message.find("module"), std::string::npos) << message;
    EXPECT_NE(message.find("no CUDA device is usable"), std::string::npos) << message;
  }
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc != 2 || (std::strcmp(argv[1], "built") != 0 && std::strcmp(argv[1], "missing") != 0)) {
    std::fprintf(stderr, "usage: %s built|missing\n", argv[0]);
    return 2;
  }
  g_mode = argv[1];
  return RUN_ALL_TESTS();
}
